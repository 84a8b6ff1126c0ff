/* pack.c: the pack_prefix_chunk_kv/1 hook: K = concat(k_nope, k_pe) and V, quantized to fp8. */
#include <math.h>

#include "cpu_ref.h"

typedef struct cpu_pack {
    cpu_view k_nope, k_pe, v, k_out, v_out;
    int64_t tokens, heads, nope_dim, rope_dim, v_dim;
    int pe_has_head_dim; /* k_pe is [t][1][r] rather than [t][r] */
} cpu_pack;

static ap_status cpu_pack_views(const ap_pack_kv_args *args, cpu_pack *pack, ap_msgbuf *msg) {
    ap_status s = cpu_view_make(args->k_nope, "k_nope", &pack->k_nope, msg);
    if (s == AP_OK) s = cpu_view_make(args->k_pe, "k_pe", &pack->k_pe, msg);
    if (s == AP_OK) s = cpu_view_make(args->v, "v", &pack->v, msg);
    if (s == AP_OK) s = cpu_view_make(args->k_out, "k_out", &pack->k_out, msg);
    if (s == AP_OK) s = cpu_view_make(args->v_out, "v_out", &pack->v_out, msg);
    if (s != AP_OK) return s;
    if (pack->k_nope.ndim != 3) {
        int64_t any[3] = {-1, -1, -1};
        return cpu_view_expect(&pack->k_nope, "k_nope", 3, any, msg);
    }
    pack->tokens = pack->k_nope.shape[0];
    pack->heads = pack->k_nope.shape[1];
    pack->nope_dim = pack->k_nope.shape[2];
    pack->pe_has_head_dim = pack->k_pe.ndim == 3;
    pack->rope_dim = pack->k_pe.shape[pack->k_pe.ndim - 1];
    pack->v_dim = pack->v.ndim == 3 ? pack->v.shape[2] : -1;
    int64_t pe2[2] = {pack->tokens, -1};
    int64_t pe3[3] = {pack->tokens, 1, -1};
    int64_t v_shape[3] = {pack->tokens, pack->heads, -1};
    int64_t k_out_shape[3] = {pack->tokens, pack->heads, pack->nope_dim + pack->rope_dim};
    int64_t v_out_shape[3] = {pack->tokens, pack->heads, pack->v_dim};
    s = pack->pe_has_head_dim ? cpu_view_expect(&pack->k_pe, "k_pe", 3, pe3, msg)
                              : cpu_view_expect(&pack->k_pe, "k_pe", 2, pe2, msg);
    if (s == AP_OK) s = cpu_view_expect(&pack->v, "v", 3, v_shape, msg);
    if (s == AP_OK) s = cpu_view_expect(&pack->k_out, "k_out", 3, k_out_shape, msg);
    if (s == AP_OK) s = cpu_view_expect(&pack->v_out, "v_out", 3, v_out_shape, msg);
    return s;
}

static ap_status cpu_pack_check(const ap_pack_kv_args *args, cpu_pack *pack, ap_msgbuf *msg) {
    ap_status s = cpu_pack_views(args, pack, msg);
    if (s != AP_OK) return s;
    if (!cpu_elem_is_float_activation(pack->k_nope.elem) ||
        !cpu_elem_is_float_activation(pack->k_pe.elem) ||
        !cpu_elem_is_float_activation(pack->v.elem) || !cpu_elem_is_fp8(pack->k_out.elem) ||
        !cpu_elem_is_fp8(pack->v_out.elem)) {
        ap_msgbuf_add(msg, "cpu_ref: pack_prefix_chunk_kv takes float32/bfloat16/float16 inputs "
                           "and fp8 outputs");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (!(args->k_scale > 0.0f) || !(args->v_scale > 0.0f) || isinf(args->k_scale) ||
        isinf(args->v_scale)) {
        ap_msgbuf_add(msg,
                      "cpu_ref: pack_prefix_chunk_kv scales must be finite and > 0 (k %g, "
                      "v %g)",
                      (double)args->k_scale, (double)args->v_scale);
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}

/* For token t, head h:
 *   K[t][h][d] = k_nope[t][h][d]                 for d <  nope_dim
 *              = k_pe[t][d - nope_dim]           for d >= nope_dim (the same for every head)
 *   k_out[t][h][d] = saturate_fp8(K[t][h][d] / k_scale),  v_out = saturate_fp8(v / v_scale)
 * The division is in float32; saturation and rounding as in host_numeric.h. */
static void cpu_pack_run(const ap_pack_kv_args *args, const cpu_pack *p) {
    for (int64_t t = 0; t < p->tokens; t++) {
        for (int64_t h = 0; h < p->heads; h++) {
            for (int64_t d = 0; d < p->nope_dim; d++) {
                float x = cpu_view_get(&p->k_nope, (int64_t[]){t, h, d});
                cpu_view_set(&p->k_out, (int64_t[]){t, h, d}, x / args->k_scale);
            }
            for (int64_t r = 0; r < p->rope_dim; r++) {
                float x = p->pe_has_head_dim ? cpu_view_get(&p->k_pe, (int64_t[]){t, 0, r})
                                             : cpu_view_get(&p->k_pe, (int64_t[]){t, r});
                cpu_view_set(&p->k_out, (int64_t[]){t, h, p->nope_dim + r}, x / args->k_scale);
            }
            for (int64_t d = 0; d < p->v_dim; d++) {
                float x = cpu_view_get(&p->v, (int64_t[]){t, h, d});
                cpu_view_set(&p->v_out, (int64_t[]){t, h, d}, x / args->v_scale);
            }
        }
    }
}

ap_status cpu_hook_pack_prefix_chunk_kv(ap_backend *backend, const ap_pack_kv_args *args,
                                        void *stream, ap_msgbuf *msg) {
    (void)backend; /* needs no model: every size comes from the tensors */
    (void)stream;
    if (args == NULL || args->struct_size < sizeof(ap_pack_kv_args)) {
        ap_msgbuf_add(msg, "cpu_ref: pack_prefix_chunk_kv needs arguments with struct_size set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    cpu_pack pack;
    memset(&pack, 0, sizeof pack);
    ap_status status = cpu_pack_check(args, &pack, msg);
    if (status == AP_OK) cpu_pack_run(args, &pack);
    return status;
}
