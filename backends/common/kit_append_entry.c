/* kit_append_entry.c: the ABI's two cache writes (append_kv/1, save_kv) mapped onto the kit's one
 * append kernel, so every MHA backend fills its arguments the same way. */
#include <stdint.h>

#include "kit.h"

/* The layer's pages (and nvfp4's block scales) are read and written 16 bytes at a time. */
ap_status ap_kit_cache_aligned(const ap_layer *layer, const char *who, ap_msgbuf *msg) {
    const ap_kv_cache *kv = layer->kv;
    const int nvfp4 = kv->dtype == AP_DTYPE_NVFP4;
    if ((uintptr_t)kv->k_pages % 16 == 0 && (uintptr_t)kv->v_pages % 16 == 0 &&
        (!nvfp4 ||
         ((uintptr_t)kv->k_block_scales % 16 == 0 && (uintptr_t)kv->v_block_scales % 16 == 0)))
        return AP_OK;
    ap_msgbuf_add(msg, "%s: layer %d's K and V pages%s must be 16-byte aligned", who,
                  layer->layer_id, nvfp4 ? " and block scales" : "");
    return AP_ERR_UNSUPPORTED;
}

/* The core checked shapes, dtypes, density and devices (positions and out_loc may be strided);
 * here what the kernel adds: 16-byte aligned rows and pages. */
static ap_status ap_kit_append_kv_aligned(const ap_layer *layer, const ap_append_kv_args *a,
                                          const char *who, ap_msgbuf *msg) {
    ap_status st = ap_kit_cache_aligned(layer, who, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->k, "k", 16, who, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->v, "v", 16, who, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->q, "q", 16, who, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->q_out, "q_out", 16, who, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->cos_sin, "cos_sin", sizeof(float), who, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->positions, "positions", sizeof(int32_t), who, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->out_loc, "out_loc", sizeof(int32_t), who, msg);
    return st;
}

ap_status ap_kit_append_kv(const ap_model *model, int32_t device_ordinal, const ap_layer *layer,
                           const ap_append_kv_args *args, void *stream, const char *who,
                           ap_msgbuf *msg) {
    if (model == NULL || layer == NULL || layer->kv == NULL || args == NULL) {
        ap_msgbuf_add(msg, "%s: append_kv needs an instance, a layer with its cache and args", who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st = ap_kit_append_kv_aligned(layer, args, who, msg);
    if (st == AP_OK) st = ap_kit_set_device(device_ordinal, who, msg);
    if (st != AP_OK) return st;
    const ap_kv_cache *kv = layer->kv;
    const int64_t rows = args->cos_sin->shape[0];
    const int64_t dim = kv->head_dim_qk, heads = kv->num_kv_heads; /* dense (the core) */
    const ap_kit_append_rope_args p = {
        .q = args->q != NULL ? ap_kit_data(args->q) : NULL,
        .q_out = args->q != NULL ? ap_kit_data(args->q_out) : NULL,
        .k = ap_kit_data(args->k),
        .v = ap_kit_data(args->v),
        .q_stride_token = (int64_t)model->num_qo_heads * dim,
        .q_stride_head = dim,
        .k_stride_token = heads * dim,
        .k_stride_head = dim,
        .v_stride_token = heads * dim,
        .v_stride_head = dim,
        .in_dtype = model->dtype,
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
        .num_qo_heads = model->num_qo_heads,
        .num_kv_heads = kv->num_kv_heads,
        .head_dim = kv->head_dim_qk,
        .num_tokens = args->k->shape[0],
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
    };
    return ap_kit_append_rope_run(&p, stream, who, msg);
}

ap_status ap_kit_save_kv(const ap_model *model, const ap_layer *layer, const ap_forward_args *args,
                         const int32_t *slots, int32_t num_tokens, void *stream, const char *who,
                         ap_msgbuf *msg) {
    if (args->k == NULL || args->v == NULL) {
        ap_msgbuf_add(msg, "%s: save_kv needs k and v", who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_kv_cache *kv = layer->kv;
    const ap_kit_append_args append = {
        .k = ap_kit_data(args->k),
        .v = ap_kit_data(args->v),
        .k_stride_token = (int64_t)kv->num_kv_heads * kv->head_dim_qk, /* dense (the core) */
        .k_stride_head = kv->head_dim_qk,
        .v_stride_token = (int64_t)kv->num_kv_heads * kv->head_dim_v,
        .v_stride_head = kv->head_dim_v,
        .in_dtype = model->dtype,
        .k_pages = kv->k_pages,
        .v_pages = kv->v_pages,
        .kv_dtype = kv->dtype,
        .num_kv_heads = kv->num_kv_heads,
        .head_dim = kv->head_dim_qk,
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
        .slots = slots,
        .num_tokens = num_tokens,
        .k_block_scales = kv->k_block_scales,
        .v_block_scales = kv->v_block_scales,
    };
    return ap_kit_paged_append_run(&append, stream, who, msg);
}
