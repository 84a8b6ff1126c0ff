/* arch.c: CUDA's rules for which compiled GPU target runs on which compute capability. */
#include "internal.h"

int ap_arch_runs_on(ap_arch_target target, int32_t cc_major, int32_t cc_minor) {
    if (target.sm <= 0 || cc_major <= 0 || cc_minor < 0) return 0;
    int32_t major = target.sm / 10;
    int32_t minor = target.sm % 10;
    switch (target.kind) {
        case AP_ARCH_SASS:
            /* Machine code is binary-compatible forward within one major only. */
            return major == cc_major && minor <= cc_minor;
        case AP_ARCH_SASS_SPECIFIC:
            /* 'a' features (wgmma, setmaxnreg, ...) exist on exactly that chip. */
            return major == cc_major && minor == cc_minor;
        case AP_ARCH_PTX:
            /* The driver JIT-compiles PTX for any newer chip. */
            return major < cc_major || (major == cc_major && minor <= cc_minor);
    }
    return 0;
}

/* Rank of a target that runs on the device: higher is preferred. Exact machine code first (the
 * 'a' variant before the plain one, since it was built for exactly this chip), then the newest
 * same-major machine code, then the newest PTX. */
static int32_t ap_arch_rank(ap_arch_target target, int32_t cc) {
    int exact = target.sm == cc;
    if (target.kind == AP_ARCH_SASS_SPECIFIC) return 4000;
    if (target.kind == AP_ARCH_SASS) return exact ? 3000 : 2000 + target.sm;
    return 1000 + target.sm;
}

int ap_arch_pick(const ap_arch_target *targets, size_t count, int32_t cc_major, int32_t cc_minor) {
    if (targets == NULL) return -1;
    int best = -1;
    int32_t best_rank = -1;
    for (size_t i = 0; i < count; i++) {
        if (!ap_arch_runs_on(targets[i], cc_major, cc_minor)) continue;
        int32_t rank = ap_arch_rank(targets[i], 10 * cc_major + cc_minor);
        if (rank > best_rank) {
            best_rank = rank;
            best = (int)i;
        }
    }
    return best;
}
