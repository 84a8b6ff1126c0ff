// state_merge.cuh: the exact log-sum-exp merge of partial attention states given in natural log,
// as merge_state/1 defines it (a row with no keys has lse = -inf).
#ifndef AP_COMMON_STATE_MERGE_CUH
#define AP_COMMON_STATE_MERGE_CUH

#include <math.h>

// The weights of two states: m = max(lse_a, lse_b), w_a = exp(lse_a - m), w_b = exp(lse_b - m),
// and the merged lse = m + log(w_a + w_b). Both -inf: weights 0 and lse -inf (the caller writes
// o = 0). Full-precision expf/logf: the merge is memory-bound, so accuracy costs nothing.
struct ap_state_weights {
    float w_a, w_b; // already divided by w_a + w_b
    float lse;
};

__device__ __forceinline__ ap_state_weights ap_state_merge_weights(float lse_a, float lse_b) {
    ap_state_weights r;
    const float m = fmaxf(lse_a, lse_b);
    if (m == -INFINITY) {
        r.w_a = 0.f;
        r.w_b = 0.f;
        r.lse = -INFINITY;
        return r;
    }
    const float wa = expf(lse_a - m), wb = expf(lse_b - m);
    const float sum = wa + wb;
    r.w_a = wa / sum;
    r.w_b = wb / sum;
    r.lse = m + logf(sum);
    return r;
}

#endif // AP_COMMON_STATE_MERGE_CUH
