/* forward.c: forward_decode / forward_extend: check the layer and tensors, append K/V, attend. */
#include <math.h>
#include <stdint.h>

#include "glue.h"

/* ---- tensors -------------------------------------------------------------------------------- */

#define FIL_DATA(t) ((char *)(t)->data + (t)->byte_offset)

/* A device tensor of `ndim` dims with the given shape and dtype, on our GPU, 16-byte aligned.
 * Rows (the last dim) are always dense; `dense` = 1 asks the whole tensor to be dense, else the
 * first dims may have any stride that keeps rows 16-byte aligned. strides_out gets the strides
 * in elements. */
static ap_status fil_tensor_check(const DLTensor *t, const char *what, int ndim,
                                  const int64_t *shape, ap_dtype dtype, int32_t ordinal, int dense,
                                  int64_t *strides_out, ap_msgbuf *msg) {
    const int vector_rows = ndim == 3; /* rows read or written 16 bytes at a time */
    if (t == NULL || t->data == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": tensor %s is missing", what);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (t->device.device_type != kDLCUDA || t->device.device_id != ordinal) {
        ap_msgbuf_add(msg, FIL_NAME ": tensor %s is not on CUDA device %d", what, ordinal);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (!ap_dtype_is_dl(t->dtype, dtype)) {
        ap_msgbuf_add(msg,
                      FIL_NAME ": tensor %s has DLPack dtype (code %u, %u bits, %u lanes), "
                               "not the model's",
                      what, t->dtype.code, t->dtype.bits, t->dtype.lanes);
        return AP_ERR_SHAPE_MISMATCH;
    }
    int shape_ok = t->ndim == ndim;
    for (int d = 0; shape_ok && d < ndim; d++) shape_ok = t->shape[d] == shape[d];
    if (!shape_ok) {
        ap_msgbuf_add(msg, FIL_NAME ": tensor %s must have shape [%lld][%lld]%s", what,
                      (long long)shape[0], (long long)shape[1], ndim == 3 ? "[head_dim]" : "");
        return AP_ERR_SHAPE_MISMATCH;
    }
    const int64_t elem = t->dtype.bits / 8;
    int64_t compact = 1;
    int aligned = ((uintptr_t)t->data + t->byte_offset) % (vector_rows ? 16 : elem) == 0;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t stride = t->strides != NULL ? t->strides[d] : compact;
        int must_be_compact = dense || d == ndim - 1;
        if (shape[d] > 1 && must_be_compact && stride != compact) {
            ap_msgbuf_add(msg, FIL_NAME ": tensor %s must be dense%s (stride %lld of dim %d)", what,
                          dense ? "" : " in its last dim", (long long)stride, d);
            return AP_ERR_UNSUPPORTED;
        }
        if (vector_rows && d < ndim - 1 && (stride * elem) % 16 != 0) aligned = 0;
        strides_out[d] = stride;
        compact *= shape[d];
    }
    if (!aligned) {
        ap_msgbuf_add(msg,
                      FIL_NAME ": tensor %s must start (and keep its rows) on %d-byte "
                               "boundaries",
                      what, vector_rows ? 16 : (int)elem);
        return AP_ERR_UNSUPPORTED;
    }
    return AP_OK;
}

/* q, out and lse dense; k and v (read only when save_kv) may be views with strided rows.
 * strides receives the strides of q, out, k and v. */
static ap_status fil_args_check(const ap_backend *b, const ap_forward_args *args,
                                int64_t strides[4][3], ap_msgbuf *msg) {
    if (args == NULL || args->struct_size < sizeof(ap_forward_args)) {
        ap_msgbuf_add(msg, FIL_NAME ": forward needs ap_forward_args with struct_size set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_model *m = &b->model;
    const int64_t n = b->plan.num_tokens;
    const int64_t q_shape[3] = {n, m->num_qo_heads, m->head_dim_qk};
    const int64_t kv_shape[3] = {n, m->num_kv_heads, m->head_dim_qk};
    const int32_t dev = b->device_ordinal;
    int64_t lse_strides[3];
    ap_status st = fil_tensor_check(args->q, "q", 3, q_shape, m->dtype, dev, 1, strides[0], msg);
    if (st == AP_OK)
        st = fil_tensor_check(args->out, "out", 3, q_shape, m->dtype, dev, 1, strides[1], msg);
    if (st == AP_OK && args->lse != NULL)
        st = fil_tensor_check(args->lse, "lse", 2, q_shape, AP_DTYPE_F32, dev, 1, lse_strides, msg);
    if (st == AP_OK && args->save_kv) {
        st = fil_tensor_check(args->k, "k", 3, kv_shape, m->dtype, dev, 0, strides[2], msg);
        if (st == AP_OK)
            st = fil_tensor_check(args->v, "v", 3, kv_shape, m->dtype, dev, 0, strides[3], msg);
    }
    return st;
}

/* ---- the layer ------------------------------------------------------------------------------ */

/* The layer's cache: the model's NHD cache, aligned pages, usable fp8 scales. */
static ap_status fil_cache_check(const ap_backend *b, const ap_layer *layer, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    if (layer == NULL || layer->struct_size < sizeof(ap_layer) || layer->kv == NULL ||
        layer->kv->struct_size < sizeof(ap_kv_cache)) {
        ap_msgbuf_add(msg, FIL_NAME ": forward needs an ap_layer with its KV cache, struct_size "
                                    "set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_kv_cache *kv = layer->kv;
    if (kv->layout != AP_KV_LAYOUT_NHD || kv->dtype != m->kv_dtype ||
        kv->page_size != m->page_size || kv->num_kv_heads != m->num_kv_heads ||
        kv->head_dim_qk != m->head_dim_qk || kv->head_dim_v != m->head_dim_v) {
        ap_msgbuf_add(msg,
                      FIL_NAME ": layer %d's KV cache (dtype %s, page %d, %d heads, dims "
                               "%d/%d) is not the model's NHD cache",
                      layer->layer_id, ap_dtype_str(kv->dtype), kv->page_size, kv->num_kv_heads,
                      kv->head_dim_qk, kv->head_dim_v);
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (kv->k_pages == NULL || kv->v_pages == NULL || (uintptr_t)kv->k_pages % 16 != 0 ||
        (uintptr_t)kv->v_pages % 16 != 0) {
        ap_msgbuf_add(msg, FIL_NAME ": layer %d's K and V pages must be set and 16-byte aligned",
                      layer->layer_id);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (m->kv_dtype == AP_DTYPE_FP8_E4M3 && !(isfinite(layer->k_scale) && layer->k_scale > 0.f &&
                                              isfinite(layer->v_scale) && layer->v_scale > 0.f)) {
        ap_msgbuf_add(msg, FIL_NAME ": layer %d's fp8 scales k %g, v %g must be finite and > 0",
                      layer->layer_id, (double)layer->k_scale, (double)layer->v_scale);
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}

static ap_status fil_layer_check(const ap_backend *b, const ap_layer *layer, ap_msgbuf *msg) {
    ap_status st = fil_cache_check(b, layer, msg);
    if (st != AP_OK) return st;
    const ap_kv_cache *kv = layer->kv;
    if (b->plan.max_page_index >= kv->num_pages) {
        ap_msgbuf_add(msg, FIL_NAME ": the batch names page %d but layer %d's cache has %d pages",
                      b->plan.max_page_index, layer->layer_id, kv->num_pages);
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (layer->logit_softcap != 0.f || layer->window_left >= 0) {
        ap_msgbuf_add(msg, FIL_NAME ": layer %d asks for %s, which this backend does not serve",
                      layer->layer_id,
                      layer->logit_softcap != 0.f ? "a logit softcap" : "a sliding window");
        return AP_ERR_UNSUPPORTED;
    }
    return AP_OK;
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
    int64_t strides[4][3];
    ap_status st = fil_layer_check(b, layer, msg);
    if (st != AP_OK || b->plan.num_tokens == 0) return st; /* an empty batch: nothing to run */
    st = fil_args_check(b, args, strides, msg);
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, FIL_NAME, msg);
    if (st != AP_OK || !args->save_kv) return st;
    const ap_kv_cache *kv = layer->kv;
    fil_append_params ap = {
        .k = FIL_DATA(args->k),
        .v = FIL_DATA(args->v),
        .k_stride_token = strides[2][0],
        .k_stride_head = strides[2][1],
        .v_stride_token = strides[3][0],
        .v_stride_head = strides[3][1],
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
    return fil_append_run(&ap, stream, msg);
}

static fil_attn_params fil_params_of(const ap_backend *b, const ap_layer *layer,
                                     const ap_forward_args *args) {
    const ap_kv_cache *kv = layer->kv;
    return (fil_attn_params){
        .q = FIL_DATA(args->q),
        .out = FIL_DATA(args->out),
        .lse = args->lse != NULL ? (float *)FIL_DATA(args->lse) : NULL,
        .q_dtype = b->model.dtype,
        .num_seqs = b->plan.num_seqs,
        .num_tokens = b->plan.num_tokens,
        .num_qo_heads = b->model.num_qo_heads,
        .sm_scale = layer->sm_scale,
        .causal = b->model.causal,
        .qo_indptr = b->plan.qo_indptr,
        .kv =
            {
                .k_pages = kv->k_pages,
                .v_pages = kv->v_pages,
                .kv_dtype = kv->dtype,
                .page_size = kv->page_size,
                .num_kv_heads = kv->num_kv_heads,
                .head_dim = kv->head_dim_qk,
                .k_scale = layer->k_scale,
                .v_scale = layer->v_scale,
                .kv_page_indptr = b->plan.kv_page_indptr,
                .kv_page_indices = b->plan.kv_page_indices,
                .kv_last_page_len = b->plan.kv_last_page_len,
            },
    };
}

ap_status fil_forward_decode(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    ap_status st = fil_forward_begin(b, layer, args, AP_MODE_DECODE, stream, msg);
    if (st != AP_OK || b->plan.num_tokens == 0) return st;
    fil_attn_params params = fil_params_of(b, layer, args);
    return fil_decode_run(&params, &b->plan.decode, stream, msg);
}

ap_status fil_forward_extend(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    ap_status st = fil_forward_begin(b, layer, args, AP_MODE_EXTEND, stream, msg);
    if (st != AP_OK || b->plan.num_tokens == 0) return st;
    fil_attn_params params = fil_params_of(b, layer, args);
    return fil_extend_run(&params, &b->plan.extend, stream, msg);
}

/* ---- append_kv/1 ---------------------------------------------------------------------------- */

/* A 1-D int32 device array of `count` elements on our GPU; its stride in elements. */
static ap_status fil_index_check(const DLTensor *t, const char *what, int64_t count,
                                 int32_t ordinal, int64_t *stride, ap_msgbuf *msg) {
    if (t == NULL || t->data == NULL || t->ndim != 1 || t->shape[0] != count ||
        t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1 ||
        ((uintptr_t)t->data + t->byte_offset) % 4 != 0) {
        ap_msgbuf_add(msg, FIL_NAME ": %s must be an aligned int32 array of %lld elements", what,
                      (long long)count);
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (t->device.device_type != kDLCUDA || t->device.device_id != ordinal) {
        ap_msgbuf_add(msg, FIL_NAME ": tensor %s is not on CUDA device %d", what, ordinal);
        return AP_ERR_INVALID_ARGUMENT;
    }
    *stride = t->strides != NULL ? t->strides[0] : 1;
    return AP_OK;
}

/* The core checked shapes, dtypes and density; here what the kernel adds: our device, 16-byte
 * aligned rows, the cache's pages. */
static ap_status fil_append_kv_check(const ap_backend *b, const ap_layer *layer,
                                     const ap_append_kv_args *a, fil_append_rope_params *p,
                                     ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    const int32_t dev = b->device_ordinal;
    if (a == NULL || a->struct_size < sizeof(ap_append_kv_args) || a->k == NULL ||
        a->k->ndim != 3 || a->cos_sin == NULL || a->cos_sin->ndim != 2 ||
        (a->q == NULL) != (a->q_out == NULL)) {
        ap_msgbuf_add(msg, FIL_NAME ": append_kv needs ap_append_kv_args with struct_size, k, "
                                    "cos_sin, and q with q_out or neither");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const int64_t n = a->k->shape[0], d = m->head_dim_qk;
    const int64_t q_shape[3] = {n, m->num_qo_heads, d}, kv_shape[3] = {n, m->num_kv_heads, d};
    const int64_t cs_shape[2] = {a->cos_sin->shape[0], a->rotary_dim};
    int64_t strides[3];
    ap_status st = fil_cache_check(b, layer, msg);
    if (st == AP_OK) st = fil_tensor_check(a->k, "k", 3, kv_shape, m->dtype, dev, 1, strides, msg);
    if (st == AP_OK) st = fil_tensor_check(a->v, "v", 3, kv_shape, m->dtype, dev, 1, strides, msg);
    if (st == AP_OK && a->q != NULL)
        st = fil_tensor_check(a->q, "q", 3, q_shape, m->dtype, dev, 1, strides, msg);
    if (st == AP_OK && a->q != NULL)
        st = fil_tensor_check(a->q_out, "q_out", 3, q_shape, m->dtype, dev, 1, strides, msg);
    if (st == AP_OK)
        st = fil_tensor_check(a->cos_sin, "cos_sin", 2, cs_shape, AP_DTYPE_F32, dev, 1, strides,
                              msg);
    if (st == AP_OK)
        st = fil_index_check(a->positions, "positions", n, dev, &p->positions_stride, msg);
    if (st == AP_OK) st = fil_index_check(a->out_loc, "out_loc", n, dev, &p->out_loc_stride, msg);
    return st;
}

ap_status fil_append_kv(ap_backend *b, const ap_layer *layer, const ap_append_kv_args *args,
                        void *stream, ap_msgbuf *msg) {
    if (b == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": append_kv without an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    fil_append_rope_params p = {0};
    ap_status st = fil_append_kv_check(b, layer, args, &p, msg);
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, FIL_NAME, msg);
    if (st != AP_OK) return st;
    const ap_kv_cache *kv = layer->kv;
    int64_t rows = args->cos_sin->shape[0];
    p.q = args->q != NULL ? FIL_DATA(args->q) : NULL;
    p.q_out = args->q != NULL ? FIL_DATA(args->q_out) : NULL;
    p.k = FIL_DATA(args->k);
    p.v = FIL_DATA(args->v);
    p.in_dtype = b->model.dtype;
    p.k_pages = kv->k_pages;
    p.v_pages = kv->v_pages;
    p.kv_dtype = kv->dtype;
    p.positions = (const int32_t *)FIL_DATA(args->positions);
    p.out_loc = (const int32_t *)FIL_DATA(args->out_loc);
    p.cos_sin = (const float *)FIL_DATA(args->cos_sin);
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
