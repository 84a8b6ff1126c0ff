/* check_tensor.c: checks of one DLTensor, and of a layer and its KV cache, against the model. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "check_internal.h"

#define AP_LAYER_MIN_SIZE (offsetof(ap_layer, kv) + sizeof(const ap_kv_cache *))
#define AP_KV_MIN_SIZE (offsetof(ap_kv_cache, v_block_scales) + sizeof(void *))

ap_status ap_check_fail(ap_msgbuf *msg, ap_status status, const char *fmt, ...) {
    char line[512];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    if (n < 0) line[0] = '\0';
    ap_msgbuf_add(msg, "%s", line);
    return status;
}

int ap_skips_kv(const ap_instance *instance) {
    return instance->model.embedding &&
           (instance->plugin->desc->caps->features & AP_FEATURE_EMBEDDING_SKIP_KV);
}

/* "[4][8][128]"; with `free_dims`, AP_ANY prints as "[*]" (an expected shape). Returns `out`.
 * Called only on a failure: the checks run per layer, and passing ones format nothing. */
static const char *ap_format_shape(const int64_t *dims, int ndim, int free_dims, char *out,
                                   size_t capacity) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < ndim && used < capacity; i++) {
        int n = free_dims && dims[i] == AP_ANY
                    ? snprintf(out + used, capacity - used, "[*]")
                    : snprintf(out + used, capacity - used, "[%" PRId64 "]", dims[i]);
        if (n > 0) used += (size_t)n;
    }
    if (ndim == 0) snprintf(out, capacity, "(scalar)");
    return out;
}

static const char *ap_dl_code_name(uint8_t code, uint8_t bits) {
    if (code == kDLFloat) return bits == 32 ? "float32" : bits == 16 ? "float16" : "float";
    if (code == kDLBfloat) return "bfloat16";
    if (code == kDLInt) return bits == 32 ? "int32" : "int";
    if (code == kDLUInt) return bits == 8 ? "uint8" : "uint";
    if (code == AP_DL_FLOAT8_E4M3FN) return "float8_e4m3fn";
    if (code == AP_DL_FLOAT8_E5M2) return "float8_e5m2";
    return "unknown";
}

DLDataType ap_dl_of(ap_dtype dtype) {
    switch (dtype) {
        case AP_DTYPE_BF16: return (DLDataType){kDLBfloat, 16, 1};
        case AP_DTYPE_F16: return (DLDataType){kDLFloat, 16, 1};
        case AP_DTYPE_F32: return (DLDataType){kDLFloat, 32, 1};
        default: return (DLDataType){kDLFloat, 0, 0}; /* matches no tensor */
    }
}

static int ap_dtype_ok(DLDataType got, DLDataType want) {
    if (got.lanes != 1) return 0;
    if (got.code == want.code && got.bits == want.bits) return 1;
    /* fp8 outputs may come as raw bytes: DLPack 0.6 producers have no float8 code. */
    return want.code == AP_DL_FLOAT8_E4M3FN && got.code == kDLUInt && got.bits == 8;
}

/* GPU backends take device memory; a backend serving on the CPU takes host memory. */
int ap_expected_device_type(const ap_instance *instance) {
    uint32_t kinds = instance->plugin->desc->caps->device_kinds;
    int gpu = instance->device.ordinal >= 0 && instance->device.unusable_reason[0] == '\0';
    return (kinds & AP_DEVICE_KIND_CUDA) && gpu ? kDLCUDA : kDLCPU;
}

/* Rank, shape, dtype, device, data and strides of a tensor: compact row-major for AP_DENSE,
 * a last dim of stride 1 for AP_ROWS, any non-negative ones for AP_STRIDED. */
ap_status ap_check_tensor(const ap_instance *instance, ap_msgbuf *msg, const char *name,
                          const DLTensor *t, int ndim, const int64_t *dims, DLDataType dtype,
                          ap_layout layout) {
    char want[64], got[64];
    if (t->ndim < 0 || t->ndim > 8 || (t->ndim > 0 && t->shape == NULL))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s has ndim %d with shape %p", name,
                             (int)t->ndim, (void *)t->shape);
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s has shape %s (negative dim %d)",
                                 name, ap_format_shape(t->shape, t->ndim, 0, got, sizeof got), i);
    }
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = dims[i] == AP_ANY || t->shape[i] == dims[i];
    if (!same)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH, "%s has shape %s, expected %s", name,
                             ap_format_shape(t->shape, t->ndim, 0, got, sizeof got),
                             ap_format_shape(dims, ndim, 1, want, sizeof want));
    if (!ap_dtype_ok(t->dtype, dtype))
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                             "%s has dtype %s (code %d, %d bits, %d lanes), "
                             "expected %s",
                             name, ap_dl_code_name(t->dtype.code, t->dtype.bits),
                             (int)t->dtype.code, (int)t->dtype.bits, (int)t->dtype.lanes,
                             ap_dl_code_name(dtype.code, dtype.bits));
    int device_type = ap_expected_device_type(instance);
    if ((int)t->device.device_type != device_type &&
        !(device_type == kDLCUDA && t->device.device_type == kDLCUDAManaged))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s is on device type %d, expected %s",
                             name, (int)t->device.device_type,
                             device_type == kDLCUDA ? "kDLCUDA" : "kDLCPU");
    if (device_type == kDLCUDA && t->device.device_id != instance->device.ordinal)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s is on CUDA device %d, expected %d",
                             name, (int)t->device.device_id, (int)instance->device.ordinal);
    /* The product of the non-zero dims bounds every count below (elements, strides): it must fit,
     * or a free dim could wrap the element count to 0 and pass a tensor without data. */
    int64_t extent = 1;
    int empty = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0)
            empty = 1;
        else if (__builtin_mul_overflow(extent, t->shape[i], &extent))
            return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                                 "%s has shape %s: more elements than int64 holds", name,
                                 ap_format_shape(t->shape, t->ndim, 0, got, sizeof got));
    }
    int64_t elements = empty ? 0 : extent;
    if (elements > 0 && t->data == NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s has shape %s but no data", name,
                             ap_format_shape(t->shape, t->ndim, 0, got, sizeof got));
    if (t->strides == NULL) return AP_OK;
    int64_t compact = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        /* A dim of size 1 may carry any stride (PyTorch leaves them arbitrary). */
        if (layout == AP_DENSE && t->shape[i] != 1 && t->strides[i] != compact)
            return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                                 "%s must be dense (row-major): dim %d has stride %" PRId64
                                 ", expected %" PRId64,
                                 name, i, t->strides[i], compact);
        if (layout == AP_ROWS && i == t->ndim - 1 && t->shape[i] != 1 && t->strides[i] != 1)
            return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                                 "%s must have dense rows: its last dim has stride %" PRId64
                                 ", expected 1",
                                 name, t->strides[i]);
        if (t->strides[i] < 0)
            return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s has a negative stride in dim %d",
                                 name, i);
        compact *= t->shape[i];
    }
    return AP_OK;
}

/* A required tensor: NULL is an error naming it. */
ap_status ap_check_required(const ap_instance *instance, ap_msgbuf *msg, const char *name,
                            const DLTensor *t, int ndim, const int64_t *dims, DLDataType dtype,
                            ap_layout layout) {
    if (t == NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s is NULL (required)", name);
    return ap_check_tensor(instance, msg, name, t, ndim, dims, dtype, layout);
}

/* An optional tensor: NULL passes. */
ap_status ap_check_optional(const ap_instance *instance, ap_msgbuf *msg, const char *name,
                            const DLTensor *t, int ndim, const int64_t *dims, DLDataType dtype,
                            ap_layout layout) {
    if (t == NULL) return AP_OK;
    return ap_check_tensor(instance, msg, name, t, ndim, dims, dtype, layout);
}

/* ---- the layer and its KV cache -------------------------------------------------------------- */

int ap_scale_ok(float scale) {
    return isfinite(scale) && scale > 0.0f;
}

static ap_status ap_check_kv(const ap_instance *instance, const ap_kv_cache *kv, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    if (kv->struct_size < AP_KV_MIN_SIZE)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "layer.kv->struct_size is %zu, expected >= %zu", kv->struct_size,
                             (size_t)AP_KV_MIN_SIZE);
    if (kv->layout != AP_KV_LAYOUT_NHD)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.kv->layout %d is not NHD",
                             (int)kv->layout);
    if (kv->dtype != m->kv_dtype)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH, "layer.kv->dtype is %s, the model's is %s",
                             ap_dtype_name(kv->dtype), ap_dtype_name(m->kv_dtype));
    const struct {
        const char *field;
        int32_t got, want;
    } fields[] = {
        {"page_size", kv->page_size, m->page_size},
        {"num_kv_heads", kv->num_kv_heads, m->num_kv_heads},
        {"head_dim_qk", kv->head_dim_qk, m->head_dim_qk},
        /* MLA keeps one latent (v is its first kv_lora_rank dims), so only MHA has a v width. */
        {"head_dim_v", kv->head_dim_v, m->kind == AP_ATTN_MLA ? kv->head_dim_v : m->head_dim_v},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (fields[i].got != fields[i].want)
            return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                                 "layer.kv->%s is %d, the model's is %d", fields[i].field,
                                 (int)fields[i].got, (int)fields[i].want);
    }
    if (kv->num_pages < 1)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.kv->num_pages is %d",
                             (int)kv->num_pages);
    if (kv->k_pages == NULL || (m->kind == AP_ATTN_MHA && kv->v_pages == NULL))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.kv->%s is NULL",
                             kv->k_pages == NULL ? "k_pages" : "v_pages");
    if (kv->dtype == AP_DTYPE_NVFP4 &&
        (kv->k_block_scales == NULL || (m->kind == AP_ATTN_MHA && kv->v_block_scales == NULL)))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "layer.kv is nvfp4 but its k/v block-scale buffer is NULL");
    if (instance->batch_planned && instance->batch_max_page >= kv->num_pages)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                             "the planned batch uses page %d but layer.kv has %d pages",
                             (int)instance->batch_max_page, (int)kv->num_pages);
    return AP_OK;
}

ap_status ap_check_layer(const ap_instance *instance, const ap_layer *layer, int kv_optional,
                         ap_msgbuf *msg) {
    if (layer == NULL) return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer is NULL");
    if (layer->struct_size < AP_LAYER_MIN_SIZE)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "layer.struct_size is %zu, expected >= %zu", layer->struct_size,
                             (size_t)AP_LAYER_MIN_SIZE);
    if (layer->layer_id < 0 || layer->layer_id >= instance->model.num_layers)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.layer_id is %d, expected 0..%d",
                             (int)layer->layer_id, (int)instance->model.num_layers - 1);
    if (!ap_scale_ok(layer->sm_scale))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "layer.sm_scale is %g (must be > 0, finite)", (double)layer->sm_scale);
    if (!(isfinite(layer->logit_softcap) && layer->logit_softcap >= 0.0f))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "layer.logit_softcap is %g (0: off, or > 0)",
                             (double)layer->logit_softcap);
    if (!ap_scale_ok(layer->k_scale) || !ap_scale_ok(layer->v_scale))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "layer.k_scale/v_scale are %g/%g (must be > 0, finite)",
                             (double)layer->k_scale, (double)layer->v_scale);
    if (layer->window_left < -1)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.window_left is %d (-1: off)",
                             (int)layer->window_left);
    if (layer->kv == NULL) {
        if (kv_optional) return AP_OK;
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.kv is NULL");
    }
    return ap_check_kv(instance, layer->kv, msg);
}
