/* caps_format.c: turns a backend's static capabilities into names and one-line lists. */
#include "caps_format.h"

#include <stdarg.h>
#include <stdio.h>

void ap_arch_target_name(ap_arch_target target, char *text, size_t size) {
    switch (target.kind) {
        case AP_ARCH_SASS_SPECIFIC: snprintf(text, size, "sm_%da", target.sm); break;
        case AP_ARCH_PTX: snprintf(text, size, "compute_%d", target.sm); break;
        default: snprintf(text, size, "sm_%d", target.sm); break;
    }
}

const char *ap_arch_kind_label(ap_arch_kind kind) {
    switch (kind) {
        case AP_ARCH_SASS: return "SASS";
        case AP_ARCH_SASS_SPECIFIC: return "SASS, arch-specific";
        case AP_ARCH_PTX: return "PTX";
    }
    return "unknown";
}

const char *ap_graph_level_label(ap_graph_level level) {
    switch (level) {
        case AP_GRAPH_NONE: return "none";
        case AP_GRAPH_DECODE_ONLY: return "decode only";
        case AP_GRAPH_ALL: return "all";
    }
    return "unknown";
}

const char *ap_feature_name(unsigned index) {
    static const char *const names[] = {
        "lse",   "embedding_skip_kv", "sliding_window", "logit_softcap",
        "sinks", "split_kv",          "noncausal"};
    return index < sizeof(names) / sizeof(names[0]) ? names[index] : NULL;
}

/* Appends to a fixed buffer, separating items with ", "; truncates silently. */
typedef struct ap_list {
    char *text;
    size_t size;
    size_t used;
} ap_list;

static void ap_list_start(ap_list *list, char *text, size_t size) {
    list->text = text;
    list->size = size;
    list->used = 0;
    if (size > 0) text[0] = '\0';
}

static void ap_list_add(ap_list *list, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ap_list_add(ap_list *list, const char *fmt, ...) {
    if (list->used + 1 >= list->size) return;
    if (list->used > 0) {
        int n = snprintf(list->text + list->used, list->size - list->used, ", ");
        list->used += (size_t)n;
        if (list->used >= list->size) list->used = list->size - 1;
    }
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(list->text + list->used, list->size - list->used, fmt, args);
    va_end(args);
    if (n > 0) list->used += (size_t)n;
    if (list->used >= list->size) list->used = list->size - 1;
}

static void ap_list_end(ap_list *list, const char *empty) {
    if (list->used == 0 && list->size > 0) snprintf(list->text, list->size, "%s", empty);
}

void ap_list_archs(const ap_caps *caps, char *text, size_t size) {
    ap_list list;
    ap_list_start(&list, text, size);
    for (size_t i = 0; caps->archs != NULL && i < caps->num_archs; i++) {
        char name[32];
        ap_arch_target_name(caps->archs[i], name, sizeof(name));
        ap_list_add(&list, "%s (%s)", name, ap_arch_kind_label(caps->archs[i].kind));
    }
    ap_list_end(&list, "none");
}

void ap_list_dtypes(uint32_t mask, char *text, size_t size) {
    ap_list list;
    ap_list_start(&list, text, size);
    for (int d = 1; d < AP_DTYPE_COUNT; d++)
        if (mask & AP_DTYPE_BIT(d)) ap_list_add(&list, "%s", ap_dtype_str((ap_dtype)d));
    ap_list_end(&list, "none");
}

void ap_list_attn_kinds(uint32_t mask, char *text, size_t size) {
    ap_list list;
    ap_list_start(&list, text, size);
    if (mask & AP_ATTN_BIT(AP_ATTN_MHA)) ap_list_add(&list, "%s", ap_attn_kind_name(AP_ATTN_MHA));
    if (mask & AP_ATTN_BIT(AP_ATTN_MLA)) ap_list_add(&list, "%s", ap_attn_kind_name(AP_ATTN_MLA));
    ap_list_end(&list, "none");
}

void ap_list_ints(const int32_t *values, size_t count, char *text, size_t size) {
    ap_list list;
    ap_list_start(&list, text, size);
    for (size_t i = 0; values != NULL && i < count; i++) ap_list_add(&list, "%d", values[i]);
    ap_list_end(&list, "any");
}

void ap_list_phases(uint32_t phases, char *text, size_t size) {
    ap_list list;
    ap_list_start(&list, text, size);
    if (phases & AP_PHASE_EXTEND) ap_list_add(&list, "extend");
    if (phases & AP_PHASE_DECODE) ap_list_add(&list, "decode");
    ap_list_end(&list, "none");
}

void ap_list_features(uint64_t features, char *text, size_t size) {
    ap_list list;
    ap_list_start(&list, text, size);
    for (unsigned bit = 0; bit < 64; bit++) {
        if (!(features & (1ull << bit))) continue;
        const char *name = ap_feature_name(bit);
        if (name != NULL)
            ap_list_add(&list, "%s", name);
        else
            ap_list_add(&list, "bit%u", bit);
    }
    ap_list_end(&list, "none");
}

void ap_list_hooks(const ap_caps *caps, char *text, size_t size) {
    ap_list list;
    ap_list_start(&list, text, size);
    if (AP_HAS_FIELD(caps, ap_caps, num_hooks) && caps->hooks != NULL) {
        for (size_t i = 0; i < caps->num_hooks; i++) {
            char shown[128]; /* the plugin's text: escaped and capped as every plugin string */
            if (caps->hooks[i] == NULL) continue;
            ap_text_escape(caps->hooks[i], shown, sizeof shown);
            ap_list_add(&list, "%s", shown);
        }
    }
    ap_list_end(&list, "none");
}

void ap_list_device_kinds(uint32_t kinds, char *text, size_t size) {
    ap_list list;
    ap_list_start(&list, text, size);
    if (kinds & AP_DEVICE_KIND_CPU) ap_list_add(&list, "cpu");
    if (kinds & AP_DEVICE_KIND_CUDA) ap_list_add(&list, "cuda");
    ap_list_end(&list, "none");
}
