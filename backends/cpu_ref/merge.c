/* merge.c: the merge_state/1 hook: two partial attention states over disjoint keys into one. */
#include <math.h>

#include "cpu_ref.h"

typedef struct cpu_merge {
    cpu_view o_a, lse_a, o_b, lse_b, o, lse;
    int has_lse;
} cpu_merge;

/* Every shape and dtype before anything is written: o_a, o_b, o [T][H][D] of one float type,
 * the LSEs float32 [T][H]. */
static ap_status cpu_merge_check(const ap_merge_state_args *args, cpu_merge *merge,
                                 ap_msgbuf *msg) {
    ap_status s = cpu_view_make(args->o_a, "o_a", &merge->o_a, msg);
    if (s == AP_OK) s = cpu_view_expect(&merge->o_a, "o_a", 3, (int64_t[]){-1, -1, -1}, msg);
    if (s != AP_OK) return s;
    const int64_t *shape = merge->o_a.shape;
    int64_t rows[2] = {shape[0], shape[1]};
    merge->has_lse = args->lse != NULL;
    s = cpu_view_make(args->o_b, "o_b", &merge->o_b, msg);
    if (s == AP_OK) s = cpu_view_expect(&merge->o_b, "o_b", 3, shape, msg);
    if (s == AP_OK) s = cpu_view_make(args->o, "o", &merge->o, msg);
    if (s == AP_OK) s = cpu_view_expect(&merge->o, "o", 3, shape, msg);
    if (s == AP_OK) s = cpu_view_make(args->lse_a, "lse_a", &merge->lse_a, msg);
    if (s == AP_OK) s = cpu_view_expect(&merge->lse_a, "lse_a", 2, rows, msg);
    if (s == AP_OK) s = cpu_view_make(args->lse_b, "lse_b", &merge->lse_b, msg);
    if (s == AP_OK) s = cpu_view_expect(&merge->lse_b, "lse_b", 2, rows, msg);
    if (s == AP_OK && merge->has_lse) s = cpu_view_make(args->lse, "lse", &merge->lse, msg);
    if (s == AP_OK && merge->has_lse) s = cpu_view_expect(&merge->lse, "lse", 2, rows, msg);
    if (s != AP_OK) return s;
    cpu_elem type = merge->o_a.elem;
    if (!cpu_elem_is_float_activation(type) || merge->o_b.elem != type || merge->o.elem != type ||
        merge->lse_a.elem != CPU_ELEM_F32 || merge->lse_b.elem != CPU_ELEM_F32 ||
        (merge->has_lse && merge->lse.elem != CPU_ELEM_F32)) {
        ap_msgbuf_add(msg, "cpu_ref: merge_state takes o_a, o_b, o of one type (float32, bfloat16 "
                           "or float16) and float32 LSEs");
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}

/* Row (t, h), in double:
 *   m = max(lse_a, lse_b),  w_a = exp(lse_a - m),  w_b = exp(lse_b - m)
 *   o_d = (w_a * o_a_d + w_b * o_b_d) / (w_a + w_b),  lse = m + log(w_a + w_b)
 * A side with lse = -inf has no keys: the row takes the other side's o and lse as they are (its
 * own o is not read, so whatever it holds cannot turn into NaN); both -inf give o = 0 and
 * lse = -inf. Each element is read before its own position is written: o may alias o_a or o_b
 * and lse may alias lse_a or lse_b. */
static void cpu_merge_row(const cpu_merge *merge, int64_t t, int64_t h) {
    double lse_a = cpu_view_get(&merge->lse_a, (int64_t[]){t, h});
    double lse_b = cpu_view_get(&merge->lse_b, (int64_t[]){t, h});
    int empty_a = lse_a == -INFINITY, empty_b = lse_b == -INFINITY;
    double m = lse_a > lse_b ? lse_a : lse_b;
    double w_a = empty_a ? 0.0 : exp(lse_a - m), w_b = empty_b ? 0.0 : exp(lse_b - m);
    for (int64_t d = 0; d < merge->o_a.shape[2]; d++) {
        int64_t at[3] = {t, h, d};
        double value = 0.0;
        if (empty_a && !empty_b)
            value = cpu_view_get(&merge->o_b, at);
        else if (empty_b && !empty_a)
            value = cpu_view_get(&merge->o_a, at);
        else if (!empty_a)
            value = (w_a * cpu_view_get(&merge->o_a, at) + w_b * cpu_view_get(&merge->o_b, at)) /
                    (w_a + w_b);
        cpu_view_set(&merge->o, at, (float)value);
    }
    if (!merge->has_lse) return;
    double lse = empty_a && empty_b ? -INFINITY
                 : empty_a          ? lse_b
                 : empty_b          ? lse_a
                                    : m + log(w_a + w_b);
    cpu_view_set(&merge->lse, (int64_t[]){t, h}, (float)lse);
}

ap_status cpu_hook_merge_state(ap_backend *backend, const ap_merge_state_args *args, void *stream,
                               ap_msgbuf *msg) {
    (void)backend; /* needs no model: every size comes from the tensors */
    (void)stream;
    if (args == NULL || args->struct_size < sizeof(ap_merge_state_args)) {
        ap_msgbuf_add(msg, "cpu_ref: merge_state needs arguments with struct_size set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    cpu_merge merge;
    memset(&merge, 0, sizeof merge);
    ap_status status = cpu_merge_check(args, &merge, msg);
    if (status != AP_OK) return status;
    for (int64_t t = 0; t < merge.o_a.shape[0]; t++)
        for (int64_t h = 0; h < merge.o_a.shape[1]; h++) cpu_merge_row(&merge, t, h);
    return AP_OK;
}
