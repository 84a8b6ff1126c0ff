/* check.c: argument checks the core runs before any backend call, so backends see consistent input. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Smallest structs of ABI 1.0 (see select.c for why a minimum, not an exact size). */
#define AP_BATCH_MIN_SIZE (offsetof(ap_batch, positions_host) + sizeof(const int32_t *))
#define AP_LAYER_MIN_SIZE (offsetof(ap_layer, kv) + sizeof(const ap_kv_cache *))
#define AP_KV_MIN_SIZE (offsetof(ap_kv_cache, v_block_scales) + sizeof(void *))
#define AP_FORWARD_MIN_SIZE (offsetof(ap_forward_args, q_rope) + sizeof(const DLTensor *))
#define AP_APPEND_MIN_SIZE (offsetof(ap_append_kv_args, is_neox) + sizeof(int32_t))
#define AP_PACK_MIN_SIZE (offsetof(ap_pack_kv_args, v_scale) + sizeof(float))

#define AP_ANY (-1) /* a dimension the check leaves free */

/* Fail with one line in `msg`: every check below reads `return ap_fail(msg, STATUS, ...)`. */
static ap_status ap_fail(ap_msgbuf *msg, ap_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ap_status ap_fail(ap_msgbuf *msg, ap_status status, const char *fmt, ...) {
    char line[512];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    if (n < 0) line[0] = '\0';
    ap_msgbuf_add(msg, "%s", line);
    return status;
}

/* An embedding model on a backend that skips the KV cache needs no cache and no page arrays. */
static int ap_skips_kv(const ap_instance *instance) {
    return instance->model.embedding &&
           (instance->plugin->desc->caps->features & AP_FEATURE_EMBEDDING_SKIP_KV);
}

/* ---- the batch ------------------------------------------------------------------------------- */

/* indptr[0] == 0, non-decreasing, indptr[n] == total. */
static ap_status ap_check_indptr(ap_msgbuf *msg, const char *name, const int32_t *indptr, int32_t n,
                                 int32_t total, const char *total_name) {
    if (indptr[0] != 0)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH, "batch.%s[0] is %d, expected 0", name,
                       (int)indptr[0]);
    for (int32_t i = 0; i < n; i++) {
        if (indptr[i + 1] < indptr[i])
            return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                           "batch.%s decreases: [%d] = %d after [%d] = %d", name, (int)(i + 1),
                           (int)indptr[i + 1], (int)i, (int)indptr[i]);
    }
    if (indptr[n] != total)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH, "batch.%s[%d] is %d, expected %s = %d", name,
                       (int)n, (int)indptr[n], total_name, (int)total);
    return AP_OK;
}

/* Counts and required pointers: everything that needs no array element. */
static ap_status ap_check_batch_header(const ap_instance *instance, const ap_batch *b,
                                       ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    if (b == NULL) return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "batch is NULL");
    if (b->struct_size < AP_BATCH_MIN_SIZE)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "batch.struct_size is %zu, expected >= %zu",
                       b->struct_size, (size_t)AP_BATCH_MIN_SIZE);
    if (b->mode != AP_MODE_EXTEND && b->mode != AP_MODE_DECODE)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "batch.mode %d is not extend or decode",
                       (int)b->mode);
    if (b->num_seqs < 1 || (m->max_batch > 0 && b->num_seqs > m->max_batch))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                       "batch.num_seqs is %d, expected 1..%d (model.max_batch)", (int)b->num_seqs,
                       (int)(m->max_batch > 0 ? m->max_batch : INT32_MAX));
    if (b->num_tokens < 1 || (m->max_tokens > 0 && b->num_tokens > m->max_tokens))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                       "batch.num_tokens is %d, expected 1..%d (model.max_tokens)",
                       (int)b->num_tokens, (int)(m->max_tokens > 0 ? m->max_tokens : INT32_MAX));
    if (b->mode == AP_MODE_DECODE && m->embedding)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "decode batch for an embedding model");
    if (b->mode == AP_MODE_DECODE && b->num_tokens != b->num_seqs)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                       "decode batch has num_tokens %d for num_seqs %d (one token each)",
                       (int)b->num_tokens, (int)b->num_seqs);
    int pages = !ap_skips_kv(instance);
    if (b->qo_indptr == NULL || b->seq_lens == NULL)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "batch.%s is NULL",
                       b->qo_indptr == NULL ? "qo_indptr" : "seq_lens");
    if (pages &&
        (b->kv_page_indptr == NULL || b->kv_page_indices == NULL || b->kv_last_page_len == NULL))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                       "batch.kv_page_indptr, kv_page_indices and kv_last_page_len are required "
                       "(one is NULL)");
    if (pages && b->num_pages_total < b->num_seqs)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                       "batch.num_pages_total is %d, fewer than num_seqs %d (each sequence has "
                       ">= 1 page)",
                       (int)b->num_pages_total, (int)b->num_seqs);
    if (instance->plugin->desc->caps->needs_host_mirrors) {
        if (b->qo_indptr_host == NULL || b->seq_lens_host == NULL ||
            (pages && (b->kv_page_indptr_host == NULL || b->kv_page_indices_host == NULL ||
                       b->kv_last_page_len_host == NULL)))
            return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                           "backend '%s' needs the batch's host mirrors (qo_indptr_host, "
                           "kv_page_indptr_host, kv_page_indices_host, kv_last_page_len_host, "
                           "seq_lens_host); one is NULL",
                           instance->plugin->desc->name);
    }
    return AP_OK;
}

/* One sequence's page list against its length: pages, last-page length, seq_len. */
static ap_status ap_check_seq_pages(const ap_instance *instance, const ap_batch *b, int32_t i,
                                    ap_msgbuf *msg) {
    int32_t page_size = instance->model.page_size;
    int32_t seq_len = b->seq_lens_host[i];
    int32_t npages = b->kv_page_indptr_host[i + 1] - b->kv_page_indptr_host[i];
    if (npages < 1)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH, "sequence %d has no KV page", (int)i);
    if (b->kv_last_page_len_host == NULL) return AP_OK;
    int32_t last = b->kv_last_page_len_host[i];
    if (last < 1 || last > page_size)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                       "batch.kv_last_page_len_host[%d] is %d, expected 1..%d (page size)", (int)i,
                       (int)last, (int)page_size);
    int64_t expected = (int64_t)(npages - 1) * page_size + last;
    if (seq_len != expected)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                       "batch.seq_lens_host[%d] is %d, but its %d pages of %d with a last page "
                       "of %d hold %" PRId64,
                       (int)i, (int)seq_len, (int)npages, (int)page_size, (int)last, expected);
    return AP_OK;
}

/* Every sequence: q_len, seq_len, pages; and the batch's maxima. */
static ap_status ap_check_batch_seqs(const ap_instance *instance, const ap_batch *b,
                                     ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    int32_t max_q = 0, max_seq = 0;
    for (int32_t i = 0; i < b->num_seqs; i++) {
        int32_t q_len = b->qo_indptr_host[i + 1] - b->qo_indptr_host[i];
        if (b->mode == AP_MODE_DECODE && q_len != 1)
            return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                           "decode batch: sequence %d has q_len %d (qo_indptr_host), expected 1",
                           (int)i, (int)q_len);
        if (b->seq_lens_host == NULL) {
            max_q = q_len > max_q ? q_len : max_q;
            continue;
        }
        int32_t seq_len = b->seq_lens_host[i];
        if (seq_len < q_len)
            return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                           "batch.seq_lens_host[%d] is %d, shorter than its q_len %d", (int)i,
                           (int)seq_len, (int)q_len);
        if (m->max_kv_len > 0 && seq_len > m->max_kv_len)
            return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                           "batch.seq_lens_host[%d] is %d, longer than model.max_kv_len %" PRId64,
                           (int)i, (int)seq_len, m->max_kv_len);
        if (b->kv_page_indptr_host != NULL) {
            ap_status status = ap_check_seq_pages(instance, b, i, msg);
            if (status != AP_OK) return status;
        }
        max_q = q_len > max_q ? q_len : max_q;
        max_seq = seq_len > max_seq ? seq_len : max_seq;
    }
    if (b->max_q_len != max_q)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                       "batch.max_q_len is %d, but the largest q_len is %d", (int)b->max_q_len,
                       (int)max_q);
    if (b->seq_lens_host != NULL && b->max_seq_len != max_seq)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                       "batch.max_seq_len is %d, but the largest seq_len is %d",
                       (int)b->max_seq_len, (int)max_seq);
    return AP_OK;
}

ap_status ap_check_batch(const ap_instance *instance, const ap_batch *b, int32_t *max_page,
                         ap_msgbuf *msg) {
    *max_page = -1;
    ap_status status = ap_check_batch_header(instance, b, msg);
    if (status != AP_OK) return status;
    /* Without host mirrors the device arrays cannot be read here; the backend plans blind. */
    if (b->qo_indptr_host == NULL) return AP_OK;
    status = ap_check_indptr(msg, "qo_indptr_host", b->qo_indptr_host, b->num_seqs, b->num_tokens,
                             "num_tokens");
    if (status != AP_OK) return status;
    if (b->kv_page_indptr_host != NULL) {
        status = ap_check_indptr(msg, "kv_page_indptr_host", b->kv_page_indptr_host, b->num_seqs,
                                 b->num_pages_total, "num_pages_total");
        if (status != AP_OK) return status;
    }
    status = ap_check_batch_seqs(instance, b, msg);
    if (status != AP_OK) return status;
    if (b->kv_page_indices_host != NULL && b->kv_page_indptr_host != NULL) {
        int32_t largest = -1;
        for (int32_t p = 0; p < b->num_pages_total; p++) {
            int32_t page = b->kv_page_indices_host[p];
            if (page < 0)
                return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                               "batch.kv_page_indices_host[%d] is %d (negative)", (int)p,
                               (int)page);
            largest = page > largest ? page : largest;
        }
        *max_page = largest;
    }
    return AP_OK;
}

/* ---- tensors --------------------------------------------------------------------------------- */

static void ap_format_shape(const int64_t *dims, int ndim, char *out, size_t capacity) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < ndim && used < capacity; i++) {
        int n = dims[i] == AP_ANY ? snprintf(out + used, capacity - used, "[*]")
                                  : snprintf(out + used, capacity - used, "[%" PRId64 "]", dims[i]);
        if (n > 0) used += (size_t)n;
    }
    if (ndim == 0) snprintf(out, capacity, "(scalar)");
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

static DLDataType ap_dl_of(ap_dtype dtype) {
    switch (dtype) {
        case AP_DTYPE_BF16: return (DLDataType){kDLBfloat, 16, 1};
        case AP_DTYPE_F16: return (DLDataType){kDLFloat, 16, 1};
        case AP_DTYPE_F32: return (DLDataType){kDLFloat, 32, 1};
        default: return (DLDataType){kDLFloat, 0, 0}; /* matches no tensor */
    }
}

#define AP_DL_INT32 ((DLDataType){kDLInt, 32, 1})
#define AP_DL_FLOAT32 ((DLDataType){kDLFloat, 32, 1})
#define AP_DL_FP8_OUT ((DLDataType){AP_DL_FLOAT8_E4M3FN, 8, 1}) /* or uint8: see ap_dtype_ok */

static int ap_dtype_ok(DLDataType got, DLDataType want) {
    if (got.lanes != 1) return 0;
    if (got.code == want.code && got.bits == want.bits) return 1;
    /* fp8 outputs may come as raw bytes: DLPack 0.6 producers have no float8 code. */
    return want.code == AP_DL_FLOAT8_E4M3FN && got.code == kDLUInt && got.bits == 8;
}

/* GPU backends take device memory; a backend serving on the CPU takes host memory. */
static int ap_expected_device_type(const ap_instance *instance) {
    uint32_t kinds = instance->plugin->desc->caps->device_kinds;
    int gpu = instance->device.ordinal >= 0 && instance->device.unusable_reason[0] == '\0';
    return (kinds & AP_DEVICE_KIND_CUDA) && gpu ? kDLCUDA : kDLCPU;
}

/* Outputs and forward inputs are dense; the pack hook's inputs may have any (non-negative) strides. */
typedef enum ap_layout { AP_DENSE, AP_STRIDED } ap_layout;

/* Rank, shape, dtype, device, data and (for AP_DENSE) compact row-major strides of a tensor. */
static ap_status ap_check_tensor(const ap_instance *instance, ap_msgbuf *msg, const char *name,
                                 const DLTensor *t, int ndim, const int64_t *dims, DLDataType dtype,
                                 ap_layout layout) {
    char want[64], got[64];
    ap_format_shape(dims, ndim, want, sizeof want);
    if (t->ndim < 0 || t->ndim > 8 || (t->ndim > 0 && t->shape == NULL))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s has ndim %d with shape %p", name,
                       (int)t->ndim, (void *)t->shape);
    ap_format_shape(t->shape, t->ndim, got, sizeof got);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = dims[i] == AP_ANY || t->shape[i] == dims[i];
    if (!same)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH, "%s has shape %s, expected %s", name, got, want);
    if (!ap_dtype_ok(t->dtype, dtype))
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                       "%s has dtype %s (code %d, %d bits, %d lanes), "
                       "expected %s",
                       name, ap_dl_code_name(t->dtype.code, t->dtype.bits), (int)t->dtype.code,
                       (int)t->dtype.bits, (int)t->dtype.lanes,
                       ap_dl_code_name(dtype.code, dtype.bits));
    int device_type = ap_expected_device_type(instance);
    if ((int)t->device.device_type != device_type &&
        !(device_type == kDLCUDA && t->device.device_type == kDLCUDAManaged))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s is on device type %d, expected %s", name,
                       (int)t->device.device_type, device_type == kDLCUDA ? "kDLCUDA" : "kDLCPU");
    if (device_type == kDLCUDA && t->device.device_id != instance->device.ordinal)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s is on CUDA device %d, expected %d", name,
                       (int)t->device.device_id, (int)instance->device.ordinal);
    int64_t elements = 1;
    for (int i = 0; i < t->ndim; i++) elements *= t->shape[i];
    if (elements > 0 && t->data == NULL)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s has shape %s but no data", name, got);
    if (t->strides == NULL) return AP_OK;
    int64_t compact = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        /* A dim of size 1 may carry any stride (PyTorch leaves them arbitrary). */
        if (layout == AP_DENSE && t->shape[i] != 1 && t->strides[i] != compact)
            return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                           "%s must be dense (row-major): dim %d has stride %" PRId64
                           ", expected %" PRId64,
                           name, i, t->strides[i], compact);
        if (t->strides[i] < 0)
            return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s has a negative stride in dim %d", name,
                           i);
        compact *= t->shape[i];
    }
    return AP_OK;
}

/* A required tensor: NULL is an error naming it. */
static ap_status ap_check_required(const ap_instance *instance, ap_msgbuf *msg, const char *name,
                                   const DLTensor *t, int ndim, const int64_t *dims,
                                   DLDataType dtype, ap_layout layout) {
    if (t == NULL) return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "%s is NULL (required)", name);
    return ap_check_tensor(instance, msg, name, t, ndim, dims, dtype, layout);
}

/* An optional tensor: NULL passes. */
static ap_status ap_check_optional(const ap_instance *instance, ap_msgbuf *msg, const char *name,
                                   const DLTensor *t, int ndim, const int64_t *dims,
                                   DLDataType dtype, ap_layout layout) {
    if (t == NULL) return AP_OK;
    return ap_check_tensor(instance, msg, name, t, ndim, dims, dtype, layout);
}

/* ---- the layer and its KV cache -------------------------------------------------------------- */

static int ap_scale_ok(float scale) {
    return isfinite(scale) && scale > 0.0f;
}

static ap_status ap_check_kv(const ap_instance *instance, const ap_kv_cache *kv, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    if (kv->struct_size < AP_KV_MIN_SIZE)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                       "layer.kv->struct_size is %zu, expected >= %zu", kv->struct_size,
                       (size_t)AP_KV_MIN_SIZE);
    if (kv->layout != AP_KV_LAYOUT_NHD)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.kv->layout %d is not NHD",
                       (int)kv->layout);
    if (kv->dtype != m->kv_dtype)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH, "layer.kv->dtype is %s, the model's is %s",
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
            return ap_fail(msg, AP_ERR_SHAPE_MISMATCH, "layer.kv->%s is %d, the model's is %d",
                           fields[i].field, (int)fields[i].got, (int)fields[i].want);
    }
    if (kv->num_pages < 1)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.kv->num_pages is %d",
                       (int)kv->num_pages);
    if (kv->k_pages == NULL || (m->kind == AP_ATTN_MHA && kv->v_pages == NULL))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.kv->%s is NULL",
                       kv->k_pages == NULL ? "k_pages" : "v_pages");
    if (kv->dtype == AP_DTYPE_NVFP4 &&
        (kv->k_block_scales == NULL || (m->kind == AP_ATTN_MHA && kv->v_block_scales == NULL)))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                       "layer.kv is nvfp4 but its k/v block-scale buffer is NULL");
    if (instance->batch_planned && instance->batch_max_page >= kv->num_pages)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                       "the planned batch uses page %d but layer.kv has %d pages",
                       (int)instance->batch_max_page, (int)kv->num_pages);
    return AP_OK;
}

static ap_status ap_check_layer(const ap_instance *instance, const ap_layer *layer, int kv_optional,
                                ap_msgbuf *msg) {
    if (layer == NULL) return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer is NULL");
    if (layer->struct_size < AP_LAYER_MIN_SIZE)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.struct_size is %zu, expected >= %zu",
                       layer->struct_size, (size_t)AP_LAYER_MIN_SIZE);
    if (layer->layer_id < 0 || layer->layer_id >= instance->model.num_layers)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.layer_id is %d, expected 0..%d",
                       (int)layer->layer_id, (int)instance->model.num_layers - 1);
    if (!ap_scale_ok(layer->sm_scale))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.sm_scale is %g (must be > 0, finite)",
                       (double)layer->sm_scale);
    if (!(isfinite(layer->logit_softcap) && layer->logit_softcap >= 0.0f))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.logit_softcap is %g (0: off, or > 0)",
                       (double)layer->logit_softcap);
    if (!ap_scale_ok(layer->k_scale) || !ap_scale_ok(layer->v_scale))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                       "layer.k_scale/v_scale are %g/%g (must be > 0, finite)",
                       (double)layer->k_scale, (double)layer->v_scale);
    if (layer->window_left < -1)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.window_left is %d (-1: off)",
                       (int)layer->window_left);
    if (layer->kv == NULL) {
        if (kv_optional) return AP_OK;
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "layer.kv is NULL");
    }
    return ap_check_kv(instance, layer->kv, msg);
}

/* ---- forward_extend / forward_decode ---------------------------------------------------------- */

/* q, out, lse, q_rope: the query side, shaped [T][Hq][...]. */
static ap_status ap_check_forward_q(const ap_instance *instance, const ap_forward_args *a,
                                    int64_t dq, int64_t dv, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    int64_t t = instance->batch_num_tokens, hq = m->num_qo_heads;
    DLDataType act = ap_dl_of(m->dtype);
    ap_status status =
        ap_check_required(instance, msg, "args.q", a->q, 3, (int64_t[]){t, hq, dq}, act, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.out", a->out, 3, (int64_t[]){t, hq, dv},
                                   act, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_optional(instance, msg, "args.lse", a->lse, 2, (int64_t[]){t, hq},
                                   AP_DL_FLOAT32, AP_DENSE);
    if (status == AP_OK && a->q_rope != NULL)
        status = ap_check_tensor(instance, msg, "args.q_rope", a->q_rope, 3,
                                 (int64_t[]){t, hq, m->qk_rope_head_dim}, act, AP_DENSE);
    return status;
}

/* k, v: new keys and values, shaped [T][H][...], both or neither. */
static ap_status ap_check_forward_kv(const ap_instance *instance, const ap_forward_args *a,
                                     int64_t hk, int64_t dk, int64_t dv, int v_optional,
                                     ap_msgbuf *msg) {
    int64_t t = instance->batch_num_tokens;
    DLDataType act = ap_dl_of(instance->model.dtype);
    if (a->k == NULL && a->v != NULL)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.v is given without args.k");
    if (a->k != NULL && a->v == NULL && !v_optional)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.k is given without args.v");
    if (a->save_kv && a->k == NULL)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.save_kv is 1 but args.k/v are NULL");
    ap_status status =
        ap_check_optional(instance, msg, "args.k", a->k, 3, (int64_t[]){t, hk, dk}, act, AP_DENSE);
    if (status != AP_OK) return status;
    return ap_check_optional(instance, msg, "args.v", a->v, 3, (int64_t[]){t, hk, dv}, act,
                             AP_DENSE);
}

ap_status ap_check_forward(const ap_instance *instance, ap_forward_mode mode, const ap_layer *layer,
                           const ap_forward_args *a, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    const char *want = mode == AP_MODE_DECODE ? "decode" : "extend";
    if (!instance->batch_planned)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                       "no batch is planned: call ap_instance_init_metadata first");
    if (instance->batch_mode != mode)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "the planned batch is %s, not %s",
                       instance->batch_mode == AP_MODE_DECODE ? "decode" : "extend", want);
    if (a == NULL) return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args is NULL");
    if (a->struct_size < AP_FORWARD_MIN_SIZE)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.struct_size is %zu, expected >= %zu",
                       a->struct_size, (size_t)AP_FORWARD_MIN_SIZE);
    if (a->save_kv != 0 && a->save_kv != 1)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.save_kv is %d (0 or 1)",
                       (int)a->save_kv);
    ap_status status = ap_check_layer(instance, layer, ap_skips_kv(instance) && !a->save_kv, msg);
    if (status != AP_OK) return status;
    if (m->kind == AP_ATTN_MHA) {
        if (a->q_rope != NULL)
            return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.q_rope is for MLA models only");
        status = ap_check_forward_q(instance, a, m->head_dim_qk, m->head_dim_v, msg);
        if (status != AP_OK) return status;
        return ap_check_forward_kv(instance, a, m->num_kv_heads, m->head_dim_qk, m->head_dim_v, 0,
                                   msg);
    }
    /* MLA has two forms. MHA-style prefill (extend, q without q_rope is qk_nope + qk_rope wide):
     * per-head k and v. Absorbed (decode, or extend over the latent): q is the latent width
     * (576 = 512 + 64) or its 512 part with q_rope beside it; new k is the latent [T][1][576]. */
    int64_t prefill_dq = (int64_t)m->qk_nope_head_dim + m->qk_rope_head_dim;
    if (mode == AP_MODE_EXTEND && a->q_rope == NULL && a->q != NULL && a->q->ndim == 3 &&
        a->q->shape != NULL && m->qk_nope_head_dim > 0 && m->v_head_dim > 0 &&
        a->q->shape[2] == prefill_dq && prefill_dq != m->head_dim_qk) {
        status = ap_check_forward_q(instance, a, prefill_dq, m->v_head_dim, msg);
        if (status != AP_OK) return status;
        return ap_check_forward_kv(instance, a, m->num_qo_heads, prefill_dq, m->v_head_dim, 0, msg);
    }
    int64_t dq = a->q_rope != NULL ? m->kv_lora_rank : m->head_dim_qk;
    status = ap_check_forward_q(instance, a, dq, m->head_dim_v, msg);
    if (status != AP_OK) return status;
    return ap_check_forward_kv(instance, a, 1, m->head_dim_qk, m->head_dim_v, 1, msg);
}

/* ---- hooks ------------------------------------------------------------------------------------ */

/* Element i of a 1-D int32 tensor in host memory. */
static int32_t ap_host_int32(const DLTensor *t, int64_t i) {
    int64_t stride = t->strides != NULL ? t->strides[0] : 1;
    const char *base = (const char *)t->data + t->byte_offset;
    int32_t value;
    memcpy(&value, base + i * stride * (int64_t)sizeof(int32_t), sizeof value);
    return value;
}

/* On a CPU backend the slot and position tensors are host memory: check each value so nothing
 * is written outside the cache nor read outside cos_sin. */
static ap_status ap_check_append_values(const ap_instance *instance, const ap_layer *layer,
                                        const ap_append_kv_args *a, int64_t t, ap_msgbuf *msg) {
    if (ap_expected_device_type(instance) != kDLCPU) return AP_OK;
    int64_t slots = (int64_t)layer->kv->num_pages * layer->kv->page_size;
    int64_t rows = a->cos_sin->shape[0];
    for (int64_t i = 0; i < t; i++) {
        int32_t slot = ap_host_int32(a->out_loc, i), pos = ap_host_int32(a->positions, i);
        if (slot < 0 || slot >= slots)
            return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                           "args.out_loc[%" PRId64 "] is %d, outside the cache's %" PRId64 " slots",
                           i, (int)slot, slots);
        if (pos < 0 || pos >= rows)
            return ap_fail(msg, AP_ERR_SHAPE_MISMATCH,
                           "args.positions[%" PRId64 "] is %d, outside cos_sin's %" PRId64 " rows",
                           i, (int)pos, rows);
    }
    return AP_OK;
}

ap_status ap_check_append_kv(const ap_instance *instance, const ap_layer *layer,
                             const ap_append_kv_args *a, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    ap_status status = ap_check_layer(instance, layer, 0, msg);
    if (status != AP_OK) return status;
    if (a == NULL) return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args is NULL");
    if (a->struct_size < AP_APPEND_MIN_SIZE)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.struct_size is %zu, expected >= %zu",
                       a->struct_size, (size_t)AP_APPEND_MIN_SIZE);
    if (a->rotary_dim <= 0 || a->rotary_dim % 2 != 0 || a->rotary_dim > m->head_dim_qk)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                       "args.rotary_dim is %d (must be even, > 0 and <= head_dim_qk %d)",
                       (int)a->rotary_dim, (int)m->head_dim_qk);
    if (a->is_neox != 0 && a->is_neox != 1)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.is_neox is %d (0 or 1)",
                       (int)a->is_neox);
    if (a->q == NULL) return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.q is NULL (required)");
    if (a->q->ndim < 1 || a->q->shape == NULL)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH, "args.q has ndim %d, expected 3",
                       (int)a->q->ndim);
    int64_t t = a->q->shape[0];
    DLDataType act = ap_dl_of(m->dtype);
    /* MLA's fused append is the backend's to shape (rope part, latent); the core checks rank,
     * token count, dtype and device there, and the full MHA shapes otherwise. */
    int mla = m->kind == AP_ATTN_MLA;
    int64_t dq = mla ? AP_ANY : m->head_dim_qk, hq = mla ? AP_ANY : m->num_qo_heads;
    int64_t hk = mla ? AP_ANY : m->num_kv_heads, dk = mla ? AP_ANY : m->head_dim_qk;
    int64_t dv = mla ? AP_ANY : m->head_dim_v;
    status =
        ap_check_tensor(instance, msg, "args.q", a->q, 3, (int64_t[]){t, hq, dq}, act, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.q_out", a->q_out, 3,
                                   (int64_t[]){t, a->q->shape[1], a->q->shape[2]}, act, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.k", a->k, 3, (int64_t[]){t, hk, dk}, act,
                                   AP_DENSE);
    if (status == AP_OK && !(mla && a->v == NULL))
        status = ap_check_required(instance, msg, "args.v", a->v, 3, (int64_t[]){t, hk, dv}, act,
                                   AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.positions", a->positions, 1, (int64_t[]){t},
                                   AP_DL_INT32, AP_STRIDED);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.out_loc", a->out_loc, 1, (int64_t[]){t},
                                   AP_DL_INT32, AP_STRIDED);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.cos_sin", a->cos_sin, 2,
                                   (int64_t[]){AP_ANY, a->rotary_dim}, AP_DL_FLOAT32, AP_DENSE);
    if (status != AP_OK) return status;
    return ap_check_append_values(instance, layer, a, t, msg);
}

ap_status ap_check_pack_kv(const ap_instance *instance, const ap_pack_kv_args *a, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    if (m->kind != AP_ATTN_MLA || m->qk_nope_head_dim <= 0 || m->v_head_dim <= 0)
        return ap_fail(msg, AP_ERR_UNSUPPORTED,
                       "needs an MLA model with qk_nope_head_dim and v_head_dim (model is %s, "
                       "%d, %d)",
                       ap_attn_kind_name(m->kind), (int)m->qk_nope_head_dim, (int)m->v_head_dim);
    if (a == NULL) return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args is NULL");
    if (a->struct_size < AP_PACK_MIN_SIZE)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.struct_size is %zu, expected >= %zu",
                       a->struct_size, (size_t)AP_PACK_MIN_SIZE);
    if (!ap_scale_ok(a->k_scale) || !ap_scale_ok(a->v_scale))
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT,
                       "args.k_scale/v_scale are %g/%g (must be > 0, finite)", (double)a->k_scale,
                       (double)a->v_scale);
    if (a->k_nope == NULL)
        return ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.k_nope is NULL (required)");
    if (a->k_nope->ndim < 1 || a->k_nope->shape == NULL)
        return ap_fail(msg, AP_ERR_SHAPE_MISMATCH, "args.k_nope has ndim %d, expected 3",
                       (int)a->k_nope->ndim);
    int64_t t = a->k_nope->shape[0], h = m->num_qo_heads;
    int64_t nope = m->qk_nope_head_dim, rope = m->qk_rope_head_dim, dv = m->v_head_dim;
    DLDataType act = ap_dl_of(m->dtype);
    ap_status status = ap_check_tensor(instance, msg, "args.k_nope", a->k_nope, 3,
                                       (int64_t[]){t, h, nope}, act, AP_STRIDED);
    if (status == AP_OK && a->k_pe == NULL)
        status = ap_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.k_pe is NULL (required)");
    if (status == AP_OK)
        status = a->k_pe->ndim == 2 ? ap_check_tensor(instance, msg, "args.k_pe", a->k_pe, 2,
                                                      (int64_t[]){t, rope}, act, AP_STRIDED)
                                    : ap_check_tensor(instance, msg, "args.k_pe", a->k_pe, 3,
                                                      (int64_t[]){t, 1, rope}, act, AP_STRIDED);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.v", a->v, 3, (int64_t[]){t, h, dv}, act,
                                   AP_STRIDED);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.k_out", a->k_out, 3,
                                   (int64_t[]){t, h, nope + rope}, AP_DL_FP8_OUT, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.v_out", a->v_out, 3, (int64_t[]){t, h, dv},
                                   AP_DL_FP8_OUT, AP_DENSE);
    return status;
}
