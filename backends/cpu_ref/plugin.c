/* plugin.c: cpu_ref's entry: negotiation, descriptor, caps and the vtable's lifecycle entries. */
#include <stdlib.h>

#include "cpu_ref.h"

#define CPU_REF_VERSION "0.1.0"

static ap_status cpu_create(const ap_model *model, const ap_options *options,
                            const ap_device *device, ap_backend **out, ap_msgbuf *msg) {
    ap_status status = AP_OK;
    ap_backend *backend =
        ap_plugin_create_begin(cpu_validate, model, options, device, out, sizeof *backend,
                               offsetof(ap_backend, model), "cpu_ref", msg, &status);
    if (backend == NULL) return status;
    *out = backend;
    return AP_OK;
}

static void cpu_destroy(ap_backend *backend) {
    if (backend == NULL) return;
    cpu_plan_free(&backend->plan);
    free(backend);
}

/* One page holds page_size tokens x num_kv_heads heads x head_dim elements, for K and for V;
 * nvfp4 packs two per byte and adds one scale byte per 16 (one size for K and V: the wider).
 * MLA: one latent row of head_dim_qk per token, no V pages. */
static ap_status cpu_get_kv_spec(ap_backend *backend, ap_kv_spec *out, ap_msgbuf *msg) {
    if (backend == NULL || out == NULL || out->struct_size < sizeof(ap_kv_spec)) {
        ap_msgbuf_add(msg, "cpu_ref: get_kv_spec needs an instance and an ap_kv_spec with "
                           "struct_size set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_model *m = &backend->model;
    int mla = m->kind == AP_ATTN_MLA;
    size_t rows, k_count, v_count;
    /* An absurd model must not wrap to a small (or zero) page the host then overruns; a count
     * up to SIZE_MAX / 4 leaves room for any element size (cpu_kv_bytes). */
    if (__builtin_mul_overflow((size_t)m->page_size, (size_t)m->num_kv_heads, &rows) ||
        __builtin_mul_overflow(rows, (size_t)m->head_dim_qk, &k_count) ||
        __builtin_mul_overflow(rows, (size_t)m->head_dim_v, &v_count) || k_count > SIZE_MAX / 4 ||
        v_count > SIZE_MAX / 4) {
        ap_msgbuf_add(msg,
                      "cpu_ref: a KV page of %d tokens x %d KV heads x head dims %d/%d does not "
                      "fit in size_t bytes",
                      m->page_size, m->num_kv_heads, m->head_dim_qk, m->head_dim_v);
        return AP_ERR_INVALID_ARGUMENT;
    }
    size_t widest = k_count > v_count ? k_count : v_count;
    out->k_bytes_per_page = cpu_kv_bytes(m->kv_dtype, k_count);
    /* MLA: V is the first kv_lora_rank values of the latent row in the K pages */
    out->v_bytes_per_page = mla ? 0 : cpu_kv_bytes(m->kv_dtype, v_count);
    out->scale_bytes_per_page = m->kv_dtype == AP_DTYPE_NVFP4 ? widest / 16 : 0;
    out->alignment = 64;
    return AP_OK;
}

static ap_status cpu_init_metadata(ap_backend *backend, const ap_batch *batch, void *stream,
                                   ap_msgbuf *msg) {
    (void)stream;
    if (backend == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: init_metadata without an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    return cpu_plan_init(backend, batch, msg);
}

static ap_status cpu_forward_extend(ap_backend *backend, const ap_layer *layer,
                                    const ap_forward_args *args, void *stream, ap_msgbuf *msg) {
    (void)stream;
    if (backend == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: forward_extend without an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    return cpu_forward(backend, layer, args, AP_MODE_EXTEND, msg);
}

static ap_status cpu_forward_decode(ap_backend *backend, const ap_layer *layer,
                                    const ap_forward_args *args, void *stream, ap_msgbuf *msg) {
    (void)stream;
    if (backend == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: forward_decode without an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    return cpu_forward(backend, layer, args, AP_MODE_DECODE, msg);
}

/* append_kv/1, pack_prefix_chunk_kv/1 and merge_state/1; no cuda_graph/1 (nothing to capture
 * on the CPU). */
static void *cpu_get_hook(ap_backend *backend, const char *name) {
    (void)backend;
    if (name == NULL) return NULL;
    if (strcmp(name, AP_HOOK_APPEND_KV_V1) == 0) return (void *)cpu_hook_append_kv;
    if (strcmp(name, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1) == 0)
        return (void *)cpu_hook_pack_prefix_chunk_kv;
    if (strcmp(name, AP_HOOK_MERGE_STATE_V1) == 0) return (void *)cpu_hook_merge_state;
    return NULL;
}

/* The hooks get_hook answers, declared in the caps for listing. */
static const char *const cpu_hooks[] = {AP_HOOK_APPEND_KV_V1, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1,
                                        AP_HOOK_MERGE_STATE_V1};

static const ap_caps cpu_caps = {
    .struct_size = sizeof(ap_caps),
    .device_kinds = AP_DEVICE_KIND_CPU,
    .archs = NULL,
    .num_archs = 0,
    .attn_kinds = AP_ATTN_BIT(AP_ATTN_MHA) | AP_ATTN_BIT(AP_ATTN_MLA),
    .q_dtypes = CPU_Q_DTYPES,
    .kv_dtypes = CPU_KV_DTYPES,
    .page_sizes = NULL, /* any */
    .num_page_sizes = 0,
    .head_dims = NULL, /* any */
    .num_head_dims = 0,
    .phases = AP_PHASE_EXTEND | AP_PHASE_DECODE,
    .cuda_graph = AP_GRAPH_NONE,
    .features = AP_FEATURE_LSE | AP_FEATURE_NONCAUSAL | AP_FEATURE_LOGIT_SOFTCAP |
                AP_FEATURE_SLIDING_WINDOW | AP_FEATURE_EMBEDDING_SKIP_KV,
    .needs_host_mirrors = 1,
    .hooks = cpu_hooks,
    .num_hooks = sizeof cpu_hooks / sizeof cpu_hooks[0],
};

static const ap_vtable cpu_vtable = {
    .struct_size = sizeof(ap_vtable),
    .validate = cpu_validate,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .get_kv_spec = cpu_get_kv_spec,
    .init_metadata = cpu_init_metadata,
    .forward_extend = cpu_forward_extend,
    .forward_decode = cpu_forward_decode,
    .get_hook = cpu_get_hook,
};

static const ap_descriptor cpu_descriptor = {
    .struct_size = sizeof(ap_descriptor),
    .name = "cpu_ref",
    .version = CPU_REF_VERSION,
    .description = "plain C reference attention (MHA/GQA and MLA, paged bf16/f16/fp8/nvfp4 KV), "
                   "the oracle of the GPU backends",
    .caps = &cpu_caps,
    .vtable = &cpu_vtable,
};

AP_PLUGIN_DEFINE(&cpu_descriptor)
