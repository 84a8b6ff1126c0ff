// decode_math.cuh: one warp's step of trtllm_mha's decode (decode.cu): its online-softmax state
// and S = Q K^T, softmax, O += P V over a 32-key sub-tile in shared memory, with the fragments
// of a 16-bit, fp8 or nvfp4 cache read by ldmatrix (fp8 and nvfp4 converted in registers).
#ifndef AP_TRTLLM_MHA_DECODE_MATH_CUH
#define AP_TRTLLM_MHA_DECODE_MATH_CUH

#include <cuda_runtime.h>
#include <math.h>

#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/nvfp4.cuh"
#include "../common/swizzle.cuh"

namespace {

constexpr int kTile = 32; // KV tokens of one warp's step

// One warp's 16 rows: Q as A fragments, O (16 x D) as C fragments, per row the running max m
// and this lane's share of the denominator l (rows g and g + 8).
template <int D> struct warp_state {
    uint32_t q[D / 16][4];
    float acc[D / 8][4];
    float m[2], l[2];
    int limit[2]; // the last key each row sees (causal): prefix + its token
};

// Online softmax of one step (rows g, g + 8): m' = max(m, max_j s_j), p_j = 2^(s_j - m'),
// l = l 2^(m - m') + sum p_j, O rescaled by 2^(m - m'). A row with no key yet keeps m = -inf
// and p = 0 (the base is then 0, so no inf - inf).
template <int D>
__device__ __forceinline__ void tile_softmax(warp_state<D> &st, float (&s)[kTile / 8][4],
                                             int first_key, int key_end, float scale_log2, int t) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = first_key + 8 * n + 2 * t + e;
                float x = s[n][2 * half + e] * scale_log2;
                x = (key < key_end && key <= st.limit[half]) ? x : -INFINITY;
                s[n][2 * half + e] = x;
                tile_max = fmaxf(tile_max, x);
            }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float m_new = fmaxf(st.m[half], tile_max);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = ap_exp2_approx(st.m[half] - base);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float p = ap_exp2_approx(s[n][2 * half + e] - base);
                s[n][2 * half + e] = p;
                sum += p;
            }
        st.l[half] = st.l[half] * alpha + sum;
        st.m[half] = m_new;
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            st.acc[j][2 * half] *= alpha;
            st.acc[j][2 * half + 1] *= alpha;
        }
    }
}

// One step over a 16-bit K/V sub-tile pair (32 keys, K at tile_k, V at tile_v):
//   S = Q K^T (16 rows x 32 keys), softmax as above, O += P V, all accumulated in float.
// The probabilities of keys 16kk .. 16kk + 15 (the scores after tile_softmax) as the A fragment
// of an m16n8k16 in MT.
template <typename MT>
__device__ __forceinline__ void p_fragment(const float (&s)[kTile / 8][4], int kk,
                                           uint32_t (&pa)[4]) {
    pa[0] = ap_pack2<MT>(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = ap_pack2<MT>(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = ap_pack2<MT>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = ap_pack2<MT>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

template <int D, typename MT>
__device__ __forceinline__ void tile_math(warp_state<D> &st, uint32_t tile_k, uint32_t tile_v,
                                          int first_key, int key_end, float scale_log2, int lane) {
    constexpr int C = D / 8;
    const int mat = lane >> 3, t = lane & 3;
    float s[kTile / 8][4];
#pragma unroll
    for (int n = 0; n < kTile / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int p = 0; p < kTile / 16; p++) {
        const int row = 16 * p + (mat >> 1) * 8 + (lane & 7);
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t r[4];
            ap_ldmatrix_x4(r, tile_k + row * D * 2 + ap_swizzle<C>(row, 2 * ks + (mat & 1)) * 16);
            ap_mma_16816<MT>(s[2 * p], st.q[ks], r[0], r[1]);
            ap_mma_16816<MT>(s[2 * p + 1], st.q[ks], r[2], r[3]);
        }
    }
    tile_softmax<D>(st, s, first_key, key_end, scale_log2, t);
#pragma unroll
    for (int kk = 0; kk < kTile / 16; kk++) {
        uint32_t pa[4];
        p_fragment<MT>(s, kk, pa);
        const int row = 16 * kk + (mat & 1) * 8 + (lane & 7);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t r[4];
            ap_ldmatrix_x4_trans(r, tile_v + row * D * 2 +
                                        ap_swizzle<C>(row, 2 * dp + (mat >> 1)) * 16);
            ap_mma_16816<MT>(st.acc[2 * dp], pa, r[0], r[1]);
            ap_mma_16816<MT>(st.acc[2 * dp + 1], pa, r[2], r[3]);
        }
    }
}

// fp8 step over a sub-tile of bytes (32 rows of D bytes, swizzled; K at tile_k, V at tile_v),
// converted to half in registers. One ldmatrix.x4 per 16-dim chunk c reads keys 0..31 (lane =
// key): for K, lane (g, t) gets key 8n + g, dims 16c + 4t .. 4t + 3 of block n, the B fragment
// of a permuted k (Q is loaded to match, state_begin); for V (.trans), keys 2t, 2t + 1 (and
// + 8) of dims 16c + 2g, 2g + 1, which ap_fp8x4_trans_split cuts into the B fragments of the
// even dims (acc[2c]) and the odd dims (acc[2c + 1]): lane (g, t) ends up holding dims
// 16c + 4t .. 4t + 3 of rows g and g + 8 (state_finish).
template <int D>
__device__ __forceinline__ void tile_math_fp8(warp_state<D> &st, uint32_t tile_k, uint32_t tile_v,
                                              int first_key, int key_end, float scale_log2,
                                              int lane) {
    constexpr int C = D / 16; // 16-byte chunks of a row
    const uint32_t lane_row = lane * D;
    float s[kTile / 8][4];
#pragma unroll
    for (int n = 0; n < kTile / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int c = 0; c < C; c++) {
        uint32_t r[4];
        ap_ldmatrix_x4(r, tile_k + lane_row + ap_swizzle<C>(lane, c) * 16);
#pragma unroll
        for (int n = 0; n < 4; n++)
            ap_mma_16816<__half>(s[n], st.q[c], ap_fp8x2_to_half2_bits((uint16_t)r[n]),
                                 ap_fp8x2_to_half2_bits((uint16_t)(r[n] >> 16)));
    }
    tile_softmax<D>(st, s, first_key, key_end, scale_log2, lane & 3);
    uint32_t pa[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; kk++) p_fragment<__half>(s, kk, pa[kk]);
#pragma unroll
    for (int c = 0; c < C; c++) {
        uint32_t r[4];
        ap_ldmatrix_x4_trans(r, tile_v + lane_row + ap_swizzle<C>(lane, c) * 16);
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t even[2], odd[2];
            ap_fp8x4_trans_split(r[2 * kk], even[0], odd[0]);
            ap_fp8x4_trans_split(r[2 * kk + 1], even[1], odd[1]);
            ap_mma_16816<__half>(st.acc[2 * c], pa[kk], even[0], even[1]);
            ap_mma_16816<__half>(st.acc[2 * c + 1], pa[kk], odd[0], odd[1]);
        }
    }
}

// nvfp4 step over a sub-tile (32 rows of D / 2 bytes, swizzled; K at tile_k, V at tile_v; the
// scale rows of D / 16 bytes at scale_k, scale_v), converted to half in registers (the kit's prmt
// decode). One ldmatrix.x4 per 32-value chunk c reads keys 0..31 (lane = key). K: lane (g, t)
// gets key 8n + g, dims 32c + 8t .. 8t + 7 (one block scale): the B fragments of k-steps 2c and
// 2c + 1 with k permuted (Q loaded to match). V (.trans): keys 2t, 2t + 1 (and + 8) of dims
// 32c + 4g .. 4g + 3, regrouped by prmt into (key 2t, key 2t + 1) pairs of one dim e, times
// the two keys' block scales: the B fragment of n-block 4c + e (column g = dim 32c + 4g + e), so
// lane (g, t) ends up holding dims 32c + 8t .. 8t + 7 of rows g and g + 8 (state_finish).
template <int D>
__device__ __forceinline__ void
tile_math_nvfp4(warp_state<D> &st, uint32_t tile_k, uint32_t tile_v, const uint8_t *scale_k,
                const uint8_t *scale_v, int first_key, int key_end, float scale_log2, int lane) {
    constexpr int C = D / 32, SR = D / 16; // chunks per row, scale bytes per row
    const int g = lane >> 2, t = lane & 3;
    const uint32_t lane_row = lane * (D / 2);
    float s[kTile / 8][4];
#pragma unroll
    for (int n = 0; n < kTile / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int c = 0; c < C; c++) {
        uint32_t r[4];
        ap_ldmatrix_x4(r, tile_k + lane_row + ap_swizzle<C>(lane, c) * 16);
#pragma unroll
        for (int n = 0; n < 4; n++) {
            __half2 v[4];
            ap_nvfp4_dequant8_half2(
                r[n], ap_nvfp4_scale_half2(scale_k[(8 * n + g) * SR + 2 * c + (t >> 1)]), v);
            const uint32_t *b = reinterpret_cast<const uint32_t *>(v);
            ap_mma_16816<__half>(s[n], st.q[2 * c], b[0], b[1]);
            ap_mma_16816<__half>(s[n], st.q[2 * c + 1], b[2], b[3]);
        }
    }
    tile_softmax<D>(st, s, first_key, key_end, scale_log2, t);
    uint32_t pa[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; kk++) p_fragment<__half>(s, kk, pa[kk]);
#pragma unroll
    for (int c = 0; c < C; c++) {
        uint32_t r[4];
        ap_ldmatrix_x4_trans(r, tile_v + lane_row + ap_swizzle<C>(lane, c) * 16);
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t b[2][4];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                const int key = 16 * kk + 8 * m + 2 * t;
                const uint8_t *sc = scale_v + key * SR + 2 * c + (g >> 2);
                const uint32_t scales = ap_fp8x2_to_half2_bits((uint16_t)(sc[0] | sc[SR] << 8));
                ap_nvfp4_e2m1x8_to_f16x2(r[2 * kk + m], b[m]);
                const uint32_t lo = b[m][0], hi = b[m][1], lo1 = b[m][2], hi1 = b[m][3];
                const uint32_t pairs[4] = {
                    __byte_perm(lo, lo1, 0x5410), __byte_perm(lo, lo1, 0x7632),
                    __byte_perm(hi, hi1, 0x5410), __byte_perm(hi, hi1, 0x7632)};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const __half2 x = __hmul2(*reinterpret_cast<const __half2 *>(&pairs[e]),
                                              *reinterpret_cast<const __half2 *>(&scales));
                    b[m][e] = *reinterpret_cast<const uint32_t *>(&x);
                }
            }
#pragma unroll
            for (int e = 0; e < 4; e++)
                ap_mma_16816<__half>(st.acc[4 * c + e], pa[kk], b[0][e], b[1][e]);
        }
    }
}

} // namespace

#endif // AP_TRTLLM_MHA_DECODE_MATH_CUH
