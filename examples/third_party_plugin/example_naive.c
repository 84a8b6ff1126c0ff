/* example_naive.c: a complete out-of-tree attnplug backend: paged MHA in plain C on the CPU.
 *
 * Built only from the installed ABI header (`pkg-config --cflags attnplug-plugin`): it uses no
 * core symbol and no header of the attnplug tree. It serves causal MHA/GQA/MQA prefill (extend)
 * and decode over a bf16 paged KV cache (layout NHD, any page size, any head dim) with f32 or
 * bf16 queries, and nothing fancy: no hooks, no LSE, no CUDA graphs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <plugin_api.h>

#define NAIVE_VERSION "1.0.0"
#define NAIVE_Q_DTYPES (AP_DTYPE_BIT(AP_DTYPE_F32) | AP_DTYPE_BIT(AP_DTYPE_BF16))
#define NAIVE_KV_DTYPES AP_DTYPE_BIT(AP_DTYPE_BF16)

/* The instance: the model, and the last batch's host arrays (copied: the caller's go away). */
struct ap_backend {
    ap_model model;
    int planned;
    ap_forward_mode mode;
    int32_t num_seqs, num_tokens;
    int32_t *qo_indptr, *seq_lens, *page_indptr, *page_indices; /* one allocation */
};

/* ---- bf16 <-> float, round to nearest even (NaN kept quiet) ---- */

static float naive_bf16_to_float(uint16_t code) {
    uint32_t bits = (uint32_t)code << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static uint16_t naive_float_to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* ---- validate / create / destroy ---- */

static ap_status naive_validate(const ap_model *model, const ap_options *options,
                                const ap_device *device, ap_msgbuf *reasons) {
    (void)device; /* the CPU serves whatever GPU there is, or none */
    if (model == NULL || model->struct_size < sizeof(ap_model)) {
        ap_msgbuf_add(reasons, "example_naive: no model, or one from an older ABI");
        return AP_ERR_REFUSED;
    }
    int refused = 0;
    if (model->kind != AP_ATTN_MHA)
        refused = 1, ap_msgbuf_add(reasons, "example_naive: serves MHA/GQA/MQA only");
    if (model->num_qo_heads < 1 || model->num_kv_heads < 1 ||
        model->num_qo_heads % model->num_kv_heads != 0)
        refused = 1, ap_msgbuf_add(reasons, "example_naive: KV heads must divide query heads");
    if (model->head_dim_qk < 1 || model->head_dim_v < 1 || model->page_size < 1)
        refused = 1, ap_msgbuf_add(reasons, "example_naive: head dims and page size must be >= 1");
    if ((unsigned)model->dtype >= 32 || !(NAIVE_Q_DTYPES & AP_DTYPE_BIT(model->dtype)))
        refused = 1, ap_msgbuf_add(reasons, "example_naive: queries must be f32 or bf16");
    if ((unsigned)model->kv_dtype >= 32 || !(NAIVE_KV_DTYPES & AP_DTYPE_BIT(model->kv_dtype)))
        refused = 1, ap_msgbuf_add(reasons, "example_naive: the KV cache must be bf16");
    if (!model->causal) refused = 1, ap_msgbuf_add(reasons, "example_naive: causal models only");
    if (model->embedding)
        refused = 1, ap_msgbuf_add(reasons, "example_naive: no embedding (skip-KV) mode");
    for (size_t i = 0; options != NULL && i < options->num_extra; i++)
        refused = 1, ap_msgbuf_add(reasons, "example_naive: unknown option '%s'",
                                   options->extra[i].key ? options->extra[i].key : "(null)");
    return refused ? AP_ERR_REFUSED : AP_OK;
}

static ap_status naive_create(const ap_model *model, const ap_options *options,
                              const ap_device *device, ap_backend **out, ap_msgbuf *msg) {
    ap_status status = AP_OK;
    ap_backend *backend =
        ap_plugin_create_begin(naive_validate, model, options, device, out, sizeof *backend,
                               offsetof(ap_backend, model), "example_naive", msg, &status);
    if (backend == NULL) return status;
    *out = backend;
    return AP_OK;
}

static void naive_destroy(ap_backend *backend) {
    if (backend == NULL) return;
    free(backend->qo_indptr);
    free(backend);
}

static ap_status naive_get_kv_spec(ap_backend *backend, ap_kv_spec *out, ap_msgbuf *msg) {
    if (backend == NULL || out == NULL || out->struct_size < sizeof(ap_kv_spec)) {
        ap_msgbuf_add(msg, "example_naive: get_kv_spec needs an instance and an ap_kv_spec");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_model *m = &backend->model;
    size_t token_bytes = (size_t)m->num_kv_heads * sizeof(uint16_t);
    out->k_bytes_per_page = (size_t)m->page_size * token_bytes * (size_t)m->head_dim_qk;
    out->v_bytes_per_page = (size_t)m->page_size * token_bytes * (size_t)m->head_dim_v;
    out->scale_bytes_per_page = 0;
    out->alignment = 16;
    return AP_OK;
}

/* ---- the plan: copy what the forward calls read from the host mirrors ---- */

static ap_status naive_init_metadata(ap_backend *backend, const ap_batch *batch, void *stream,
                                     ap_msgbuf *msg) {
    (void)stream;
    if (backend == NULL || batch == NULL || batch->qo_indptr_host == NULL ||
        batch->seq_lens_host == NULL || batch->kv_page_indptr_host == NULL ||
        batch->kv_page_indices_host == NULL || batch->num_seqs < 1) {
        ap_msgbuf_add(msg, "example_naive: the batch needs its host mirrors and page arrays");
        return AP_ERR_INVALID_ARGUMENT;
    }
    int32_t n = batch->num_seqs, pages = batch->kv_page_indptr_host[n];
    if (pages < 0 || batch->qo_indptr_host[n] != batch->num_tokens) {
        ap_msgbuf_add(msg, "example_naive: inconsistent batch arrays");
        return AP_ERR_SHAPE_MISMATCH;
    }
    size_t count = (size_t)(n + 1) * 2 + (size_t)n + (size_t)pages;
    int32_t *arrays = malloc(count * sizeof(int32_t));
    if (arrays == NULL) {
        ap_msgbuf_add(msg, "example_naive: out of memory");
        return AP_ERR_OUT_OF_MEMORY;
    }
    free(backend->qo_indptr);
    backend->qo_indptr = arrays;
    backend->page_indptr = arrays + n + 1;
    backend->seq_lens = backend->page_indptr + n + 1;
    backend->page_indices = backend->seq_lens + n;
    memcpy(backend->qo_indptr, batch->qo_indptr_host, (size_t)(n + 1) * sizeof(int32_t));
    memcpy(backend->page_indptr, batch->kv_page_indptr_host, (size_t)(n + 1) * sizeof(int32_t));
    memcpy(backend->seq_lens, batch->seq_lens_host, (size_t)n * sizeof(int32_t));
    memcpy(backend->page_indices, batch->kv_page_indices_host, (size_t)pages * sizeof(int32_t));
    backend->num_seqs = n;
    backend->num_tokens = batch->num_tokens;
    backend->mode = batch->mode;
    backend->planned = 1;
    return AP_OK;
}

/* ---- tensors: dense row-major host tensors of f32 or bf16 ---- */

static int naive_tensor_ok(const DLTensor *t, int64_t d0, int64_t d1, int64_t d2) {
    if (t == NULL || t->data == NULL || t->ndim != 3 || t->device.device_type != kDLCPU) return 0;
    if (t->shape[0] != d0 || t->shape[1] != d1 || t->shape[2] != d2) return 0;
    if (t->strides != NULL &&
        (t->strides[2] != 1 || t->strides[1] != d2 || t->strides[0] != d1 * d2))
        return 0;
    int f32 = t->dtype.code == kDLFloat && t->dtype.bits == 32;
    int bf16 = t->dtype.code == kDLBfloat && t->dtype.bits == 16;
    return (f32 || bf16) && t->dtype.lanes == 1;
}

static float naive_get(const DLTensor *t, int64_t index) {
    const char *base = (const char *)t->data + t->byte_offset;
    if (t->dtype.bits == 32) return ((const float *)base)[index];
    return naive_bf16_to_float(((const uint16_t *)base)[index]);
}

static void naive_set(DLTensor *t, int64_t index, float value) {
    char *base = (char *)t->data + t->byte_offset;
    if (t->dtype.bits == 32)
        ((float *)base)[index] = value;
    else
        ((uint16_t *)base)[index] = naive_float_to_bf16(value);
}

/* The bf16 cache element of (sequence, position, head, dim), K (is_v = 0) or V. */
static uint16_t *naive_cache_row(const ap_backend *b, const ap_kv_cache *kv, int is_v, int32_t seq,
                                 int32_t pos, int32_t head) {
    int32_t page = b->page_indices[b->page_indptr[seq] + pos / kv->page_size];
    int32_t dim = is_v ? kv->head_dim_v : kv->head_dim_qk;
    size_t slot = (size_t)page * (size_t)kv->page_size + (size_t)(pos % kv->page_size);
    uint16_t *base = is_v ? kv->v_pages : kv->k_pages;
    return base + (slot * (size_t)kv->num_kv_heads + (size_t)head) * (size_t)dim;
}

/* Is the layer's cache what this model needs, and does every page of the batch lie inside it? */
static ap_status naive_check_cache(const ap_backend *b, const ap_layer *layer, ap_msgbuf *msg) {
    const ap_kv_cache *kv = layer != NULL ? layer->kv : NULL;
    const ap_model *m = &b->model;
    if (kv == NULL || kv->k_pages == NULL || kv->v_pages == NULL || kv->dtype != AP_DTYPE_BF16 ||
        kv->page_size != m->page_size || kv->num_kv_heads != m->num_kv_heads ||
        kv->head_dim_qk != m->head_dim_qk || kv->head_dim_v != m->head_dim_v) {
        ap_msgbuf_add(msg, "example_naive: the layer's KV cache does not match the model");
        return AP_ERR_SHAPE_MISMATCH;
    }
    for (int32_t i = 0; i < b->num_seqs; i++) {
        int32_t pages = b->page_indptr[i + 1] - b->page_indptr[i];
        int32_t q_len = b->qo_indptr[i + 1] - b->qo_indptr[i];
        if (b->seq_lens[i] < q_len || (int64_t)pages * kv->page_size < b->seq_lens[i]) {
            ap_msgbuf_add(msg, "example_naive: sequence %d has %d tokens but %d pages", i,
                          b->seq_lens[i], pages);
            return AP_ERR_SHAPE_MISMATCH;
        }
        for (int32_t p = b->page_indptr[i]; p < b->page_indptr[i + 1]; p++) {
            if (b->page_indices[p] < 0 || b->page_indices[p] >= kv->num_pages) {
                ap_msgbuf_add(msg, "example_naive: page %d outside the cache's %d pages",
                              b->page_indices[p], kv->num_pages);
                return AP_ERR_SHAPE_MISMATCH;
            }
        }
    }
    return AP_OK;
}

/* Write the new tokens' k and v into their cache slots (position prefix + j). */
static void naive_save_kv(const ap_backend *b, const ap_kv_cache *kv, const DLTensor *k,
                          const DLTensor *v) {
    int32_t hk = kv->num_kv_heads, dk = kv->head_dim_qk, dv = kv->head_dim_v;
    for (int32_t i = 0; i < b->num_seqs; i++) {
        int32_t q_len = b->qo_indptr[i + 1] - b->qo_indptr[i];
        for (int32_t j = 0; j < q_len; j++) {
            int64_t token = b->qo_indptr[i] + j;
            int32_t pos = b->seq_lens[i] - q_len + j;
            for (int32_t h = 0; h < hk; h++) {
                uint16_t *krow = naive_cache_row(b, kv, 0, i, pos, h);
                uint16_t *vrow = naive_cache_row(b, kv, 1, i, pos, h);
                for (int32_t d = 0; d < dk; d++)
                    krow[d] = naive_float_to_bf16(naive_get(k, (token * hk + h) * dk + d));
                for (int32_t d = 0; d < dv; d++)
                    vrow[d] = naive_float_to_bf16(naive_get(v, (token * hk + h) * dv + d));
            }
        }
    }
}

/* out[t][h] = sum_p softmax_p(scale * q[t][h] . K[p][g]) V[p][g] over cached positions
 * p <= pos(t) (causal), g = h / (query heads per KV head); the max is subtracted for range. */
static void naive_attend_row(const ap_backend *b, const ap_layer *layer, const DLTensor *q,
                             DLTensor *out, int32_t seq, int64_t token, int32_t pos, int32_t h,
                             float *scores, float *acc, float *q_row) {
    const ap_kv_cache *kv = layer->kv;
    int32_t dk = kv->head_dim_qk, dv = kv->head_dim_v, hq = b->model.num_qo_heads;
    int32_t g = h / (hq / kv->num_kv_heads);
    int64_t q_base = (token * hq + h) * dk;
    for (int32_t d = 0; d < dk; d++) q_row[d] = naive_get(q, q_base + d);
    float max_score = -INFINITY;
    for (int32_t p = 0; p <= pos; p++) {
        const uint16_t *krow = naive_cache_row(b, kv, 0, seq, p, g);
        float dot = 0.0f;
        for (int32_t d = 0; d < dk; d++) dot += q_row[d] * naive_bf16_to_float(krow[d]);
        scores[p] = dot * layer->sm_scale;
        if (scores[p] > max_score) max_score = scores[p];
    }
    float denominator = 0.0f;
    for (int32_t d = 0; d < dv; d++) acc[d] = 0.0f;
    for (int32_t p = 0; p <= pos; p++) {
        float weight = expf(scores[p] - max_score);
        denominator += weight;
        const uint16_t *vrow = naive_cache_row(b, kv, 1, seq, p, g);
        for (int32_t d = 0; d < dv; d++) acc[d] += weight * naive_bf16_to_float(vrow[d]);
    }
    for (int32_t d = 0; d < dv; d++)
        naive_set(out, (token * hq + h) * dv + d, acc[d] / denominator);
}

static ap_status naive_forward(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                               ap_forward_mode mode, ap_msgbuf *msg) {
    if (b == NULL || layer == NULL || args == NULL || !b->planned || b->mode != mode) {
        ap_msgbuf_add(msg, "example_naive: forward without a matching init_metadata");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status status = naive_check_cache(b, layer, msg);
    if (status != AP_OK) return status;
    const ap_model *m = &b->model;
    int64_t t = b->num_tokens;
    if (!naive_tensor_ok(args->q, t, m->num_qo_heads, m->head_dim_qk) ||
        !naive_tensor_ok(args->out, t, m->num_qo_heads, m->head_dim_v) ||
        (args->save_kv && (!naive_tensor_ok(args->k, t, m->num_kv_heads, m->head_dim_qk) ||
                           !naive_tensor_ok(args->v, t, m->num_kv_heads, m->head_dim_v)))) {
        ap_msgbuf_add(msg, "example_naive: q/k/v/out must be dense host f32 or bf16 tensors of "
                           "the model's shape");
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (args->save_kv) naive_save_kv(b, layer->kv, args->k, args->v);
    int32_t longest = 1;
    for (int32_t i = 0; i < b->num_seqs; i++)
        if (b->seq_lens[i] > longest) longest = b->seq_lens[i];
    size_t scratch = (size_t)longest + (size_t)m->head_dim_v + (size_t)m->head_dim_qk;
    float *scores = malloc(scratch * sizeof(float));
    if (scores == NULL) {
        ap_msgbuf_add(msg, "example_naive: out of memory");
        return AP_ERR_OUT_OF_MEMORY;
    }
    for (int32_t i = 0; i < b->num_seqs; i++) {
        int32_t q_len = b->qo_indptr[i + 1] - b->qo_indptr[i];
        for (int32_t j = 0; j < q_len; j++)
            for (int32_t h = 0; h < m->num_qo_heads; h++)
                naive_attend_row(b, layer, args->q, args->out, i, b->qo_indptr[i] + j,
                                 b->seq_lens[i] - q_len + j, h, scores, scores + longest,
                                 scores + longest + m->head_dim_v);
    }
    free(scores);
    return AP_OK;
}

static ap_status naive_forward_extend(ap_backend *backend, const ap_layer *layer,
                                      const ap_forward_args *args, void *stream, ap_msgbuf *msg) {
    (void)stream;
    return naive_forward(backend, layer, args, AP_MODE_EXTEND, msg);
}

static ap_status naive_forward_decode(ap_backend *backend, const ap_layer *layer,
                                      const ap_forward_args *args, void *stream, ap_msgbuf *msg) {
    (void)stream;
    return naive_forward(backend, layer, args, AP_MODE_DECODE, msg);
}

/* No optional hooks: the host takes its unfused paths. */
static void *naive_get_hook(ap_backend *backend, const char *name) {
    (void)backend;
    (void)name;
    return NULL;
}

/* ---- the descriptor and the one exported symbol ---- */

static const ap_caps naive_caps = {
    .struct_size = sizeof(ap_caps),
    .device_kinds = AP_DEVICE_KIND_CPU,
    .attn_kinds = AP_ATTN_BIT(AP_ATTN_MHA),
    .q_dtypes = NAIVE_Q_DTYPES,
    .kv_dtypes = NAIVE_KV_DTYPES,
    .page_sizes = NULL, /* any */
    .head_dims = NULL,  /* any */
    .phases = AP_PHASE_EXTEND | AP_PHASE_DECODE,
    .cuda_graph = AP_GRAPH_NONE,
    .features = 0,
    .needs_host_mirrors = 1,
};

static const ap_vtable naive_vtable = {
    .struct_size = sizeof(ap_vtable),
    .validate = naive_validate,
    .create = naive_create,
    .destroy = naive_destroy,
    .get_kv_spec = naive_get_kv_spec,
    .init_metadata = naive_init_metadata,
    .forward_extend = naive_forward_extend,
    .forward_decode = naive_forward_decode,
    .get_hook = naive_get_hook,
};

static const ap_descriptor naive_descriptor = {
    .struct_size = sizeof(ap_descriptor),
    .name = "example_naive",
    .version = NAIVE_VERSION,
    .description = "third-party example: naive causal MHA on the CPU over a bf16 paged cache",
    .caps = &naive_caps,
    .vtable = &naive_vtable,
};

/* The one exported symbol, ap_plugin_negotiate: version check and this descriptor. */
AP_PLUGIN_DEFINE(&naive_descriptor)
