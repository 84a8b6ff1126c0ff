/* names.c: printable names of statuses, dtypes and attention kinds; parsing and checking names. */
#include <string.h>
#include <strings.h>

#include "internal.h"

const char *ap_status_name(ap_status status) {
    switch (status) {
        case AP_OK: return "AP_OK";
        case AP_ERR_INVALID_ARGUMENT: return "AP_ERR_INVALID_ARGUMENT";
        case AP_ERR_SHAPE_MISMATCH: return "AP_ERR_SHAPE_MISMATCH";
        case AP_ERR_UNSUPPORTED: return "AP_ERR_UNSUPPORTED";
        case AP_ERR_ABI_MISMATCH: return "AP_ERR_ABI_MISMATCH";
        case AP_ERR_LOAD: return "AP_ERR_LOAD";
        case AP_ERR_MISSING_SYMBOL: return "AP_ERR_MISSING_SYMBOL";
        case AP_ERR_NOT_FOUND: return "AP_ERR_NOT_FOUND";
        case AP_ERR_OUT_OF_MEMORY: return "AP_ERR_OUT_OF_MEMORY";
        case AP_ERR_CONFIG: return "AP_ERR_CONFIG";
        case AP_ERR_NO_DEVICE: return "AP_ERR_NO_DEVICE";
        case AP_ERR_CUDA: return "AP_ERR_CUDA";
        case AP_ERR_REFUSED: return "AP_ERR_REFUSED";
        case AP_ERR_DUPLICATE: return "AP_ERR_DUPLICATE";
        case AP_ERR_INTERNAL: return "AP_ERR_INTERNAL";
    }
    return "AP_ERR_UNKNOWN";
}

int ap_status_known(ap_status status) {
    return strcmp(ap_status_name(status), "AP_ERR_UNKNOWN") != 0;
}

/* Spellings people write in configs besides the canonical names. */
static const struct {
    const char *name;
    ap_dtype dtype;
} ap_dtype_aliases[] = {
    {"fp8", AP_DTYPE_FP8_E4M3}, {"float16", AP_DTYPE_F16},   {"fp16", AP_DTYPE_F16},
    {"half", AP_DTYPE_F16},     {"bfloat16", AP_DTYPE_BF16}, {"float32", AP_DTYPE_F32},
    {"fp32", AP_DTYPE_F32},
};

ap_status ap_dtype_parse(const char *name, ap_dtype *out) {
    if (name == NULL || out == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_dtype_parse: NULL %s",
                            name == NULL ? "name" : "out");
    for (int i = 0; i < AP_DTYPE_COUNT; i++) {
        if (strcasecmp(name, ap_dtype_str((ap_dtype)i)) == 0) {
            *out = (ap_dtype)i;
            return AP_OK;
        }
    }
    for (size_t i = 0; i < sizeof ap_dtype_aliases / sizeof ap_dtype_aliases[0]; i++) {
        if (strcasecmp(name, ap_dtype_aliases[i].name) == 0) {
            *out = ap_dtype_aliases[i].dtype;
            return AP_OK;
        }
    }
    return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                        "unknown dtype '%s' (known: none, f32, bf16, f16, fp8_e4m3, fp8_e5m2, "
                        "nvfp4; also fp8, fp16, float16, half, bfloat16, fp32, float32)",
                        name);
}

const char *ap_attn_kind_name(ap_attn_kind kind) {
    switch (kind) {
        case AP_ATTN_MHA: return "mha";
        case AP_ATTN_MLA: return "mla";
    }
    return "unknown";
}

int ap_backend_name_valid(const char *name) {
    if (name[0] == '\0') return 0;
    for (const char *c = name; *c != '\0'; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return 0;
    }
    return 1;
}
