/* validate.c: may trtllm_mla serve this model here? Every reason it cannot, no allocation. */
#include <string.h>

#include "glue.h"

/* The kernels are written for DeepSeek's latent: 512 + 64, one latent head, 16..128 query heads
 * (TP 8 .. TP 1), bf16 activations, a bf16 or fp8 e4m3 cache in pages of 32 or 64. */
static void mla_validate_shape(const ap_model *m, ap_msgbuf *reasons, int *refused) {
    if (m->kind != AP_ATTN_MLA) {
        *refused = 1;
        ap_msgbuf_add(reasons, MLA_NAME ": attention kind %s is not served (MLA only)",
                      m->kind == AP_ATTN_MHA ? "MHA" : "unknown");
        return;
    }
    if (m->kv_lora_rank != MLA_LATENT || m->qk_rope_head_dim != MLA_ROPE ||
        m->head_dim_qk != MLA_ROW || m->head_dim_v != MLA_LATENT || m->num_kv_heads != 1) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      MLA_NAME ": latent %d + rope %d (qk %d, v %d, %d KV heads) is not "
                               "DeepSeek's 512 + 64 (qk 576, v 512, 1 KV head)",
                      m->kv_lora_rank, m->qk_rope_head_dim, m->head_dim_qk, m->head_dim_v,
                      m->num_kv_heads);
    }
    int h = m->num_qo_heads;
    if (h != 16 && h != 32 && h != 64 && h != 128) {
        *refused = 1;
        ap_msgbuf_add(reasons, MLA_NAME ": %d query heads (16, 32, 64 or 128 served)", h);
    }
    if (m->page_size != 32 && m->page_size != 64) {
        *refused = 1;
        ap_msgbuf_add(reasons, MLA_NAME ": page size %d is not 32 or 64", m->page_size);
    }
    if (ap_kit_model_limits_refuse(m, 16, 24, MLA_NAME, reasons)) *refused = 1;
    if (m->causal != 1) {
        *refused = 1;
        ap_msgbuf_add(reasons, MLA_NAME ": non-causal MLA is not served");
    }
}

static void mla_validate_dtypes(const ap_model *m, ap_msgbuf *reasons, int *refused) {
    if (m->dtype != AP_DTYPE_BF16) {
        *refused = 1;
        ap_msgbuf_add(reasons, MLA_NAME ": query dtype %s is not bf16", ap_dtype_str(m->dtype));
    }
    if (m->kv_dtype != AP_DTYPE_BF16 && m->kv_dtype != AP_DTYPE_FP8_E4M3) {
        *refused = 1;
        ap_msgbuf_add(reasons, MLA_NAME ": latent cache dtype %s is not bf16 or fp8_e4m3",
                      ap_dtype_str(m->kv_dtype));
    }
}

/* cp.async, mma.sync and the fp8 conversions need sm_89+, griddepcontrol sm_90; the build is for
 * sm_90a, which the core's arch check also enforces. */
static void mla_validate_device(const ap_device *device, ap_msgbuf *reasons, int *refused) {
    if (ap_kit_device_refuses(device, 9, MLA_NAME, reasons)) {
        *refused = 1;
        return;
    }
    if (device->smem_per_block_optin > 0 && device->smem_per_block_optin < 230400) {
        *refused = 1;
        ap_msgbuf_add(reasons, MLA_NAME ": %d bytes of shared memory per block (230400 needed)",
                      device->smem_per_block_optin);
    }
}

int mla_option_split_kv(const ap_options *options) {
    const char *value = ap_kit_option(options, "split_kv");
    return value == NULL || strcmp(value, "off") != 0;
}

int mla_option_flat(const ap_options *options) {
    const char *value = ap_kit_option(options, "decode_schedule");
    if (value == NULL || strcmp(value, "flat") == 0) return 1;
    return strcmp(value, "cut") == 0 ? 2 : 0;
}

/* 0 (unset: the kernel picks), 2 or 3. */
int mla_option_stages(const ap_options *options) {
    const char *value = ap_kit_option(options, "decode_stages");
    if (value == NULL) return 0;
    return strcmp(value, "3") == 0 ? 3 : 2;
}

/* Backend-specific options, measurement knobs:
 *   split_kv: auto | off       off: one CTA per (sequence, row block), no combine
 *   decode_schedule: flat | split | cut
 *                              how decode.cu's kernels share a batch's KV among CTAs when a
 *                              sequence's rows fit one CTA: flat (unset), one equal share of
 *                              all tiles per SM (decode_flat.cuh); split, per sequence, a wave
 *                              of equal splits only while sequences are fewer than SMs; cut,
 *                              flat with every share cut (no whole-sequence rule)
 *   decode_stages: 2 | 3       cp.async stages of the 16-row decode kernel (3 keeps Q in
 *                              registers to make room); the 64-row kernel always has 2. Unset:
 *                              3 (decode.cu) */
static void mla_validate_options(const ap_options *options, ap_msgbuf *reasons, int *refused) {
    if (options == NULL) return;
    if (options->struct_size < sizeof(ap_options)) {
        *refused = 1;
        ap_msgbuf_add(reasons, MLA_NAME ": ap_options struct_size %zu < %zu", options->struct_size,
                      sizeof(ap_options));
        return;
    }
    static const ap_kit_option_rule rules[] = {
        {"split_kv", "auto|off", NULL, NULL},
        {"decode_stages", "2|3", NULL, NULL},
        {"decode_schedule", "flat|split|cut", NULL, NULL},
    };
    if (ap_kit_options_refuse(options, rules, sizeof rules / sizeof rules[0], MLA_NAME, reasons))
        *refused = 1;
}

ap_status mla_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons) {
    ap_status readable = ap_kit_model_readable(model, MLA_NAME, reasons);
    if (readable != AP_OK) return readable;
    int refused = 0;
    mla_validate_shape(model, reasons, &refused);
    mla_validate_dtypes(model, reasons, &refused);
    mla_validate_device(device, reasons, &refused);
    mla_validate_options(options, reasons, &refused);
    return refused ? AP_ERR_REFUSED : AP_OK;
}
