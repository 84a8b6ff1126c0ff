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

#endif // AP_COMMON_SOFTMAX_STATE_CUH
