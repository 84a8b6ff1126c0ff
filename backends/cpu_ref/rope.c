/* rope.c: the append_kv/1 hook: RoPE on q and k, then k and v quantized into their cache slots. */
#include <stdlib.h>

#include "cpu_ref.h"

typedef struct cpu_rope {
    cpu_view q, q_out, k, v, positions, out_loc, cos_sin;
    int has_q;
    int64_t num_tokens;
} cpu_rope;

static ap_status cpu_rope_check_index(const cpu_view *view, const char *what, int64_t count,
                                      int64_t limit, ap_msgbuf *msg) {
    if (view->elem != CPU_ELEM_I32) {
        ap_msgbuf_add(msg, "cpu_ref: append_kv %s must be int32, not %s", what,
                      cpu_elem_name(view->elem));
        return AP_ERR_INVALID_ARGUMENT;
    }
    for (int64_t t = 0; t < count; t++) {
        int32_t value = cpu_view_get_i32(view, t);
        if (value < 0 || value >= limit) {
            ap_msgbuf_add(msg, "cpu_ref: append_kv %s[%lld] = %d is outside [0, %lld)", what,
                          (long long)t, value, (long long)limit);
            return AP_ERR_SHAPE_MISMATCH;
        }
    }
    return AP_OK;
}

/* Every shape and index the hook relies on, before it writes anything. MHA: q, q_out, k
 * [T][H][head_dim_qk] and v. MLA: k is the new latent rows [T][1][kv_lora_rank + qk_rope], v
 * NULL, q and q_out are q_rope [T][Hq][qk_rope] (any strides). */
static ap_status cpu_rope_check(const ap_model *m, const ap_kv_cache *kv,
                                const ap_append_kv_args *args, cpu_rope *rope, ap_msgbuf *msg) {
    ap_status s = cpu_view_make(args->k, "k", &rope->k, msg);
    if (s != AP_OK) return s;
    int mla = m->kind == AP_ATTN_MLA;
    int64_t t = rope->k.shape[0];
    int64_t k_shape[3] = {t, m->num_kv_heads, m->head_dim_qk};
    int64_t v_shape[3] = {t, m->num_kv_heads, m->head_dim_v};
    int64_t q_shape[3] = {t, m->num_qo_heads, mla ? m->qk_rope_head_dim : m->head_dim_qk};
    int64_t tokens[1] = {t};
    int64_t table[2] = {-1, args->rotary_dim};
    rope->num_tokens = t;
    rope->has_q = args->q != NULL || args->q_out != NULL;
    s = cpu_view_expect(&rope->k, "k", 3, k_shape, msg);
    if (s == AP_OK && mla && args->v != NULL) {
        ap_msgbuf_add(msg, "cpu_ref: MLA's append_kv takes no v (the latent row in k holds V)");
        s = AP_ERR_INVALID_ARGUMENT;
    }
    if (s == AP_OK && !mla) s = cpu_view_make(args->v, "v", &rope->v, msg);
    if (s == AP_OK && !mla) s = cpu_view_expect(&rope->v, "v", 3, v_shape, msg);
    if (s == AP_OK && rope->has_q) s = cpu_view_make(args->q, "q", &rope->q, msg);
    if (s == AP_OK && rope->has_q) s = cpu_view_expect(&rope->q, "q", 3, q_shape, msg);
    if (s == AP_OK && rope->has_q) s = cpu_view_make(args->q_out, "q_out", &rope->q_out, msg);
    if (s == AP_OK && rope->has_q) s = cpu_view_expect(&rope->q_out, "q_out", 3, q_shape, msg);
    if (s == AP_OK) s = cpu_view_make(args->positions, "positions", &rope->positions, msg);
    if (s == AP_OK) s = cpu_view_expect(&rope->positions, "positions", 1, tokens, msg);
    if (s == AP_OK) s = cpu_view_make(args->out_loc, "out_loc", &rope->out_loc, msg);
    if (s == AP_OK) s = cpu_view_expect(&rope->out_loc, "out_loc", 1, tokens, msg);
    if (s == AP_OK) s = cpu_view_make(args->cos_sin, "cos_sin", &rope->cos_sin, msg);
    if (s == AP_OK) s = cpu_view_expect(&rope->cos_sin, "cos_sin", 2, table, msg);
    if (s != AP_OK) return s;
    int floats_ok = cpu_elem_is_float_activation(rope->k.elem) &&
                    (mla || cpu_elem_is_float_activation(rope->v.elem)) &&
                    rope->cos_sin.elem == CPU_ELEM_F32 &&
                    (!rope->has_q || (cpu_elem_is_float_activation(rope->q.elem) &&
                                      cpu_elem_is_float_activation(rope->q_out.elem)));
    if (!floats_ok) {
        ap_msgbuf_add(msg, "cpu_ref: append_kv q, q_out, k, v must be float32/bfloat16/float16 "
                           "and cos_sin float32");
        return AP_ERR_INVALID_ARGUMENT;
    }
    s = cpu_rope_check_index(&rope->positions, "positions", t, rope->cos_sin.shape[0], msg);
    if (s == AP_OK)
        s = cpu_rope_check_index(&rope->out_loc, "out_loc", t,
                                 (int64_t)kv->num_pages * kv->page_size, msg);
    return s;
}

/* Rotate the first rotary_dim dims of one head row at one position. With f_i the i-th frequency,
 * c = cos_sin[pos][i] = cos(pos * f_i), s = cos_sin[pos][rotary_dim/2 + i] = sin(pos * f_i), and
 * the pair (a, b) = (i, i + rotary_dim/2) in neox style, (2i, 2i + 1) otherwise:
 *   x_a' = x_a * c - x_b * s,   x_b' = x_b * c + x_a * s        (in float32, no fused multiply-add)
 * Dims past rotary_dim pass through. */
static void cpu_rope_rotate(const cpu_rope *rope, float *row, int32_t pos, int32_t rotary_dim,
                            int is_neox) {
    int32_t half = rotary_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        int32_t a = is_neox ? i : 2 * i;
        int32_t b = is_neox ? i + half : 2 * i + 1;
        float c = cpu_view_get(&rope->cos_sin, (int64_t[]){pos, i});
        float s = cpu_view_get(&rope->cos_sin, (int64_t[]){pos, half + i});
        float xa = row[a], xb = row[b];
        row[a] = xa * c - xb * s;
        row[b] = xb * c + xa * s;
    }
}

/* Token t: q's heads rotated into q_out; k's heads rotated and quantized into slot out_loc[t].
 * MHA rotates the first rotary_dim dims of each head; MLA rotates all of q_rope and the k_pe
 * part of the latent row (its last qk_rope dims; c passes through) and writes the whole row
 * with k_scale, and no V. */
static void cpu_rope_token(const cpu_rope *rope, const ap_model *m, const ap_layer *layer,
                           const ap_append_kv_args *args, int64_t t, float *row) {
    const ap_kv_cache *kv = layer->kv;
    int mla = m->kind == AP_ATTN_MLA;
    int32_t q_dim = mla ? m->qk_rope_head_dim : m->head_dim_qk;
    int32_t k_rope_at = mla ? m->kv_lora_rank : 0; /* where the rotated part of a k row starts */
    int32_t pos = cpu_view_get_i32(&rope->positions, t);
    int64_t slot = cpu_view_get_i32(&rope->out_loc, t);
    for (int32_t h = 0; rope->has_q && h < m->num_qo_heads; h++) {
        for (int32_t d = 0; d < q_dim; d++) row[d] = cpu_view_get(&rope->q, (int64_t[]){t, h, d});
        cpu_rope_rotate(rope, row, pos, args->rotary_dim, args->is_neox);
        for (int32_t d = 0; d < q_dim; d++)
            cpu_view_set(&rope->q_out, (int64_t[]){t, h, d}, row[d]);
    }
    /* k: rotated in float, then quantized once into the cache (no rounding to k's dtype between) */
    for (int32_t h = 0; h < m->num_kv_heads; h++) {
        for (int32_t d = 0; d < m->head_dim_qk; d++)
            row[d] = cpu_view_get(&rope->k, (int64_t[]){t, h, d});
        cpu_rope_rotate(rope, row + k_rope_at, pos, args->rotary_dim, args->is_neox);
        cpu_kv_store_row(kv->dtype, cpu_kv_k_row(kv, slot, h), row, m->head_dim_qk, layer->k_scale);
        if (mla) continue;
        for (int32_t d = 0; d < m->head_dim_v; d++)
            row[d] = cpu_view_get(&rope->v, (int64_t[]){t, h, d});
        cpu_kv_store_row(kv->dtype, cpu_kv_v_row(kv, slot, h), row, m->head_dim_v, layer->v_scale);
    }
}

ap_status cpu_hook_append_kv(ap_backend *backend, const ap_layer *layer,
                             const ap_append_kv_args *args, void *stream, ap_msgbuf *msg) {
    (void)stream;
    if (backend == NULL || args == NULL || args->struct_size < sizeof(ap_append_kv_args)) {
        ap_msgbuf_add(msg, "cpu_ref: append_kv needs an instance and arguments with struct_size");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_model *m = &backend->model;
    int32_t rope_width = m->kind == AP_ATTN_MLA ? m->qk_rope_head_dim : m->head_dim_qk;
    if (args->rotary_dim < 2 || args->rotary_dim % 2 != 0 || args->rotary_dim > rope_width ||
        (m->kind == AP_ATTN_MLA && args->rotary_dim != rope_width) ||
        (args->is_neox != 0 && args->is_neox != 1)) {
        ap_msgbuf_add(msg,
                      "cpu_ref: append_kv rotary_dim %d must be even, >= 2 and <= %d (MLA: equal "
                      "to qk_rope_head_dim), and is_neox 0 or 1 (got %d)",
                      args->rotary_dim, rope_width, args->is_neox);
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status status = cpu_kv_check(m, layer, msg);
    cpu_rope rope;
    memset(&rope, 0, sizeof rope);
    if (status == AP_OK) status = cpu_rope_check(m, layer->kv, args, &rope, msg);
    if (status != AP_OK) return status;
    int32_t widest = m->head_dim_qk > m->head_dim_v ? m->head_dim_qk : m->head_dim_v;
    float *row = malloc((size_t)widest * sizeof *row);
    if (row == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: out of host memory");
        return AP_ERR_OUT_OF_MEMORY;
    }
    for (int64_t t = 0; t < rope.num_tokens; t++) cpu_rope_token(&rope, m, layer, args, t, row);
    free(row);
    return AP_OK;
}
