/* plugin.c: trtllm_mla's entry: negotiation, caps, the instance's life, planning and hooks. */
#include <stdlib.h>

#include "backends/common/kit.h"
#include "glue.h"

#define MLA_VERSION "0.1.0"

/* ---- capabilities -------------------------------------------------------------------------- */

static const int32_t mla_page_sizes[] = {32, 64};

/* The hooks get_hook answers, declared in the caps for listing. */
static const char *const mla_hooks[] = {AP_HOOK_APPEND_KV_V1, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1,
                                        AP_HOOK_MERGE_STATE_V1, AP_HOOK_CUDA_GRAPH_V1};

static ap_caps mla_caps = {
    .struct_size = sizeof(ap_caps),
    .device_kinds = AP_DEVICE_KIND_CUDA,
    .archs = NULL, /* the build's targets, set at negotiation (ap_kit_cuda_archs) */
    .num_archs = 0,
    .attn_kinds = AP_ATTN_BIT(AP_ATTN_MLA),
    .q_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16),
    .kv_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_FP8_E4M3),
    .page_sizes = mla_page_sizes,
    .num_page_sizes = sizeof mla_page_sizes / sizeof mla_page_sizes[0],
    .head_dims = NULL, /* MLA: validate() checks 576 / 512 */
    .num_head_dims = 0,
    .phases = AP_PHASE_EXTEND | AP_PHASE_DECODE,
    .cuda_graph = AP_GRAPH_DECODE_ONLY,
    .features = AP_FEATURE_LSE | AP_FEATURE_SPLIT_KV,
    .needs_host_mirrors = 0,
    .hooks = mla_hooks,
    .num_hooks = sizeof mla_hooks / sizeof mla_hooks[0],
};

/* ---- the instance -------------------------------------------------------------------------- */

static void mla_destroy(ap_backend *b) {
    if (b == NULL) return;
    if (ap_kit_set_device(b->device_ordinal, MLA_NAME, NULL) == AP_OK) {
        ap_kit_device_free(b->partial_out);
        ap_kit_device_free(b->partial_lse);
        mla_prefill_free(b);
    }
    free(b);
}

/* Split-KV partial states: the split grid splits only while a batch has fewer CTAs than SMs, so
 * at most sm_count CTAs of at most 64 rows each leave one; the flat schedule's sm_count CTAs
 * leave at most two each (slots 2c, 2c + 1). 2 * sm_count * 64 rows: 34.6 MB on 132 SMs. */
static ap_status mla_alloc_workspace(ap_backend *b, ap_msgbuf *msg) {
    size_t rows = (size_t)b->sm_count * 2 * 64;
    ap_status st = ap_kit_device_alloc(rows * MLA_LATENT * sizeof(float), (void **)&b->partial_out,
                                       MLA_NAME, msg);
    if (st == AP_OK)
        st = ap_kit_device_alloc(rows * sizeof(float), (void **)&b->partial_lse, MLA_NAME, msg);
    if (st == AP_OK) st = mla_prefill_alloc(b, msg);
    return st;
}

static ap_status mla_create(const ap_model *model, const ap_options *options,
                            const ap_device *device, ap_backend **out, ap_msgbuf *msg) {
    ap_status st = AP_OK;
    ap_backend *b = ap_plugin_create_begin(mla_validate, model, options, device, out, sizeof *b,
                                           offsetof(ap_backend, model), MLA_NAME, msg, &st);
    if (b == NULL) return st;
    b->device_ordinal = device->ordinal;
    b->sm_count = device->sm_count;
    b->split_kv = mla_option_split_kv(options);
    b->flat = mla_option_flat(options);
    b->use_pdl = 1;
    b->stages = mla_option_stages(options);
    st = ap_kit_set_device(device->ordinal, MLA_NAME, msg);
    if (st == AP_OK) st = mla_decode_setup(msg);
    if (st == AP_OK) st = mla_alloc_workspace(b, msg);
    if (st != AP_OK) {
        mla_destroy(b);
        return st;
    }
    *out = b;
    return AP_OK;
}

/* One page: page_size latent rows of 576 values; no V pages (V is the latent's first 512). */
static ap_status mla_get_kv_spec(ap_backend *b, ap_kv_spec *out, ap_msgbuf *msg) {
    if (b == NULL || out == NULL || out->struct_size < sizeof(ap_kv_spec)) {
        ap_msgbuf_add(msg, MLA_NAME ": get_kv_spec needs an instance and an ap_kv_spec with "
                                    "struct_size set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    size_t elem = b->model.kv_dtype == AP_DTYPE_FP8_E4M3 ? 1 : 2;
    out->k_bytes_per_page = (size_t)b->model.page_size * MLA_ROW * elem;
    out->v_bytes_per_page = 0;
    out->scale_bytes_per_page = 0;
    out->alignment = 256;
    return AP_OK;
}

/* The plan reads only the batch's scalars and keeps its device arrays: no host mirror, no copy,
 * no allocation, so every call after it may be captured in a CUDA graph. A batch with the ragged
 * K/V source (MLA's MHA-form prefill) is the exception: prefill.c plans it from its host mirrors
 * into the buffer allocated at create, with one copy. */
static ap_status mla_init_metadata(ap_backend *b, const ap_batch *batch, void *stream,
                                   ap_msgbuf *msg) {
    if (b == NULL || batch == NULL || batch->struct_size < offsetof(ap_batch, kv_indptr)) {
        ap_msgbuf_add(msg, MLA_NAME ": init_metadata needs an instance and a batch");
        return AP_ERR_INVALID_ARGUMENT;
    }
    mla_plan *p = &b->plan;
    memset(p, 0, sizeof *p);
    p->mode = batch->mode;
    p->num_seqs = batch->num_seqs;
    p->num_tokens = batch->num_tokens;
    p->max_q_len = batch->max_q_len > 0 ? batch->max_q_len : 1;
    p->ragged = AP_HAS_FIELD(batch, ap_batch, kv_causal) && batch->kv_indptr != NULL;
    p->qo_indptr = batch->qo_indptr;
    p->kv_page_indptr = batch->kv_page_indptr;
    p->kv_page_indices = batch->kv_page_indices;
    p->seq_lens = batch->seq_lens;
    if (p->ragged) {
        ap_status st = mla_prefill_plan(b, batch, stream, msg);
        p->ready = st == AP_OK;
        return st;
    }
    if (!p->ragged && batch->num_seqs > 0 &&
        (batch->qo_indptr == NULL || batch->kv_page_indptr == NULL ||
         batch->kv_page_indices == NULL || batch->seq_lens == NULL)) {
        ap_msgbuf_add(msg, MLA_NAME ": the batch needs qo_indptr, the page arrays and seq_lens "
                                    "on the device");
        return AP_ERR_INVALID_ARGUMENT;
    }
    p->num_splits = b->split_kv ? mla_decode_num_splits(p->num_seqs, b->model.num_qo_heads,
                                                        p->max_q_len, b->sm_count, MLA_MAX_SPLITS)
                                : 1;
    /* The flat schedule needs every row of a sequence in one CTA (one row block). One sequence
     * cannot be skewed: the split grid cuts it the same way without computing a share first
     * (H100, 2026-11-27: B1 L32768 H16 0.0300 ms split against 0.0312 flat). */
    const int fits = b->model.num_qo_heads * p->max_q_len <=
                     mla_decode_block_rows(b->model.num_qo_heads, p->max_q_len);
    p->flat = b->split_kv && b->sm_count > 0 && p->num_seqs > 1 && fits ? b->flat : 0;
    p->ready = 1;
    return AP_OK;
}

static void *mla_get_hook(ap_backend *b, const char *name) {
    (void)b;
    if (name == NULL) return NULL;
    if (strcmp(name, AP_HOOK_APPEND_KV_V1) == 0) return (void *)mla_hook_append_kv;
    if (strcmp(name, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1) == 0) return (void *)mla_hook_pack;
    if (strcmp(name, AP_HOOK_MERGE_STATE_V1) == 0) return (void *)mla_hook_merge_state;
    if (strcmp(name, AP_HOOK_CUDA_GRAPH_V1) == 0) return (void *)mla_hook_cuda_graph;
    return NULL;
}

static const ap_vtable mla_vtable = {
    .struct_size = sizeof(ap_vtable),
    .validate = mla_validate,
    .create = mla_create,
    .destroy = mla_destroy,
    .get_kv_spec = mla_get_kv_spec,
    .init_metadata = mla_init_metadata,
    .forward_extend = mla_forward_extend,
    .forward_decode = mla_forward_decode,
    .get_hook = mla_get_hook,
};

static const ap_descriptor mla_descriptor = {
    .struct_size = sizeof(ap_descriptor),
    .name = MLA_NAME,
    .version = MLA_VERSION,
    .description = "DeepSeek MLA: absorbed decode (MTP 1..4) over the paged latent cache, fused "
                   "append, prefix-chunk pack, state merge",
    .caps = &mla_caps,
    .vtable = &mla_vtable,
};

/* The caps' arch table is the build's target list, parsed once by the kit. */
static const ap_descriptor *mla_descriptor_ready(void) {
    mla_caps.num_archs = ap_kit_cuda_archs(&mla_caps.archs);
    return &mla_descriptor;
}

AP_PLUGIN_DEFINE(mla_descriptor_ready())
