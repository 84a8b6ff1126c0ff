/* kit_host.c: the build's GPU targets as caps, options, device checks, tensor alignment, kv spec. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kit.h"

#ifndef AP_CUDA_ARCHS
#error "AP_CUDA_ARCHS (the build's GPU targets, e.g. \"90a\") must be defined by the build"
#endif

#define AP_KIT_MAX_ARCHS 16
static ap_arch_target ap_kit_archs[AP_KIT_MAX_ARCHS];
static size_t ap_kit_num_archs;
static pthread_once_t ap_kit_archs_once = PTHREAD_ONCE_INIT;

/* "90a,90,ptx90": "90a" is sm_90a SASS, "90" sm_90 SASS and "ptx90" compute_90 PTX. */
static void ap_kit_archs_parse(void) {
    const char *p = AP_CUDA_ARCHS;
    while (*p != '\0' && ap_kit_num_archs < AP_KIT_MAX_ARCHS) {
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
        if (sm > 0) ap_kit_archs[ap_kit_num_archs++] = (ap_arch_target){sm, kind};
        while (*p != '\0' && *p != ',') p++; /* skip anything unknown up to the next entry */
        if (*p == ',') p++;
    }
}

size_t ap_kit_cuda_archs(const ap_arch_target **out) {
    pthread_once(&ap_kit_archs_once, ap_kit_archs_parse);
    *out = ap_kit_archs;
    return ap_kit_num_archs;
}

const char *ap_kit_option(const ap_options *options, const char *key) {
    const char *value = NULL;
    if (options == NULL || options->extra == NULL) return NULL;
    for (size_t i = 0; i < options->num_extra; i++) {
        const ap_option_kv *kv = &options->extra[i];
        if (kv->key != NULL && strcmp(kv->key, key) == 0) value = kv->value;
    }
    return value;
}

/* 1 when `value` is one of the '|'-separated words of `values`. */
static int ap_kit_value_listed(const char *values, const char *value) {
    size_t len = strlen(value);
    for (const char *p = values; p != NULL && *p != '\0';) {
        const char *bar = strchr(p, '|');
        size_t n = bar != NULL ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, value, n) == 0) return 1;
        p = bar != NULL ? bar + 1 : NULL;
    }
    return 0;
}

/* Append to a line being built in `line` (size bytes, NUL-terminated); truncates silently. */
static void ap_kit_line_add(char *line, size_t size, const char *text, int n, const char *tail) {
    size_t used = strlen(line);
    if (used < size) snprintf(line + used, size - used, "%.*s%s", n, text, tail);
}

/* "auto|off" as "auto or off", "a|b|c" as "a, b or c". */
static void ap_kit_add_choices(char *line, size_t size, const char *values) {
    for (const char *p = values; p != NULL && *p != '\0';) {
        const char *bar = strchr(p, '|');
        int n = bar != NULL ? (int)(bar - p) : (int)strlen(p);
        const char *sep = bar == NULL ? "" : strchr(bar + 1, '|') != NULL ? ", " : " or ";
        ap_kit_line_add(line, size, p, n, sep);
        p = bar != NULL ? bar + 1 : NULL;
    }
}

/* The rule of `key`, or NULL. */
static const ap_kit_option_rule *ap_kit_rule_of(const ap_kit_option_rule *rules, size_t n,
                                                const char *key) {
    for (size_t r = 0; r < n; r++)
        if (strcmp(rules[r].key, key) == 0) return &rules[r];
    return NULL;
}

int ap_kit_options_refuse(const ap_options *options, const ap_kit_option_rule *rules,
                          size_t num_rules, const char *who, ap_msgbuf *reasons) {
    int refused = 0;
    for (size_t i = 0; options != NULL && options->extra != NULL && i < options->num_extra; i++) {
        const char *key = options->extra[i].key != NULL ? options->extra[i].key : "(null)";
        const char *value = options->extra[i].value != NULL ? options->extra[i].value : "(null)";
        const ap_kit_option_rule *rule = ap_kit_rule_of(rules, num_rules, key);
        if (rule != NULL && (rule->valid != NULL ? rule->valid(options->extra[i].value)
                                                 : ap_kit_value_listed(rule->values, value)))
            continue;
        refused = 1;
        char line[512] = "";
        if (rule != NULL && rule->valid != NULL) {
            snprintf(line, sizeof line, "option %s is '%s', not %s", key, value, rule->expect);
        } else if (rule != NULL) {
            snprintf(line, sizeof line, "option %s is '%s', not ", key, value);
            ap_kit_add_choices(line, sizeof line, rule->values);
        } else {
            snprintf(line, sizeof line, "unknown option '%s' (known: ", key);
            for (size_t r = 0; r < num_rules; r++)
                ap_kit_line_add(line, sizeof line, rules[r].key, (int)strlen(rules[r].key),
                                r + 1 < num_rules ? ", " : ")");
        }
        ap_msgbuf_add(reasons, "%s: %s", who, line);
    }
    return refused;
}

ap_status ap_kit_model_readable(const ap_model *model, const char *who, ap_msgbuf *reasons) {
    if (model == NULL) {
        ap_msgbuf_add(reasons, "%s: no model given", who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (model->struct_size < sizeof(ap_model)) {
        ap_msgbuf_add(reasons, "%s: ap_model struct_size %zu < %zu (an older ABI)", who,
                      model->struct_size, sizeof(ap_model));
        return AP_ERR_REFUSED;
    }
    return AP_OK;
}

int ap_kit_model_limits_refuse(const ap_model *model, int32_t max_batch_log2,
                               int32_t max_tokens_log2, const char *who, ap_msgbuf *reasons) {
    if (model->max_batch > 0 && model->max_tokens > 0 &&
        model->max_batch <= (1 << max_batch_log2) && model->max_tokens <= (1 << max_tokens_log2))
        return 0;
    ap_msgbuf_add(reasons, "%s: max_batch %d and max_tokens %d must be in 1..2^%d and 1..2^%d", who,
                  model->max_batch, model->max_tokens, max_batch_log2, max_tokens_log2);
    return 1;
}

int ap_kit_device_refuses(const ap_device *device, int32_t min_major, const char *who,
                          ap_msgbuf *reasons) {
    if (device == NULL) {
        ap_msgbuf_add(reasons, "%s: no device given", who);
        return 1;
    }
    if (device->ordinal < 0 || device->unusable_reason[0] != '\0') {
        ap_msgbuf_add(reasons, "%s: needs a CUDA GPU%s%s", who,
                      device->unusable_reason[0] != '\0' ? ": " : "", device->unusable_reason);
        return 1;
    }
    int refused = 0;
    if (device->cc_major < min_major) {
        refused = 1;
        ap_msgbuf_add(reasons, "%s: compute capability %d.%d is below %d.0", who, device->cc_major,
                      device->cc_minor, min_major);
    }
    if (device->sm_count <= 0) {
        refused = 1;
        ap_msgbuf_add(reasons, "%s: the device reports %d SMs", who, device->sm_count);
    }
    return refused;
}

ap_status ap_kit_aligned(const DLTensor *t, const char *what, size_t alignment, const char *who,
                         ap_msgbuf *msg) {
    if (t == NULL || (uintptr_t)ap_kit_data(t) % alignment == 0) return AP_OK;
    ap_msgbuf_add(msg, "%s: tensor %s must start on a %zu-byte boundary", who, what, alignment);
    return AP_ERR_UNSUPPORTED;
}

ap_status ap_kit_kv_spec_nhd(const ap_model *model, size_t alignment, ap_kv_spec *out,
                             const char *who, ap_msgbuf *msg) {
    if (out == NULL || out->struct_size < sizeof(ap_kv_spec)) {
        ap_msgbuf_add(msg, "%s: get_kv_spec needs an ap_kv_spec with struct_size set", who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    size_t bits = ap_dtype_size_bits(model->kv_dtype);
    size_t slots = (size_t)model->page_size * (size_t)model->num_kv_heads;
    out->k_bytes_per_page = slots * (size_t)model->head_dim_qk * bits / 8;
    out->v_bytes_per_page = slots * (size_t)model->head_dim_v * bits / 8;
    /* nvfp4: one e4m3 scale byte per 16 values, one size for K and V (the wider) */
    size_t widest = model->head_dim_qk > model->head_dim_v ? (size_t)model->head_dim_qk
                                                           : (size_t)model->head_dim_v;
    out->scale_bytes_per_page = model->kv_dtype == AP_DTYPE_NVFP4 ? slots * widest / 16 : 0;
    out->alignment = alignment;
    return AP_OK;
}
