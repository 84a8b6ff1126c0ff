/* append.c: the append_kv/1 hook: the kit's fused RoPE + quantize + paged append, one launch. */
#include <stdint.h>

#include "glue.h"

/* The core checked shapes, dtypes, density and devices (positions and out_loc may be strided);
 * here what the kernel adds: 16-byte aligned rows and pages. */
static ap_status fil_append_kv_aligned(const ap_layer *layer, const ap_append_kv_args *a,
                                       ap_msgbuf *msg) {
    ap_status st = fil_cache_aligned(layer, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->k, "k", 16, FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->v, "v", 16, FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->q, "q", 16, FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->q_out, "q_out", 16, FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->cos_sin, "cos_sin", sizeof(float), FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->positions, "positions", sizeof(int32_t), FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->out_loc, "out_loc", sizeof(int32_t), FIL_NAME, msg);
    return st;
}

ap_status fil_append_kv(ap_backend *b, const ap_layer *layer, const ap_append_kv_args *args,
                        void *stream, ap_msgbuf *msg) {
    if (b == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": append_kv without an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st = fil_append_kv_aligned(layer, args, msg);
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, FIL_NAME, msg);
    if (st != AP_OK) return st;
    const ap_kv_cache *kv = layer->kv;
    const int64_t rows = args->cos_sin->shape[0];
    const int64_t dim = kv->head_dim_qk, heads = kv->num_kv_heads; /* dense (the core) */
    const int64_t q_heads = b->model.num_qo_heads;
    ap_kit_append_rope_args p = {
        .q = args->q != NULL ? ap_kit_data(args->q) : NULL,
        .q_out = args->q != NULL ? ap_kit_data(args->q_out) : NULL,
        .k = ap_kit_data(args->k),
        .v = ap_kit_data(args->v),
        .q_stride_token = q_heads * dim,
        .q_stride_head = dim,
        .k_stride_token = heads * dim,
        .k_stride_head = dim,
        .v_stride_token = heads * dim,
        .v_stride_head = dim,
        .in_dtype = b->model.dtype,
        .k_pages = kv->k_pages,
        .v_pages = kv->v_pages,
        .k_block_scales = kv->k_block_scales,
        .v_block_scales = kv->v_block_scales,
        .kv_dtype = kv->dtype,
        .out_loc = (const int32_t *)ap_kit_data(args->out_loc),
        .out_loc_stride = args->out_loc->strides != NULL ? args->out_loc->strides[0] : 1,
        .num_slots = kv->num_pages > 0 ? (int64_t)kv->num_pages * kv->page_size : 0,
        .positions = (const int32_t *)ap_kit_data(args->positions),
        .positions_stride = args->positions->strides != NULL ? args->positions->strides[0] : 1,
        .cos_sin = (const float *)ap_kit_data(args->cos_sin),
        .max_position = rows > INT32_MAX ? INT32_MAX : (int32_t)rows, /* positions are int32 */
        .rotary_dim = args->rotary_dim,
        .is_neox = args->is_neox,
        .num_qo_heads = b->model.num_qo_heads,
        .num_kv_heads = kv->num_kv_heads,
        .head_dim = kv->head_dim_qk,
        .num_tokens = args->k->shape[0],
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
    };
    return ap_kit_append_rope_run(&p, stream, FIL_NAME, msg);
}
