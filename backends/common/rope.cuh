// rope.cuh: RoPE's element math, bit-exact with cpu_ref's rope.c: every product and sum rounded
// on its own (__fmul_rn etc. are never contracted into a fused multiply-add).
#ifndef AP_COMMON_ROPE_CUH
#define AP_COMMON_ROPE_CUH

// One element of a rotated pair (x_a, x_b) at cos c and sin s:
//   x_a' = x_a * c - x_b * s,   x_b' = x_b * c + x_a * s
// x is the element, y its partner; first says whether x is x_a.
__device__ __forceinline__ float ap_rope_rotated(float x, float y, float c, float s, bool first) {
    return first ? __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s))
                 : __fadd_rn(__fmul_rn(x, c), __fmul_rn(y, s));
}

// Eight consecutive elements of a row: y holds each element's partner. NEOX (pairs d, d + half):
// all eight are x_a when `first`, else all x_b; interleaved (pairs 2i, 2i + 1): even ones are x_a.
template <bool NEOX>
__device__ __forceinline__ void ap_rope_rotate8(float (&x)[8], const float (&y)[8],
                                                const float (&c)[8], const float (&s)[8],
                                                bool first) {
#pragma unroll
    for (int i = 0; i < 8; i++)
        x[i] = ap_rope_rotated(x[i], y[i], c[i], s[i], NEOX ? first : (i & 1) == 0);
}

#endif // AP_COMMON_ROPE_CUH
