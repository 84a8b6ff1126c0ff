// softmax_state.cuh: merging partial attention states (output, log-sum-exp) of split KV ranges.
#ifndef AP_COMMON_SOFTMAX_STATE_CUH
#define AP_COMMON_SOFTMAX_STATE_CUH

#include <math.h>

// A partial state over a KV range R, in base 2: lse2 = log2(sum_{j in R} 2^(s_j)) with s_j the
// logits scaled by sm_scale * log2(e), and o = sum_j 2^(s_j - lse2) v_j, the normalised output.
// Over R1 u R2:  lse2 = M + log2(2^(lse2_1 - M) + 2^(lse2_2 - M)), M = max(lse2_1, lse2_2),
//                o = (2^(lse2_1 - M) o_1 + 2^(lse2_2 - M) o_2) / (2^(lse2_1 - M) + 2^(lse2_2 - M)).
// A merge over n parts takes the max first, then one weighted sum: ap_softmax_merge_weight gives
// each part's weight 2^(lse2_i - M); the caller divides by the sum of the weights.
__device__ __forceinline__ float ap_softmax_merge_weight(float lse2, float max_lse2) {
    return exp2f(lse2 - max_lse2);
}

// log2(e) and ln(2) as floats: logits are scaled by sm_scale * ap_log2e so exp2 gives e^x, and
// base-2 log-sum-exps go back to natural logs by ap_ln2. Usable in host code too.
constexpr float ap_log2e = 1.4426950408889634f;
constexpr float ap_ln2 = 0.69314718055994531f;

// The base-2 log-sum-exp as the natural log that callers of the ABI get.
__device__ __forceinline__ float ap_lse2_to_ln(float lse2) {
    return lse2 * ap_ln2;
}

// Two states given in natural log, as merge_state/1 defines it (a row with no keys has
// lse = -inf): m = max(lse_a, lse_b), w_a = exp(lse_a - m), w_b = exp(lse_b - m), the merged
// lse = m + log(w_a + w_b), the weights returned already divided by w_a + w_b. Both -inf:
// weights 0 and lse -inf (the caller writes o = 0). Full-precision expf/logf: the merge is
// memory-bound, so accuracy costs nothing.
struct ap_state_weights {
    float w_a, w_b;
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

#endif // AP_COMMON_SOFTMAX_STATE_CUH
