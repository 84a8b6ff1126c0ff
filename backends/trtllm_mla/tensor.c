/* tensor.c: the DLTensor and layer checks that the forwards and the hooks share. */
#include <math.h>

#include "glue.h"

int mla_dl_dtype(DLDataType t, ap_dtype *out) {
    if (t.lanes != 1) return 0;
    if (t.code == kDLBfloat && t.bits == 16)
        *out = AP_DTYPE_BF16;
    else if (t.code == kDLFloat && t.bits == 16)
        *out = AP_DTYPE_F16;
    else if (t.code == kDLFloat && t.bits == 32)
        *out = AP_DTYPE_F32;
    else if (t.bits == 8 && t.code == AP_DL_FLOAT8_E4M3FN)
        *out = AP_DTYPE_FP8_E4M3;
    else
        return 0;
    return 1;
}

ap_status mla_tensor_check(const DLTensor *t, const char *what, int ndim, const int64_t *shape,
                           ap_dtype dtype, int32_t ordinal, int vec, int64_t *strides_out,
                           ap_msgbuf *msg) {
    if (t == NULL || t->data == NULL) {
        ap_msgbuf_add(msg, MLA_NAME ": tensor %s is missing", what);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (t->device.device_type != kDLCUDA || t->device.device_id != ordinal) {
        ap_msgbuf_add(msg, MLA_NAME ": tensor %s is not on CUDA device %d", what, ordinal);
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_dtype got;
    if (!mla_dl_dtype(t->dtype, &got) || got != dtype) {
        ap_msgbuf_add(msg, MLA_NAME ": tensor %s has DLPack dtype (code %u, %u bits), not %s", what,
                      t->dtype.code, t->dtype.bits, ap_dtype_str(dtype));
        return AP_ERR_SHAPE_MISMATCH;
    }
    int shape_ok = t->ndim == ndim && t->shape != NULL;
    for (int d = 0; shape_ok && d < ndim; d++) shape_ok = shape[d] < 0 || t->shape[d] == shape[d];
    if (!shape_ok) {
        ap_msgbuf_add(msg, MLA_NAME ": tensor %s has the wrong rank or shape", what);
        return AP_ERR_SHAPE_MISMATCH;
    }
    const int64_t elem = t->dtype.bits / 8;
    int64_t compact = 1;
    uintptr_t base = (uintptr_t)t->data + t->byte_offset;
    int aligned = base % (uint64_t)(vec ? 16 : elem) == 0;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t stride = t->strides != NULL ? t->strides[d] : compact;
        if (d == ndim - 1 && t->shape[d] > 1 && stride != 1) {
            ap_msgbuf_add(msg, MLA_NAME ": tensor %s must be dense in its last dim", what);
            return AP_ERR_UNSUPPORTED;
        }
        if (stride < 0) {
            ap_msgbuf_add(msg, MLA_NAME ": tensor %s has a negative stride", what);
            return AP_ERR_UNSUPPORTED;
        }
        if (vec && d < ndim - 1 && t->shape[d] > 1 && (stride * elem) % 16 != 0) aligned = 0;
        strides_out[d] = stride;
        compact *= t->shape[d];
    }
    if (!aligned) {
        ap_msgbuf_add(msg,
                      MLA_NAME ": tensor %s must start (and keep its rows) on %d-byte "
                               "boundaries",
                      what, vec ? 16 : (int)elem);
        return AP_ERR_UNSUPPORTED;
    }
    return AP_OK;
}

/* The layer's cache: the model's NHD latent cache, aligned, with a usable fp8 scale. */
ap_status mla_layer_check(const ap_backend *b, const ap_layer *layer, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    if (layer == NULL || layer->struct_size < sizeof(ap_layer) || layer->kv == NULL ||
        layer->kv->struct_size < sizeof(ap_kv_cache)) {
        ap_msgbuf_add(msg, MLA_NAME ": needs an ap_layer with its KV cache, struct_size set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_kv_cache *kv = layer->kv;
    if (kv->layout != AP_KV_LAYOUT_NHD || kv->dtype != m->kv_dtype ||
        kv->page_size != m->page_size || kv->num_kv_heads != 1 || kv->head_dim_qk != MLA_ROW) {
        ap_msgbuf_add(msg,
                      MLA_NAME ": layer %d's cache (dtype %s, page %d, %d heads, dim %d) is not "
                               "the model's latent cache",
                      layer->layer_id, ap_dtype_str(kv->dtype), kv->page_size, kv->num_kv_heads,
                      kv->head_dim_qk);
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (kv->k_pages == NULL || (uintptr_t)kv->k_pages % 16 != 0 || kv->num_pages < 0) {
        ap_msgbuf_add(msg, MLA_NAME ": layer %d's latent pages must be set and 16-byte aligned",
                      layer->layer_id);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (m->kv_dtype == AP_DTYPE_FP8_E4M3 && !(isfinite(layer->k_scale) && layer->k_scale > 0.f)) {
        ap_msgbuf_add(msg, MLA_NAME ": layer %d's fp8 scale %g must be finite and > 0",
                      layer->layer_id, (double)layer->k_scale);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (layer->logit_softcap != 0.f || layer->window_left >= 0) {
        ap_msgbuf_add(msg, MLA_NAME ": layer %d asks for %s, which this backend does not serve",
                      layer->layer_id,
                      layer->logit_softcap != 0.f ? "a logit softcap" : "a sliding window");
        return AP_ERR_UNSUPPORTED;
    }
    return AP_OK;
}
