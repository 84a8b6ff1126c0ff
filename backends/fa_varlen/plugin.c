/* plugin.c: fa_varlen's entry: caps, descriptor, the instance's life and its KV spec. */
#include <stdlib.h>

#include "fav.h"

#define FAV_VERSION "0.1.0"

static const int32_t fav_head_dims[] = {64, 128, 256};

static ap_caps fav_caps = {
    .struct_size = sizeof(ap_caps),
    .device_kinds = AP_DEVICE_KIND_CUDA,
    .archs = NULL, /* the build's targets, set at negotiation (ap_kit_cuda_archs) */
    .num_archs = 0,
    .attn_kinds = AP_ATTN_BIT(AP_ATTN_MHA),
    .q_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16),
    .kv_dtypes =
        AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16) | AP_DTYPE_BIT(AP_DTYPE_FP8_E4M3),
    .page_sizes = NULL, /* any page size >= 1: the kernel finds a page by shift or division */
    .num_page_sizes = 0,
    .head_dims = fav_head_dims,
    .num_head_dims = sizeof fav_head_dims / sizeof fav_head_dims[0],
    /* decode is an extend of one token per sequence on the same kernel (docs/ARCHITECTURE.md,
     * "fa_varlen") */
    .phases = AP_PHASE_EXTEND | AP_PHASE_DECODE,
    .cuda_graph = AP_GRAPH_NONE,
    .features = AP_FEATURE_LSE | AP_FEATURE_EMBEDDING_SKIP_KV | AP_FEATURE_NONCAUSAL,
    .needs_host_mirrors = 1,
    .hooks = NULL,
    .num_hooks = 0,
};

static void fav_destroy(ap_backend *b) {
    if (b == NULL) return;
    if (ap_kit_set_device(b->device_ordinal, FAV_NAME, NULL) == AP_OK) {
        ap_kit_plan_buffer_free(&b->buffer);
        ap_kit_nvfp4_stager_free(&b->stage);
    }
    free(b);
}

static ap_status fav_create(const ap_model *model, const ap_options *options,
                            const ap_device *device, ap_backend **out, ap_msgbuf *msg) {
    ap_status st = AP_OK;
    ap_backend *b = ap_plugin_create_begin(fav_validate, model, options, device, out, sizeof *b,
                                           offsetof(ap_backend, model), FAV_NAME, msg, &st);
    if (b == NULL) return st;
    b->device_ordinal = device->ordinal;
    b->kv_mode = fav_kv_mode_of(model, options);
    b->rounds = fav_option_rounds(options);
    b->item_bytes = fav_plan_item_bytes(&b->model);
    st = ap_kit_set_device(device->ordinal, FAV_NAME, msg);
    if (st == AP_OK)
        st = ap_kit_plan_buffer_alloc(&b->buffer, fav_plan_buffer_bytes(&b->model), FAV_NAME, msg);
    if (st != AP_OK) {
        fav_destroy(b);
        return st;
    }
    *out = b;
    return AP_OK;
}

/* The cached path: an NHD cache of the model's kv_dtype. Skip-KV: no cache at all (0 bytes). */
static ap_status fav_get_kv_spec(ap_backend *b, ap_kv_spec *out, ap_msgbuf *msg) {
    if (b == NULL || out == NULL || out->struct_size < sizeof(ap_kv_spec)) {
        ap_msgbuf_add(msg, FAV_NAME ": get_kv_spec needs an instance and an ap_kv_spec with "
                                    "struct_size set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (b->kv_mode == FAV_KV_SKIP) {
        out->k_bytes_per_page = out->v_bytes_per_page = out->scale_bytes_per_page = 0;
        out->alignment = 16;
        return AP_OK;
    }
    return ap_kit_kv_spec_nhd(&b->model, 256, out, FAV_NAME, msg);
}

static void *fav_get_hook(ap_backend *b, const char *name) {
    (void)b, (void)name;
    return NULL;
}

static const ap_vtable fav_vtable = {
    .struct_size = sizeof(ap_vtable),
    .validate = fav_validate,
    .create = fav_create,
    .destroy = fav_destroy,
    .get_kv_spec = fav_get_kv_spec,
    .init_metadata = fav_init_metadata,
    .forward_extend = fav_forward_extend,
    .forward_decode = fav_forward_decode,
    .get_hook = fav_get_hook,
};

static const ap_descriptor fav_descriptor = {
    .struct_size = sizeof(ap_descriptor),
    .name = FAV_NAME,
    .version = FAV_VERSION,
    .description = "varlen prefill over ragged k/v or a paged prefix, causal or not, GQA, LSE; "
                   "embedding mode without a KV cache",
    .caps = &fav_caps,
    .vtable = &fav_vtable,
};

/* The caps' arch table is the build's target list, parsed once by the kit. */
static const ap_descriptor *fav_descriptor_ready(void) {
    fav_caps.num_archs = ap_kit_cuda_archs(&fav_caps.archs);
    return &fav_descriptor;
}

AP_PLUGIN_DEFINE(fav_descriptor_ready())
