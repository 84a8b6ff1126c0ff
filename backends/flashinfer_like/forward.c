/* forward.c: forward_decode / forward_extend: check the layer and tensors, append K/V, attend. */
#include <stdint.h>

#include "glue.h"

/* ---- what the core leaves to us ------------------------------------------------------------- */

/* The core checked every tensor's shape, dtype, device and density, the layer's cache against the
 * model and the planned batch (plugin_api.h's promise). Left to a backend: alignment and its own
 * limits. */

/* The kernels move rows 16 bytes at a time: a dense tensor's rows (head dims 64, 128, 256) stay
 * 16-byte aligned when its base is; lse and index arrays need their element's alignment. */
static ap_status fil_args_aligned(const ap_forward_args *args, ap_msgbuf *msg) {
    ap_status st = ap_kit_aligned(args->q, "q", 16, FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(args->out, "out", 16, FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(args->lse, "lse", sizeof(float), FIL_NAME, msg);
    if (st == AP_OK && args->save_kv) st = ap_kit_aligned(args->k, "k", 16, FIL_NAME, msg);
    if (st == AP_OK && args->save_kv) st = ap_kit_aligned(args->v, "v", 16, FIL_NAME, msg);
    return st;
}

/* The layer's pages (and nvfp4's block scales) are read 16 bytes at a time. */
static ap_status fil_cache_aligned(const ap_layer *layer, ap_msgbuf *msg) {
    const ap_kv_cache *kv = layer->kv;
    int nvfp4 = kv->dtype == AP_DTYPE_NVFP4;
    if ((uintptr_t)kv->k_pages % 16 == 0 && (uintptr_t)kv->v_pages % 16 == 0 &&
        (!nvfp4 ||
         ((uintptr_t)kv->k_block_scales % 16 == 0 && (uintptr_t)kv->v_block_scales % 16 == 0)))
        return AP_OK;
    ap_msgbuf_add(msg, FIL_NAME ": layer %d's K and V pages%s must be 16-byte aligned",
                  layer->layer_id, nvfp4 ? " and block scales" : "");
    return AP_ERR_UNSUPPORTED;
}

/* Features the caps do not declare: refused here, since the core does not check layers for them. */
static ap_status fil_layer_served(const ap_layer *layer, ap_msgbuf *msg) {
    if (layer->logit_softcap == 0.f && layer->window_left < 0) return AP_OK;
    ap_msgbuf_add(msg, FIL_NAME ": layer %d asks for %s, which this backend does not serve",
                  layer->layer_id,
                  layer->logit_softcap != 0.f ? "a logit softcap" : "a sliding window");
    return AP_ERR_UNSUPPORTED;
}

/* Checks shared by both forwards, then the append of the new K/V when asked. */
static ap_status fil_forward_begin(ap_backend *b, const ap_layer *layer,
                                   const ap_forward_args *args, ap_forward_mode mode, void *stream,
                                   ap_msgbuf *msg) {
    const char *entry = mode == AP_MODE_DECODE ? "decode" : "extend";
    if (b == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": forward_%s without an instance", entry);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (!b->plan.ready || b->plan.mode != mode) {
        ap_msgbuf_add(msg, FIL_NAME ": forward_%s without init_metadata of a %s batch", entry,
                      entry);
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st = fil_layer_served(layer, msg);
    if (st == AP_OK) st = fil_cache_aligned(layer, msg);
    if (st != AP_OK || b->plan.num_tokens == 0) return st; /* an empty batch: nothing to run */
    st = fil_args_aligned(args, msg);
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, FIL_NAME, msg);
    if (st != AP_OK || !args->save_kv) return st;
    const ap_kv_cache *kv = layer->kv;
    if (kv->dtype == AP_DTYPE_NVFP4) {
        ap_msgbuf_add(msg,
                      FIL_NAME ": forward_%s: save_kv into an nvfp4 cache is not implemented "
                               "(write the cache first, then forward with save_kv 0)",
                      entry);
        return AP_ERR_UNSUPPORTED;
    }
    ap_kit_append_args ap = {
        .k = ap_kit_data(args->k),
        .v = ap_kit_data(args->v),
        .k_stride_token = (int64_t)kv->num_kv_heads * kv->head_dim_qk, /* dense (the core) */
        .k_stride_head = kv->head_dim_qk,
        .v_stride_token = (int64_t)kv->num_kv_heads * kv->head_dim_v,
        .v_stride_head = kv->head_dim_v,
        .in_dtype = b->model.dtype,
        .k_pages = kv->k_pages,
        .v_pages = kv->v_pages,
        .kv_dtype = kv->dtype,
        .num_kv_heads = kv->num_kv_heads,
        .head_dim = kv->head_dim_qk,
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
        .slots = b->plan.slots,
        .num_tokens = b->plan.num_tokens,
    };
    return ap_kit_paged_append_run(&ap, stream, FIL_NAME, msg);
}

ap_status fil_forward_decode(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    ap_status st = fil_forward_begin(b, layer, args, AP_MODE_DECODE, stream, msg);
    if (st != AP_OK || b->plan.num_tokens == 0) return st;
    return fil_decode_run(&b->model, layer, args, &b->plan, stream, msg);
}

ap_status fil_forward_extend(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    ap_status st = fil_forward_begin(b, layer, args, AP_MODE_EXTEND, stream, msg);
    if (st != AP_OK || b->plan.num_tokens == 0) return st;
    return fil_extend_run(&b->model, layer, args, &b->plan, stream, msg);
}

/* ---- append_kv/1 ---------------------------------------------------------------------------- */

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
    fil_append_rope_params p = {0};
    ap_status st = fil_append_kv_aligned(layer, args, msg);
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, FIL_NAME, msg);
    if (st != AP_OK) return st;
    const ap_kv_cache *kv = layer->kv;
    int64_t rows = args->cos_sin->shape[0];
    p.q = args->q != NULL ? ap_kit_data(args->q) : NULL;
    p.q_out = args->q != NULL ? ap_kit_data(args->q_out) : NULL;
    p.k = ap_kit_data(args->k);
    p.v = ap_kit_data(args->v);
    p.in_dtype = b->model.dtype;
    p.k_pages = kv->k_pages;
    p.v_pages = kv->v_pages;
    p.kv_dtype = kv->dtype;
    p.positions = (const int32_t *)ap_kit_data(args->positions);
    p.out_loc = (const int32_t *)ap_kit_data(args->out_loc);
    p.positions_stride = args->positions->strides != NULL ? args->positions->strides[0] : 1;
    p.out_loc_stride = args->out_loc->strides != NULL ? args->out_loc->strides[0] : 1;
    p.cos_sin = (const float *)ap_kit_data(args->cos_sin);
    p.max_position = rows > INT32_MAX ? INT32_MAX : (int32_t)rows; /* positions are int32 */
    p.rotary_dim = args->rotary_dim;
    p.is_neox = args->is_neox;
    p.num_qo_heads = b->model.num_qo_heads;
    p.num_kv_heads = kv->num_kv_heads;
    p.head_dim = kv->head_dim_qk;
    p.num_slots = kv->num_pages > 0 ? (int64_t)kv->num_pages * kv->page_size : 0;
    p.num_tokens = args->k->shape[0];
    p.k_scale = layer->k_scale;
    p.v_scale = layer->v_scale;
    return fil_append_rope_run(&p, stream, msg);
}
