/* caps_format.h: names and one-line lists for a backend's static capabilities (tools' output). */
#ifndef AP_CAPS_FORMAT_H
#define AP_CAPS_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "attnplug.h"

/* "sm_90a", "sm_90" or "compute_90". */
void ap_arch_target_name(ap_arch_target target, char *text, size_t size);

/* "SASS, arch-specific", "SASS" or "PTX". */
const char *ap_arch_kind_label(ap_arch_kind kind);

/* "none", "decode only" or "all". */
const char *ap_graph_level_label(ap_graph_level level);

/* The name of feature bit `index` (0..63) or NULL when the bit has no name. */
const char *ap_feature_name(unsigned index);

/* Comma-separated lists into `text` ("none" when empty). */
void ap_list_archs(const ap_caps *caps, char *text, size_t size); /* "sm_90a (SASS, ...)" */
void ap_list_dtypes(uint32_t mask, char *text, size_t size);      /* "bf16, fp16" */
void ap_list_attn_kinds(uint32_t mask, char *text, size_t size);  /* "mha, mla" */
void ap_list_ints(const int32_t *values, size_t count, char *text, size_t size); /* or "any" */
void ap_list_phases(uint32_t phases, char *text, size_t size);      /* "extend, decode" */
void ap_list_features(uint64_t features, char *text, size_t size);  /* "lse, sinks" */
void ap_list_device_kinds(uint32_t kinds, char *text, size_t size); /* "cpu, cuda" */
void ap_list_hooks(const ap_caps *caps, char *text, size_t size);   /* "append_kv/1, ..." */

#endif /* AP_CAPS_FORMAT_H */
