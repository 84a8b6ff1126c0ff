/* plugin.c: trtllm_mha's entry: negotiation, caps, the instance's life and its hooks. */
#include <stdlib.h>
#include <string.h>

#include "glue.h"

#define MHA_VERSION "0.1.0"

/* ---- capabilities -------------------------------------------------------------------------- */

static const int32_t mha_page_sizes[] = {16, 32, 64};
static const int32_t mha_head_dims[] = {64, 128, 256};

/* The hooks get_hook answers, declared in the caps for listing. */
static const char *const mha_hooks[] = {AP_HOOK_APPEND_KV_V1, AP_HOOK_CUDA_GRAPH_V1};

static ap_caps mha_caps = {
    .struct_size = sizeof(ap_caps),
    .device_kinds = AP_DEVICE_KIND_CUDA,
    .archs = NULL, /* the build's targets, set at negotiation (ap_kit_cuda_archs) */
    .num_archs = 0,
    .attn_kinds = AP_ATTN_BIT(AP_ATTN_MHA),
    .q_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16),
    .kv_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16) |
                 AP_DTYPE_BIT(AP_DTYPE_FP8_E4M3) | AP_DTYPE_BIT(AP_DTYPE_NVFP4),
    .page_sizes = mha_page_sizes,
    .num_page_sizes = sizeof mha_page_sizes / sizeof mha_page_sizes[0],
    .head_dims = mha_head_dims,
    .num_head_dims = sizeof mha_head_dims / sizeof mha_head_dims[0],
    /* extend: 1..8 new tokens per sequence on the decode kernel; longer ones (prefill) on the
     * kit's prefill kernel where it serves the model (docs/ARCHITECTURE.md, trtllm_mha) */
    .phases = AP_PHASE_EXTEND | AP_PHASE_DECODE,
    .cuda_graph = AP_GRAPH_DECODE_ONLY,
    .features = AP_FEATURE_LSE | AP_FEATURE_SPLIT_KV,
    .needs_host_mirrors = 0,
    .hooks = mha_hooks,
    .num_hooks = sizeof mha_hooks / sizeof mha_hooks[0],
};

/* ---- the instance -------------------------------------------------------------------------- */

static void mha_destroy(ap_backend *b) {
    if (b == NULL) return;
    if (ap_kit_set_device(b->device_ordinal, MHA_NAME, NULL) == AP_OK) {
        ap_kit_device_free(b->partial_out);
        ap_kit_device_free(b->partial_lse);
        ap_kit_device_free(b->slots);
        ap_kit_plan_buffer_free(&b->prefill_buffer);
        ap_kit_nvfp4_stager_free(&b->stage);
    }
    free(b);
}

/* Everything a forward needs, sized at create for the model's max_batch / max_tokens: the
 * split-KV partial states (a split batch has at most MHA_SPLIT_WAVES waves of CTAs of 64 rows),
 * the new tokens' slots and the prefill work list. */
static ap_status mha_alloc_workspace(ap_backend *b, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    int32_t per_sm = 1;
    const int32_t group = m->num_qo_heads / m->num_kv_heads; /* a decode's rows */
    const int32_t kw = mha_decode_key_warps(group, 1, m->head_dim_qk);
    const int32_t keys_m = mha_decode_keys_m_for(
        b->keys_m, mha_decode_heads_per_cta(m->kv_dtype, m->head_dim_qk, group, 1, m->num_kv_heads,
                                            b->keys_m));
    int32_t per_sm_flat = 0;
    ap_status st = mha_decode_ctas_per_sm(m->head_dim_qk, m->dtype, m->kv_dtype, kw, group, keys_m,
                                          0, &per_sm, msg);
    if (st == AP_OK && b->schedule == MHA_SCHEDULE_FLAT)
        st = mha_decode_ctas_per_sm(m->head_dim_qk, m->dtype, m->kv_dtype, kw, group, keys_m, 1,
                                    &per_sm_flat, msg);
    if (st != AP_OK) return st;
    b->wave_slots = per_sm * b->sm_count;
    b->flat_slots = per_sm_flat * b->sm_count;
    /* partial slots: the split grid's MHA_SPLIT_WAVES waves, the flat schedule's 2 per CTA */
    size_t slots = (size_t)MHA_SPLIT_WAVES * (size_t)b->wave_slots;
    if ((size_t)2 * (size_t)b->flat_slots > slots) slots = (size_t)2 * (size_t)b->flat_slots;
    const size_t rows = slots * MHA_BLOCK_ROWS;
    st = ap_kit_device_alloc(rows * (size_t)m->head_dim_qk * sizeof(float),
                             (void **)&b->partial_out, MHA_NAME, msg);
    if (st == AP_OK)
        st = ap_kit_device_alloc(rows * sizeof(float), (void **)&b->partial_lse, MHA_NAME, msg);
    if (st == AP_OK)
        st = ap_kit_device_alloc((size_t)m->max_tokens * sizeof(int32_t), (void **)&b->slots,
                                 MHA_NAME, msg);
    if (st == AP_OK && mha_prefill_served(m)) {
        size_t bytes = ap_kit_prefill_plan_bytes(m->max_tokens, m->max_batch, m->head_dim_qk,
                                                 m->head_dim_v, m->num_qo_heads, m->num_kv_heads);
        if (bytes > 0) st = ap_kit_plan_buffer_alloc(&b->prefill_buffer, bytes, MHA_NAME, msg);
    }
    return st;
}

static ap_status mha_create(const ap_model *model, const ap_options *options,
                            const ap_device *device, ap_backend **out, ap_msgbuf *msg) {
    ap_status st = AP_OK;
    ap_backend *b = ap_plugin_create_begin(mha_validate, model, options, device, out, sizeof *b,
                                           offsetof(ap_backend, model), MHA_NAME, msg, &st);
    if (b == NULL) return st;
    b->device_ordinal = device->ordinal;
    b->sm_count = device->sm_count;
    b->split_kv = mha_option_auto(options, "split_kv");
    b->keys_m = mha_option_keys_m(options);
    b->schedule = mha_option_schedule(options);
    b->short_extend = mha_option_short_extend(options);
    st = ap_kit_set_device(device->ordinal, MHA_NAME, msg);
    if (st == AP_OK) st = mha_decode_setup(msg);
    if (st == AP_OK) st = mha_alloc_workspace(b, msg);
    if (st != AP_OK) {
        mha_destroy(b);
        return st;
    }
    *out = b;
    return AP_OK;
}

/* The kit's NHD spec (nvfp4: one e4m3 scale per 16 values, plugin_api.h's layout). */
static ap_status mha_get_kv_spec(ap_backend *b, ap_kv_spec *out, ap_msgbuf *msg) {
    if (b == NULL) {
        ap_msgbuf_add(msg, MHA_NAME ": get_kv_spec needs an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    return ap_kit_kv_spec_nhd(&b->model, 256, out, MHA_NAME, msg);
}

static void *mha_get_hook(ap_backend *b, const char *name) {
    (void)b;
    if (name == NULL) return NULL;
    if (strcmp(name, AP_HOOK_APPEND_KV_V1) == 0) return (void *)mha_hook_append_kv;
    if (strcmp(name, AP_HOOK_CUDA_GRAPH_V1) == 0) return (void *)mha_hook_cuda_graph;
    return NULL;
}

static const ap_vtable mha_vtable = {
    .struct_size = sizeof(ap_vtable),
    .validate = mha_validate,
    .create = mha_create,
    .destroy = mha_destroy,
    .get_kv_spec = mha_get_kv_spec,
    .init_metadata = mha_init_metadata,
    .forward_extend = mha_forward_extend,
    .forward_decode = mha_forward_decode,
    .get_hook = mha_get_hook,
};

static const ap_descriptor mha_descriptor = {
    .struct_size = sizeof(ap_descriptor),
    .name = MHA_NAME,
    .version = MHA_VERSION,
    .description = "decode-first GQA (groups 1..32, MTP 1..8) over paged bf16/f16/fp8/nvfp4 "
                   "caches, planned on the device, CUDA-graph capturable decode",
    .caps = &mha_caps,
    .vtable = &mha_vtable,
};

/* The caps' arch table is the build's target list, parsed once by the kit. */
static const ap_descriptor *mha_descriptor_ready(void) {
    mha_caps.num_archs = ap_kit_cuda_archs(&mha_caps.archs);
    return &mha_descriptor;
}

AP_PLUGIN_DEFINE(mha_descriptor_ready())
