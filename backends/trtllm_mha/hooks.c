/* hooks.c: append_kv/1 (the shared fused RoPE + quantize + append kernel) and cuda_graph/1. */
#include <stdint.h>

#include "append_glue.h"
#include "glue.h"

/* The core checked shapes, dtypes, density and devices (positions and out_loc may be strided);
 * here what the kernel adds: 16-byte aligned rows and pages. */
static ap_status mha_append_aligned(const ap_layer *layer, const ap_append_kv_args *a,
                                    ap_msgbuf *msg) {
    const ap_kv_cache *kv = layer->kv;
    if ((uintptr_t)kv->k_pages % 16 != 0 || (uintptr_t)kv->v_pages % 16 != 0) {
        ap_msgbuf_add(msg, MHA_NAME ": layer %d's K and V pages must be 16-byte aligned",
                      layer->layer_id);
        return AP_ERR_UNSUPPORTED;
    }
    ap_status st = ap_kit_aligned(a->k, "k", 16, MHA_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->v, "v", 16, MHA_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->q, "q", 16, MHA_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->q_out, "q_out", 16, MHA_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->cos_sin, "cos_sin", sizeof(float), MHA_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->positions, "positions", sizeof(int32_t), MHA_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->out_loc, "out_loc", sizeof(int32_t), MHA_NAME, msg);
    return st;
}

ap_status mha_hook_append_kv(ap_backend *b, const ap_layer *layer, const ap_append_kv_args *args,
                             void *stream, ap_msgbuf *msg) {
    if (b == NULL || layer == NULL || layer->kv == NULL || args == NULL) {
        ap_msgbuf_add(msg, MHA_NAME ": append_kv needs an instance, a layer and its args");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_kv_cache *kv = layer->kv;
    if (kv->dtype == AP_DTYPE_NVFP4) {
        ap_msgbuf_add(msg, MHA_NAME ": append_kv: an nvfp4 cache waits for the kit's append "
                                    "kernel to quantize nvfp4");
        return AP_ERR_UNSUPPORTED;
    }
    ap_status st = mha_append_aligned(layer, args, msg);
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, MHA_NAME, msg);
    if (st != AP_OK) return st;
    const int64_t rows = args->cos_sin->shape[0];
    const mha_append_params p = {
        .q = args->q != NULL ? ap_kit_data(args->q) : NULL,
        .q_out = args->q != NULL ? ap_kit_data(args->q_out) : NULL,
        .k = ap_kit_data(args->k),
        .v = ap_kit_data(args->v),
        .in_dtype = b->model.dtype,
        .k_pages = kv->k_pages,
        .v_pages = kv->v_pages,
        .kv_dtype = kv->dtype,
        .positions = (const int32_t *)ap_kit_data(args->positions),
        .out_loc = (const int32_t *)ap_kit_data(args->out_loc),
        .positions_stride = args->positions->strides != NULL ? args->positions->strides[0] : 1,
        .out_loc_stride = args->out_loc->strides != NULL ? args->out_loc->strides[0] : 1,
        .cos_sin = (const float *)ap_kit_data(args->cos_sin),
        .max_position = rows > INT32_MAX ? INT32_MAX : (int32_t)rows, /* positions are int32 */
        .rotary_dim = args->rotary_dim,
        .is_neox = args->is_neox,
        .num_qo_heads = b->model.num_qo_heads,
        .num_kv_heads = kv->num_kv_heads,
        .head_dim = kv->head_dim_qk,
        .num_slots = kv->num_pages > 0 ? (int64_t)kv->num_pages * kv->page_size : 0,
        .num_tokens = args->k->shape[0],
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
    };
    return mha_append_run(&p, stream, msg);
}

/* Everything a captured decode touches was allocated at create for the model's max_batch and
 * max_tokens (partial states, slots), and init_metadata of a decode batch launches only the
 * slots kernel: nothing is left to prepare but the range check. */
ap_status mha_hook_cuda_graph(ap_backend *b, int32_t max_batch, void *stream, ap_msgbuf *msg) {
    (void)stream;
    if (b == NULL || max_batch <= 0 || max_batch > b->model.max_batch) {
        ap_msgbuf_add(msg, MHA_NAME ": cuda_graph needs an instance and max_batch in 1..%d",
                      b != NULL ? b->model.max_batch : 0);
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}
