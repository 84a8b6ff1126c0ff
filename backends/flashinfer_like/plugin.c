/* plugin.c: flashinfer_like's entry: negotiation, caps, and the instance's life (create, destroy). */
#include <stdlib.h>

#include "glue.h"

#define FIL_VERSION "0.1.0"

/* ---- capabilities -------------------------------------------------------------------------- */

static const int32_t fil_page_sizes[] = {FIL_PAGE_SIZES};
static const int32_t fil_head_dims[] = {FIL_HEAD_DIMS};

/* The hooks get_hook answers, declared in the caps for listing. */
static const char *const fil_hooks[] = {AP_HOOK_APPEND_KV_V1};

static ap_caps fil_caps = {
    .struct_size = sizeof(ap_caps),
    .device_kinds = AP_DEVICE_KIND_CUDA,
    .archs = NULL, /* the build's targets, set at negotiation (ap_kit_cuda_archs) */
    .num_archs = 0,
    .attn_kinds = AP_ATTN_BIT(AP_ATTN_MHA),
    .q_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16),
    .kv_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16) |
                 AP_DTYPE_BIT(AP_DTYPE_FP8_E4M3) | AP_DTYPE_BIT(AP_DTYPE_NVFP4),
    .page_sizes = fil_page_sizes,
    .num_page_sizes = sizeof fil_page_sizes / sizeof fil_page_sizes[0],
    .head_dims = fil_head_dims,
    .num_head_dims = sizeof fil_head_dims / sizeof fil_head_dims[0],
    .phases = AP_PHASE_EXTEND | AP_PHASE_DECODE,
    .cuda_graph = AP_GRAPH_NONE,
    .features = AP_FEATURE_LSE | AP_FEATURE_SPLIT_KV | AP_FEATURE_NONCAUSAL,
    .needs_host_mirrors = 1,
    .hooks = fil_hooks,
    .num_hooks = sizeof fil_hooks / sizeof fil_hooks[0],
};

/* ---- the instance -------------------------------------------------------------------------- */

static void fil_destroy(ap_backend *b) {
    if (b == NULL) return;
    ap_kit_set_device(b->device_ordinal, FIL_NAME, NULL); /* the frees act on our device */
    ap_kit_plan_buffer_free(&b->plan_buffer);
    ap_kit_device_free(b->partial_out);
    ap_kit_device_free(b->partial_lse);
    fil_extend_nvfp4_free(b);
    free(b);
}

/* Everything the largest batch needs, allocated once: the plan buffer (host pinned + device:
 * decode's split, the append slots, extend's work items) and decode's partial states (at most
 * two per worker, see plan.c). */
static ap_status fil_alloc_workspace(ap_backend *b, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    if (fil_extend_plan_bytes(m->max_tokens, m->max_batch, m->head_dim_qk, m->num_qo_heads,
                              m->num_kv_heads) == 0) {
        ap_msgbuf_add(msg, FIL_NAME ": extend cannot plan for this model");
        return AP_ERR_UNSUPPORTED;
    }
    ap_status st = ap_kit_plan_buffer_alloc(&b->plan_buffer, fil_plan_capacity(m, b->max_workers),
                                            FIL_NAME, msg);
    size_t partials = 2 * (size_t)b->max_workers * (size_t)b->group;
    if (st == AP_OK)
        st = ap_kit_device_alloc(partials * (size_t)m->head_dim_qk * sizeof(float),
                                 (void **)&b->partial_out, FIL_NAME, msg);
    if (st == AP_OK)
        st = ap_kit_device_alloc(partials * sizeof(float), (void **)&b->partial_lse, FIL_NAME, msg);
    return st;
}

static ap_status fil_create(const ap_model *model, const ap_options *options,
                            const ap_device *device, ap_backend **out, ap_msgbuf *msg) {
    ap_status st = AP_OK;
    ap_backend *b = ap_plugin_create_begin(fil_validate, model, options, device, out, sizeof *b,
                                           offsetof(ap_backend, model), FIL_NAME, msg, &st);
    if (b == NULL) return st;
    b->device_ordinal = device->ordinal;
    b->group = model->num_qo_heads / model->num_kv_heads;
    b->split_kv = fil_option_split_kv(options);
    st = ap_kit_set_device(device->ordinal, FIL_NAME, msg);
    if (st == AP_OK)
        st = fil_decode_max_workers(model->head_dim_qk, model->dtype, model->kv_dtype,
                                    device->sm_count, &b->max_workers, msg);
    if (st == AP_OK) {
        int64_t target =
            (int64_t)fil_option_warps_per_sm(options, model->kv_dtype) * device->sm_count;
        b->target_workers = target < b->max_workers ? (int32_t)target : b->max_workers;
        st = fil_alloc_workspace(b, msg);
    }
    if (st != AP_OK) {
        fil_destroy(b);
        return st;
    }
    *out = b;
    return AP_OK;
}

/* An NHD page of K and of V; 256-byte aligned bases keep every 16-byte row chunk aligned. */
static ap_status fil_get_kv_spec(ap_backend *b, ap_kv_spec *out, ap_msgbuf *msg) {
    if (b == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": get_kv_spec without an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    return ap_kit_kv_spec_nhd(&b->model, 256, out, FIL_NAME, msg);
}

static ap_status fil_init_metadata(ap_backend *b, const ap_batch *batch, void *stream,
                                   ap_msgbuf *msg) {
    if (b == NULL || batch == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": init_metadata needs an instance and a batch");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st = ap_kit_set_device(b->device_ordinal, FIL_NAME, msg);
    if (st != AP_OK) return st;
    return fil_plan_batch(b, batch, stream, msg);
}

/* append_kv/1 (fused RoPE + quantize + paged append, the kit's append_rope.cu); cuda_graph/1 is
 * absent, so hosts that want graphs take their unfused paths. */
static void *fil_get_hook(ap_backend *b, const char *name) {
    (void)b;
    if (name != NULL && strcmp(name, AP_HOOK_APPEND_KV_V1) == 0) return (void *)fil_append_kv;
    return NULL;
}

static const ap_vtable fil_vtable = {
    .struct_size = sizeof(ap_vtable),
    .validate = fil_validate,
    .create = fil_create,
    .destroy = fil_destroy,
    .get_kv_spec = fil_get_kv_spec,
    .init_metadata = fil_init_metadata,
    .forward_extend = fil_forward_extend,
    .forward_decode = fil_forward_decode,
    .get_hook = fil_get_hook,
};

static const ap_descriptor fil_descriptor = {
    .struct_size = sizeof(ap_descriptor),
    .name = FIL_NAME,
    .version = FIL_VERSION,
    .description =
        "paged attention on tensor cores: split-KV decode, extend, bf16/f16/fp8/nvfp4 KV",
    .caps = &fil_caps,
    .vtable = &fil_vtable,
};

/* The caps' arch table is the build's target list, parsed once by the kit. */
static const ap_descriptor *fil_descriptor_ready(void) {
    fil_caps.num_archs = ap_kit_cuda_archs(&fil_caps.archs);
    return &fil_descriptor;
}

AP_PLUGIN_DEFINE(fil_descriptor_ready())
