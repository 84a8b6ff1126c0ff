/* validate.c: may flashinfer_like serve this model here? Every reason it cannot, no allocation. */
#include <stdlib.h>
#include <string.h>

#include "glue.h"

static void fil_validate_shape(const ap_model *m, ap_msgbuf *reasons, int *refused) {
    if (m->kind != AP_ATTN_MHA) {
        *refused = 1;
        ap_msgbuf_add(reasons, FIL_NAME ": attention kind %s is not served (MHA, GQA, MQA only)",
                      m->kind == AP_ATTN_MLA ? "MLA" : "unknown");
    }
    if (m->head_dim_qk != m->head_dim_v) {
        *refused = 1;
        ap_msgbuf_add(reasons, FIL_NAME ": qk head dim %d differs from v head dim %d",
                      m->head_dim_qk, m->head_dim_v);
    }
    if (!fil_head_dim_served(m->head_dim_qk)) {
        *refused = 1;
        ap_msgbuf_add(reasons, FIL_NAME ": head dim %d is not " FIL_HEAD_DIMS_TEXT, m->head_dim_qk);
    }
    if (m->num_qo_heads <= 0 || m->num_kv_heads <= 0 || m->num_qo_heads % m->num_kv_heads != 0) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      FIL_NAME ": %d query heads over %d KV heads: both must be > 0 and the KV "
                               "heads must divide the query heads",
                      m->num_qo_heads, m->num_kv_heads);
    } else if (m->num_qo_heads / m->num_kv_heads > FIL_MAX_GROUP) {
        *refused = 1;
        ap_msgbuf_add(reasons, FIL_NAME ": GQA group of %d query heads per KV head (1..%d served)",
                      m->num_qo_heads / m->num_kv_heads, FIL_MAX_GROUP);
    }
    if (!fil_page_size_served(m->page_size)) {
        *refused = 1;
        ap_msgbuf_add(reasons, FIL_NAME ": page size %d is not " FIL_PAGE_SIZES_TEXT, m->page_size);
    }
    if (ap_kit_model_limits_refuse(m, 20, 24, FIL_NAME, reasons)) *refused = 1;
}

static void fil_validate_dtypes(const ap_model *m, ap_msgbuf *reasons, int *refused) {
    if (m->dtype != AP_DTYPE_BF16 && m->dtype != AP_DTYPE_F16) {
        *refused = 1;
        ap_msgbuf_add(reasons, FIL_NAME ": query dtype %s is not bf16 or f16",
                      ap_dtype_str(m->dtype));
    }
    if (m->kv_dtype == AP_DTYPE_FP8_E4M3) return;
    /* nvfp4: decode reads it directly (decode.cu), extend stages it to 16 bits (extend_nvfp4.c) */
    if (m->kv_dtype == AP_DTYPE_NVFP4) return;
    if (m->kv_dtype == AP_DTYPE_BF16 || m->kv_dtype == AP_DTYPE_F16) {
        if (m->kv_dtype != m->dtype) {
            *refused = 1;
            ap_msgbuf_add(reasons,
                          FIL_NAME ": a 16-bit KV cache must have the query dtype (%s), "
                                   "not %s",
                          ap_dtype_str(m->dtype), ap_dtype_str(m->kv_dtype));
        }
        return;
    }
    *refused = 1;
    ap_msgbuf_add(reasons, FIL_NAME ": KV cache dtype %s is not bf16, f16, fp8_e4m3 or nvfp4",
                  ap_dtype_str(m->kv_dtype));
}

int fil_option_split_kv(const ap_options *options) {
    const char *value = ap_kit_option(options, "split_kv");
    return value == NULL || strcmp(value, "off") != 0;
}

/* decode_warps_per_sm: how many decode warps per SM the split aims for (1..16), default 4
 * (nvfp4: as many as fit):
 * measured on the H100, four warps of 24 KB of loads in flight each already saturate an SM's
 * share of HBM, and fewer, longer warps mean fewer partial states to merge. */
#define FIL_DEFAULT_WARPS_PER_SM 4

static int fil_parse_warps_per_sm(const char *value) {
    char *end = NULL;
    long n = value != NULL ? strtol(value, &end, 10) : 0;
    return value != NULL && end != value && *end == '\0' && n >= 1 && n <= 16 ? (int)n : 0;
}

static int fil_warps_per_sm_valid(const char *value) {
    return fil_parse_warps_per_sm(value) > 0;
}

static const ap_kit_option_rule fil_option_rules[] = {
    {"split_kv", "auto|off", NULL, NULL},
    {"decode_warps_per_sm", NULL, fil_warps_per_sm_valid, "1..16"},
};

int32_t fil_option_warps_per_sm(const ap_options *options, ap_dtype kv_dtype) {
    int n = fil_parse_warps_per_sm(ap_kit_option(options, "decode_warps_per_sm"));
    if (n > 0) return n;
    /* nvfp4: a warp's step is bound by decoding its stage, not by its loads: every resident
     * warp (the occupancy caps it) */
    return kv_dtype == AP_DTYPE_NVFP4 ? 16 : FIL_DEFAULT_WARPS_PER_SM;
}

/* Backend-specific options, the first two tuning knobs for measurements:
 *   split_kv: auto | off          off: one warp per (sequence, KV head), no merge
 *   decode_warps_per_sm: 1..16    the split's target, see above
 * Anything else is refused, since a typo must not pass silently. */
static void fil_validate_options(const ap_options *options, ap_msgbuf *reasons, int *refused) {
    if (options == NULL) return;
    if (options->struct_size < sizeof(ap_options)) {
        *refused = 1;
        ap_msgbuf_add(reasons, FIL_NAME ": ap_options struct_size %zu < %zu", options->struct_size,
                      sizeof(ap_options));
        return;
    }
    if (options->cuda_graphs == 1) {
        *refused = 1;
        ap_msgbuf_add(reasons, FIL_NAME ": CUDA graphs are not supported yet (init_metadata "
                                        "reads host mirrors)");
    }
    if (ap_kit_options_refuse(options, fil_option_rules,
                              sizeof fil_option_rules / sizeof fil_option_rules[0], FIL_NAME,
                              reasons))
        *refused = 1;
}

ap_status fil_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons) {
    ap_status readable = ap_kit_model_readable(model, FIL_NAME, reasons);
    if (readable != AP_OK) return readable;
    int refused = 0;
    fil_validate_shape(model, reasons, &refused);
    fil_validate_dtypes(model, reasons, &refused);
    /* decode and extend use sm_80 instructions (cp.async, mma.sync bf16) and fp8 conversions of
     * sm_89; the build targets sm_90, so anything older cannot run it anyway */
    if (ap_kit_device_refuses(device, 9, FIL_NAME, reasons)) refused = 1;
    fil_validate_options(options, reasons, &refused);
    return refused ? AP_ERR_REFUSED : AP_OK;
}
