/* plugin.c: flashinfer_like's entry: negotiation, caps, and the instance's life (create, destroy). */
#include <pthread.h>
#include <stdlib.h>

#include "glue.h"

#define FIL_VERSION "0.1.0"

#ifndef AP_CUDA_ARCHS
#error "AP_CUDA_ARCHS (the build's GPU targets, e.g. \"90a\") must be defined by the build"
#endif

/* ---- capabilities -------------------------------------------------------------------------- */

#define FIL_MAX_ARCHS 16
static ap_arch_target fil_archs[FIL_MAX_ARCHS];
static size_t fil_num_archs;
static pthread_once_t fil_archs_once = PTHREAD_ONCE_INIT;

/* The build's targets, "90a,90,ptx90", as caps: "90a" is sm_90a SASS, "90" sm_90 SASS and
 * "ptx90" compute_90 PTX; the same spelling meson's cuda-archs option turns into -gencode. */
static void fil_archs_parse(void) {
    const char *p = AP_CUDA_ARCHS;
    while (*p != '\0' && fil_num_archs < FIL_MAX_ARCHS) {
        ap_arch_kind kind = AP_ARCH_SASS;
        if (strncmp(p, "ptx", 3) == 0) {
            kind = AP_ARCH_PTX;
            p += 3;
        }
        int sm = 0;
        while (*p >= '0' && *p <= '9') sm = sm * 10 + (*p++ - '0');
        if (*p == 'a') {
            kind = AP_ARCH_SASS_SPECIFIC;
            p++;
        }
        if (sm > 0) fil_archs[fil_num_archs++] = (ap_arch_target){sm, kind};
        while (*p != '\0' && *p != ',') p++; /* skip anything unknown up to the next entry */
        if (*p == ',') p++;
    }
}

static const int32_t fil_page_sizes[] = {1, 2, 4, 8, 16, 32, 64, 128};
static const int32_t fil_head_dims[] = {64, 128, 256};

static ap_caps fil_caps = {
    .struct_size = sizeof(ap_caps),
    .device_kinds = AP_DEVICE_KIND_CUDA,
    .archs = fil_archs,
    .num_archs = 0, /* set at negotiation from AP_CUDA_ARCHS */
    .attn_kinds = AP_ATTN_BIT(AP_ATTN_MHA),
    .q_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16),
    .kv_dtypes =
        AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16) | AP_DTYPE_BIT(AP_DTYPE_FP8_E4M3),
    .page_sizes = fil_page_sizes,
    .num_page_sizes = sizeof fil_page_sizes / sizeof fil_page_sizes[0],
    .head_dims = fil_head_dims,
    .num_head_dims = sizeof fil_head_dims / sizeof fil_head_dims[0],
    .phases = AP_PHASE_EXTEND | AP_PHASE_DECODE,
    .cuda_graph = AP_GRAPH_NONE,
    .features = AP_FEATURE_LSE | AP_FEATURE_SPLIT_KV | AP_FEATURE_NONCAUSAL,
    .needs_host_mirrors = 1,
};

/* ---- the instance -------------------------------------------------------------------------- */

static void fil_destroy(ap_backend *b) {
    if (b == NULL) return;
    if (fil_rt_set_device(b->device_ordinal, NULL) == AP_OK && b->plan_copied != NULL)
        fil_rt_event_wait(b->plan_copied, NULL); /* no copy may still read plan_host */
    fil_rt_event_destroy(b->plan_copied);
    fil_rt_pinned_free(b->plan_host);
    fil_rt_device_free(b->plan_dev);
    fil_rt_device_free(b->partial_out);
    fil_rt_device_free(b->partial_lse);
    fil_rt_device_free(b->extend_dev);
    free(b->extend_host);
    free(b);
}

/* Everything the largest batch needs, allocated once: the plan buffers (host pinned + device),
 * decode's partial states (at most two per worker, see plan.c) and extend's plan buffers. */
static ap_status fil_alloc_workspace(ap_backend *b, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    b->plan_bytes = fil_plan_capacity(m, b->max_workers);
    ap_status st = fil_rt_pinned_alloc(b->plan_bytes, &b->plan_host, msg);
    if (st == AP_OK) st = fil_rt_device_alloc(b->plan_bytes, &b->plan_dev, msg);
    if (st == AP_OK) st = fil_rt_event_create(&b->plan_copied, msg);
    size_t partials = 2 * (size_t)b->max_workers * (size_t)b->group;
    if (st == AP_OK)
        st = fil_rt_device_alloc(partials * (size_t)m->head_dim_qk * sizeof(float),
                                 (void **)&b->partial_out, msg);
    if (st == AP_OK)
        st = fil_rt_device_alloc(partials * sizeof(float), (void **)&b->partial_lse, msg);
    if (st != AP_OK) return st;
    b->extend_bytes = fil_extend_plan_bytes(m->max_tokens, m->max_batch, m->head_dim_qk,
                                            m->num_qo_heads, m->num_kv_heads);
    if (b->extend_bytes == 0) {
        ap_msgbuf_add(msg, FIL_NAME ": extend cannot plan for this model");
        return AP_ERR_UNSUPPORTED;
    }
    b->extend_host = malloc(b->extend_bytes);
    if (b->extend_host == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": out of host memory (%zu bytes)", b->extend_bytes);
        return AP_ERR_OUT_OF_MEMORY;
    }
    return fil_rt_device_alloc(b->extend_bytes, &b->extend_dev, msg);
}

static ap_status fil_create(const ap_model *model, const ap_options *options,
                            const ap_device *device, ap_backend **out, ap_msgbuf *msg) {
    if (out == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": create needs somewhere to put the instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    /* a third-party core may skip validate(): never build an instance it would refuse */
    ap_status st = fil_validate(model, options, device, msg);
    if (st != AP_OK) return st;
    ap_backend *b = calloc(1, sizeof *b);
    if (b == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": out of host memory");
        return AP_ERR_OUT_OF_MEMORY;
    }
    memcpy(&b->model, model, sizeof b->model);
    b->model.struct_size = sizeof b->model;
    b->model.name = NULL; /* the caller's string may not outlive this call */
    b->device_ordinal = device->ordinal;
    b->group = model->num_qo_heads / model->num_kv_heads;
    b->split_kv = fil_option_split_kv(options);
    st = fil_rt_set_device(device->ordinal, msg);
    if (st == AP_OK)
        st = fil_decode_max_workers(model->head_dim_qk, model->dtype, model->kv_dtype,
                                    device->sm_count, &b->max_workers, msg);
    if (st == AP_OK) {
        int64_t target = (int64_t)fil_option_warps_per_sm(options) * device->sm_count;
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

/* One page: page_size tokens x num_kv_heads x head_dim elements, for K and for V; 256-byte
 * aligned bases keep every 16-byte row chunk aligned. */
static ap_status fil_get_kv_spec(ap_backend *b, ap_kv_spec *out, ap_msgbuf *msg) {
    if (b == NULL || out == NULL || out->struct_size < sizeof(ap_kv_spec)) {
        ap_msgbuf_add(msg, FIL_NAME ": get_kv_spec needs an instance and an ap_kv_spec with "
                                    "struct_size set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_model *m = &b->model;
    size_t elem = m->kv_dtype == AP_DTYPE_FP8_E4M3 ? 1 : 2;
    size_t per_page = (size_t)m->page_size * (size_t)m->num_kv_heads * elem;
    out->k_bytes_per_page = per_page * (size_t)m->head_dim_qk;
    out->v_bytes_per_page = per_page * (size_t)m->head_dim_v;
    out->scale_bytes_per_page = 0;
    out->alignment = 256;
    return AP_OK;
}

static ap_status fil_init_metadata(ap_backend *b, const ap_batch *batch, void *stream,
                                   ap_msgbuf *msg) {
    if (b == NULL || batch == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": init_metadata needs an instance and a batch");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st = fil_rt_set_device(b->device_ordinal, msg);
    if (st != AP_OK) return st;
    return fil_plan_batch(b, batch, stream, msg);
}

/* append_kv/1 (fused RoPE + quantize + paged append, append_rope.cu); cuda_graph/1 is absent,
 * so hosts that want graphs take their unfused paths. */
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
    .description = "paged attention on tensor cores: split-KV decode, extend, bf16/f16/fp8 KV",
    .caps = &fil_caps,
    .vtable = &fil_vtable,
};

/* The caps' arch list is parsed from the build's AP_CUDA_ARCHS once, at the first negotiation. */
static const ap_descriptor *fil_descriptor_ready(void) {
    pthread_once(&fil_archs_once, fil_archs_parse);
    fil_caps.num_archs = fil_num_archs;
    return &fil_descriptor;
}

AP_PLUGIN_DEFINE(fil_descriptor_ready())
