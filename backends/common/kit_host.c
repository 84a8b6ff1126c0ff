/* kit_host.c: the build's GPU targets as caps, option lookup, the device checks of validate(). */
#include <pthread.h>
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
