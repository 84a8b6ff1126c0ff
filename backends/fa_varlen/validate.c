/* validate.c: may fa_varlen serve this model here? Every reason it cannot; no allocation. */
#include "fav.h"

static void fav_validate_shape(const ap_model *m, ap_msgbuf *reasons, int *refused) {
    if (m->kind != AP_ATTN_MHA) {
        *refused = 1;
        ap_msgbuf_add(reasons, FAV_NAME ": attention kind %s is not served (MHA, GQA, MQA only)",
                      m->kind == AP_ATTN_MLA ? "MLA" : "unknown");
    }
    if (m->head_dim_qk != m->head_dim_v || !fav_head_dim_served(m->head_dim_qk)) {
        *refused = 1;
        ap_msgbuf_add(reasons, FAV_NAME ": head dims qk %d / v %d are not " FAV_HEAD_DIMS_TEXT,
                      m->head_dim_qk, m->head_dim_v);
    }
    if (m->num_qo_heads <= 0 || m->num_kv_heads <= 0 || m->num_qo_heads % m->num_kv_heads != 0) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      FAV_NAME ": %d query heads over %d KV heads: both must be > 0 and the KV "
                               "heads must divide the query heads",
                      m->num_qo_heads, m->num_kv_heads);
    } else if (m->num_qo_heads / m->num_kv_heads > FAV_MAX_GROUP) {
        *refused = 1;
        ap_msgbuf_add(reasons, FAV_NAME ": GQA group of %d query heads per KV head (1..%d served)",
                      m->num_qo_heads / m->num_kv_heads, FAV_MAX_GROUP);
    }
    if (ap_kit_model_limits_refuse(m, 20, 24, FAV_NAME, reasons)) *refused = 1;
}

static void fav_validate_dtypes(const ap_model *m, ap_msgbuf *reasons, int *refused) {
    if (m->dtype != AP_DTYPE_BF16 && m->dtype != AP_DTYPE_F16) {
        *refused = 1;
        ap_msgbuf_add(reasons, FAV_NAME ": query dtype %s is not bf16 or f16",
                      ap_dtype_str(m->dtype));
    }
    if (m->kv_dtype != m->dtype && m->kv_dtype != AP_DTYPE_FP8_E4M3) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      FAV_NAME ": KV cache dtype %s is neither the query dtype (%s) nor "
                               "fp8_e4m3",
                      ap_dtype_str(m->kv_dtype), ap_dtype_str(m->dtype));
    }
}

static fav_skip_option fav_option_skip(const ap_options *options) {
    const char *value = ap_kit_option(options, "embedding_skip_kv");
    if (value != NULL && strcmp(value, "on") == 0) return FAV_SKIP_ON;
    if (value != NULL && strcmp(value, "off") == 0) return FAV_SKIP_OFF;
    return FAV_SKIP_AUTO;
}

/* Prefix caching is off only when the config says so (unset means on). */
static int fav_prefix_cache_off(const ap_options *options) {
    return options != NULL && options->struct_size >= sizeof(ap_options) &&
           options->prefix_cache == 0;
}

/* Skip-KV needs an embedding model (it never decodes, so nothing reads the cache later) and
 * prefix caching off (a shared prefix would be read from a cache that was never written). */
fav_kv_mode fav_kv_mode_of(const ap_model *model, const ap_options *options) {
    const fav_skip_option skip = fav_option_skip(options);
    return skip != FAV_SKIP_OFF && model->embedding && fav_prefix_cache_off(options)
               ? FAV_KV_SKIP
               : FAV_KV_CACHED;
}

/* The `fa_varlen.schedule` option: 1 for rounds (the Hopper kernel's static schedule), else 0
 * (dynamic, where the kernel has it). */
int fav_option_rounds(const ap_options *options) {
    const char *value = ap_kit_option(options, "schedule");
    return value != NULL && strcmp(value, "rounds") == 0;
}

/* Backend options:
 *   embedding_skip_kv: auto | on | off   auto: skip the cache for an embedding model with prefix
 *                                        caching off; on: the same, refused where it cannot
 *                                        hold; off: always the cached path
 *   schedule: dynamic | rounds           dynamic (the default): the Hopper prefill's
 *                                        persistent CTAs take a packed batch's work tiles from
 *                                        a counter (prefill_hopper.cuh, use_dynamic); rounds:
 *                                        always in rounds fixed in advance (a measurement knob)
 * cuda_graphs is refused: the plan reads the host mirrors. */
static void fav_validate_options(const ap_model *m, const ap_options *options, ap_msgbuf *reasons,
                                 int *refused) {
    if (options == NULL) return;
    if (options->struct_size < sizeof(ap_options)) {
        *refused = 1;
        ap_msgbuf_add(reasons, FAV_NAME ": ap_options struct_size %zu < %zu", options->struct_size,
                      sizeof(ap_options));
        return;
    }
    if (options->cuda_graphs == 1) {
        *refused = 1;
        ap_msgbuf_add(reasons, FAV_NAME ": CUDA graphs are not supported (init_metadata reads the "
                                        "host mirrors)");
    }
    static const ap_kit_option_rule rules[] = {
        {"embedding_skip_kv", "auto|on|off", NULL, NULL},
        {"schedule", "dynamic|rounds", NULL, NULL},
    };
    if (ap_kit_options_refuse(options, rules, sizeof rules / sizeof rules[0], FAV_NAME, reasons))
        *refused = 1;
    if (fav_option_skip(options) != FAV_SKIP_ON) return;
    if (!m->embedding) {
        *refused = 1;
        ap_msgbuf_add(reasons, FAV_NAME ": embedding_skip_kv is on but the model is not an "
                                        "embedding model (its decode would read the cache)");
    }
    if (!fav_prefix_cache_off(options)) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      FAV_NAME ": embedding skip-KV needs prefix caching off (it is %s): "
                               "a shared prefix would be read from a cache never "
                               "written; the cached path serves with embedding_skip_kv "
                               "auto or off",
                      options->prefix_cache == 1 ? "on" : "unset, which means on");
    }
}

ap_status fav_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons) {
    ap_status readable = ap_kit_model_readable(model, FAV_NAME, reasons);
    if (readable != AP_OK) return readable;
    int refused = 0;
    fav_validate_shape(model, reasons, &refused);
    fav_validate_dtypes(model, reasons, &refused);
    if (ap_kit_device_refuses(device, 9, FAV_NAME, reasons)) refused = 1;
    fav_validate_options(model, options, reasons, &refused);
    return refused ? AP_ERR_REFUSED : AP_OK;
}
