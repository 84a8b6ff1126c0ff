/* cuda_archs.h: a plugin's compiled GPU targets, parsed from the build's AP_CUDA_ARCHS string. */
#ifndef AP_COMMON_CUDA_ARCHS_H
#define AP_COMMON_CUDA_ARCHS_H

#include <stddef.h>

#include "plugin_api.h"

/* "90a,90,ptx90" -> {90 SASS_SPECIFIC}, {90 SASS}, {90 PTX}: the spelling meson's cuda-archs
 * option turns into -gencode. Unknown text up to the next comma is skipped. Returns the count
 * written (at most `capacity`). */
static inline size_t ap_cuda_archs_parse(const char *text, ap_arch_target *out, size_t capacity) {
    size_t count = 0;
    const char *p = text;
    while (p != NULL && *p != '\0' && count < capacity) {
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
        if (sm > 0) out[count++] = (ap_arch_target){sm, kind};
        while (*p != '\0' && *p != ',') p++;
        if (*p == ',') p++;
    }
    return count;
}

#endif /* AP_COMMON_CUDA_ARCHS_H */
