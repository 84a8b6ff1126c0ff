/* validate.c: may trtllm_mha serve this model here? Every reason it cannot, no allocation. */
#include <string.h>

#include "glue.h"

static int mha_head_dim_served(int32_t d) {
    return d == 64 || d == 128 || d == 256;
}

static void mha_validate_shape(const ap_model *m, ap_msgbuf *reasons, int *refused) {
    if (m->kind != AP_ATTN_MHA) {
        *refused = 1;
        ap_msgbuf_add(reasons, MHA_NAME ": attention kind %s is not served (MHA, GQA, MQA only)",
                      m->kind == AP_ATTN_MLA ? "MLA" : "unknown");
    }
    if (m->head_dim_qk != m->head_dim_v || !mha_head_dim_served(m->head_dim_qk)) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      MHA_NAME ": head dims qk %d / v %d are not equal and " MHA_HEAD_DIMS_TEXT,
                      m->head_dim_qk, m->head_dim_v);
    }
    if (m->num_qo_heads <= 0 || m->num_kv_heads <= 0 || m->num_qo_heads % m->num_kv_heads != 0) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      MHA_NAME ": %d query heads over %d KV heads: both must be > 0 and the KV "
                               "heads must divide the query heads",
                      m->num_qo_heads, m->num_kv_heads);
    } else if (m->num_qo_heads / m->num_kv_heads > MHA_MAX_GROUP) {
        *refused = 1;
        ap_msgbuf_add(reasons, MHA_NAME ": GQA group of %d query heads per KV head (1..%d served)",
                      m->num_qo_heads / m->num_kv_heads, MHA_MAX_GROUP);
    }
    if (m->page_size != 16 && m->page_size != 32 && m->page_size != 64) {
        *refused = 1;
        ap_msgbuf_add(reasons, MHA_NAME ": page size %d is not 16, 32 or 64", m->page_size);
    }
    if (m->causal != 1) {
        *refused = 1;
        ap_msgbuf_add(reasons, MHA_NAME ": non-causal attention is not served (decode-first)");
    }
    if (m->embedding) {
        *refused = 1;
        ap_msgbuf_add(reasons, MHA_NAME ": embedding models never decode: not served");
    }
    if (ap_kit_model_limits_refuse(m, 16, 24, MHA_NAME, reasons)) *refused = 1;
}

static void mha_validate_dtypes(const ap_model *m, ap_msgbuf *reasons, int *refused) {
    if (m->dtype != AP_DTYPE_BF16 && m->dtype != AP_DTYPE_F16) {
        *refused = 1;
        ap_msgbuf_add(reasons, MHA_NAME ": query dtype %s is not bf16 or f16",
                      ap_dtype_str(m->dtype));
    }
    if (m->kv_dtype == AP_DTYPE_FP8_E4M3 || m->kv_dtype == AP_DTYPE_NVFP4) return;
    if (m->kv_dtype == AP_DTYPE_BF16 || m->kv_dtype == AP_DTYPE_F16) {
        if (m->kv_dtype != m->dtype) {
            *refused = 1;
            ap_msgbuf_add(reasons,
                          MHA_NAME ": a 16-bit KV cache must have the query dtype (%s), not %s",
                          ap_dtype_str(m->dtype), ap_dtype_str(m->kv_dtype));
        }
        return;
    }
    *refused = 1;
    ap_msgbuf_add(reasons, MHA_NAME ": KV cache dtype %s is not bf16, f16, fp8_e4m3 or nvfp4",
                  ap_dtype_str(m->kv_dtype));
}

int mha_option_auto(const ap_options *options, const char *key) {
    const char *value = ap_kit_option(options, key);
    return value == NULL || strcmp(value, "off") != 0;
}

int32_t mha_option_keys_m(const ap_options *options) {
    const char *value = ap_kit_option(options, "nvfp4_keys_m");
    if (value != NULL && strcmp(value, "off") == 0) return MHA_KEYS_M_OFF;
    if (value != NULL && strcmp(value, "v1") == 0) return MHA_KEYS_M_V1;
    if (value != NULL && strcmp(value, "v2") == 0) return MHA_KEYS_M_V2;
    return MHA_KEYS_M_AUTO;
}

int32_t mha_option_schedule(const ap_options *options) {
    const char *value = ap_kit_option(options, "decode_schedule");
    return value != NULL && strcmp(value, "flat") == 0 ? MHA_SCHEDULE_FLAT : MHA_SCHEDULE_SPLIT;
}

int32_t mha_option_short_extend(const ap_options *options) {
    const char *value = ap_kit_option(options, "short_extend");
    if (value != NULL && strcmp(value, "decode") == 0) return MHA_SHORT_EXTEND_DECODE;
    if (value != NULL && strcmp(value, "prefill") == 0) return MHA_SHORT_EXTEND_PREFILL;
    return MHA_SHORT_EXTEND_AUTO;
}

/* Backend-specific options, measurement knobs: split_kv (auto | off), nvfp4_keys_m (the nvfp4
 * decode's keys-on-M kernel for <= 8 rows per KV head: auto | off | v1 | v2), decode_schedule
 * (auto | split | flat: mha.h's MHA_SCHEDULE_*) and short_extend (auto | decode | prefill: mha.h's
 * MHA_SHORT_EXTEND_*). Anything else is refused, since a typo must not pass silently. */
static void mha_validate_options(const ap_options *options, ap_msgbuf *reasons, int *refused) {
    if (options == NULL) return;
    if (options->struct_size < sizeof(ap_options)) {
        *refused = 1;
        ap_msgbuf_add(reasons, MHA_NAME ": ap_options struct_size %zu < %zu", options->struct_size,
                      sizeof(ap_options));
        return;
    }
    static const ap_kit_option_rule rules[] = {
        {"split_kv", "auto|off", NULL, NULL},
        {"nvfp4_keys_m", "auto|v1|v2|off", NULL, NULL},
        {"decode_schedule", "auto|flat|split", NULL, NULL},
        {"short_extend", "auto|decode|prefill", NULL, NULL},
    };
    if (ap_kit_options_refuse(options, rules, sizeof rules / sizeof rules[0], MHA_NAME, reasons))
        *refused = 1;
}

/* Prefill (more than MHA_MAX_Q_LEN new tokens in a sequence) runs on the kit's prefill kernel:
 * bf16/f16 queries over a cache of their type or fp8, groups of 1..8; an nvfp4 cache is staged
 * to the query's type first (the kit's stager). */
int mha_prefill_served(const ap_model *m) {
    ap_msgbuf quiet = {0};
    const ap_dtype read = m->kv_dtype == AP_DTYPE_NVFP4 ? m->dtype : m->kv_dtype;
    return ap_kit_prefill_check_config(0, m->head_dim_qk, m->head_dim_v, m->dtype, read,
                                       m->num_qo_heads, m->num_kv_heads, m->page_size, MHA_NAME,
                                       &quiet) == AP_OK;
}

ap_status mha_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons) {
    ap_status readable = ap_kit_model_readable(model, MHA_NAME, reasons);
    if (readable != AP_OK) return readable;
    int refused = 0;
    mha_validate_shape(model, reasons, &refused);
    mha_validate_dtypes(model, reasons, &refused);
    /* cp.async, mma.sync and the fp8 conversions need sm_89+; the build targets sm_90 */
    if (ap_kit_device_refuses(device, 9, MHA_NAME, reasons)) refused = 1;
    mha_validate_options(options, reasons, &refused);
    return refused ? AP_ERR_REFUSED : AP_OK;
}
