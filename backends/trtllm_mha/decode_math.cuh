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
    bool upper;   // rows g + 8 hold a query row (warp-uniform; else their softmax is skipped)
    int prefix;   // keys every row sees (its causal limit is at least this)
};

// Online softmax of one step (rows g, g + 8), scores s scaled by scale_log2 (> 0) on the way:
// m' = max(m, max_j s_j scale), p_j = 2^(s_j scale - m') (one fma), l = l 2^(m - m') + sum p_j,
// O rescaled by 2^(m - m') unless no row of the warp has a new max (then that factor is 1, or
// 0 times an O of zeros). A row with no key yet keeps m = -inf and p = 0 (the base is then 0, so
// no inf - inf). A step whose keys all lie before key_end and at or before every row's causal
// limit (>= the prefix) needs no mask. Rows g + 8 without a query row (a decode of <= 8 rows
// per warp) get p = 0 and no softmax: their outputs are never written.
template <int D>
__device__ __forceinline__ void tile_softmax(warp_state<D> &st, float (&s)[kTile / 8][4],
                                             int first_key, int key_end, float scale_log2, int t) {
    // (D = 256 keeps the mask: its registers are full, the second path spills more)
    const bool full =
        D <= 128 && first_key + kTile <= key_end && first_key + kTile - 1 <= st.prefix;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        if (half == 1 && !st.upper) {
#pragma unroll
            for (int n = 0; n < kTile / 8; n++) s[n][2] = s[n][3] = 0.f;
            break;
        }
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float x = s[n][2 * half + e];
                if (!full) {
                    const int key = first_key + 8 * n + 2 * t + e;
                    x = (key < key_end && key <= st.limit[half]) ? x : -INFINITY;
                    s[n][2 * half + e] = x;
                }
                tile_max = fmaxf(tile_max, x);
            }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float m_new = fmaxf(st.m[half], tile_max * scale_log2);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = ap_exp2_approx(st.m[half] - base);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float p = ap_exp2_approx(fmaf(s[n][2 * half + e], scale_log2, -base));
                s[n][2 * half + e] = p;
                sum += p;
            }
        st.l[half] = st.l[half] * alpha + sum;
        const bool grew = __any_sync(0xffffffffu, m_new != st.m[half]);
        st.m[half] = m_new;
        if (grew)
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
// + 8) of dims 16c + 2g, 2g + 1, which a prmt and ap_fp8x4_to_half2x2 cut into the B fragments
// of the even dims (acc[2c]) and the odd dims (acc[2c + 1]): lane (g, t) ends up holding dims
// 16c + 4t .. 4t + 3 of rows g and g + 8 (state_finish). Every pair is one cvt (the high pair of
// a register through its .H1 selector): 0.5 cvt per value, V's prmt 0.25 per value.
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
        for (int n = 0; n < 4; n++) {
            uint32_t b[2];
            ap_fp8x4_to_half2x2(r[n], b[0], b[1]);
            ap_mma_16816<__half>(s[n], st.q[c], b[0], b[1]);
        }
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
            // bytes (x0 x1) of key k, (x0 x1) of k + 1 -> (x0, x0 | x1, x1): one prmt, 2 cvt
            uint32_t even[2], odd[2];
            ap_fp8x4_to_half2x2(__byte_perm(r[2 * kk], 0u, 0x3120), even[0], odd[0]);
            ap_fp8x4_to_half2x2(__byte_perm(r[2 * kk + 1], 0u, 0x3120), even[1], odd[1]);
            ap_mma_16816<__half>(st.acc[2 * c], pa[kk], even[0], even[1]);
            ap_mma_16816<__half>(st.acc[2 * c + 1], pa[kk], odd[0], odd[1]);
        }
    }
}

// A pair of halves (bits) times a pair of scales (bits or __half2), as bits.
__device__ __forceinline__ uint32_t scaled_pair(uint32_t pair, __half2 scale) {
    const __half2 x = __hmul2(*reinterpret_cast<const __half2 *>(&pair), scale);
    return *reinterpret_cast<const uint32_t *>(&x);
}

__device__ __forceinline__ uint32_t scaled_pair(uint32_t pair, uint32_t scale) {
    return scaled_pair(pair, *reinterpret_cast<const __half2 *>(&scale));
}

// Block scales of nvfp4 chunks 2j and 2j + 1 (32 values each) for keys a and b (or a twice):
// word j of each scale row holds blocks 4j .. 4j + 3; sel picks bytes p and p + 2 of both (p:
// the lane's parity, which block of the chunk its fragments hold), so that first = (a's, b's)
// scale of block 4j + p and second = those of block 4j + 2 + p, as pairs of halves.
__device__ __forceinline__ void nvfp4_scale_word(const uint8_t *a, const uint8_t *b, int j,
                                                 uint32_t sel, uint32_t &first, uint32_t &second) {
    const uint32_t four = ap_nvfp4_prmt(reinterpret_cast<const uint32_t *>(a)[j],
                                        reinterpret_cast<const uint32_t *>(b)[j], sel);
    first = ap_fp8x2_to_half2_bits((uint16_t)four);
    second = ap_fp8x2_to_half2_bits((uint16_t)(four >> 16));
}

// The nvfp4 fragments both steps decode (tile_math_nvfp4, rows on M; tile_math_km, keys on M):
// K: key 8n + g's scales of blocks 2c + (t >> 1), both halves of a pair the same (bytes p, p,
// p + 2, p + 2), for chunks c and c + 1 (c even).
template <int SR>
__device__ __forceinline__ void nvfp4_k_scales(const uint8_t *scale_k, int c, int g, int t,
                                               uint32_t (&ks)[2][4]) {
    const uint32_t sel = (t >> 1) * 0x1111u + 0x2200u;
#pragma unroll
    for (int n = 0; n < 4; n++) {
        const uint8_t *row = scale_k + (8 * n + g) * SR;
        nvfp4_scale_word(row, row, c / 2, sel, ks[0][n], ks[1][n]);
    }
}

// K register r of ldmatrix (key 8n + g, dims 32c + 8t .. 8t + 7) as four scaled half pairs:
// dims 8t + {0, 2}, + {4, 6}, + {1, 3}, + {5, 7}.
__device__ __forceinline__ void nvfp4_k_pairs(uint32_t r, uint32_t sc, uint32_t (&b)[4]) {
    const ap_nvfp4_hi h = ap_nvfp4_hi_bytes(r);
    b[0] = scaled_pair(ap_nvfp4_pair14(h.even, 0, 1), sc);
    b[1] = scaled_pair(ap_nvfp4_pair14(h.even, 2, 3), sc);
    b[2] = scaled_pair(ap_nvfp4_pair14(h.odd, 0, 1), sc);
    b[3] = scaled_pair(ap_nvfp4_pair14(h.odd, 2, 3), sc);
}

// V: keys 16kk + 8m + 2t and + 1, their scales of blocks 2c + (g >> 2) as pairs (a's byte p,
// b's p, a's p + 2, b's), for chunks c and c + 1 (c even).
template <int SR>
__device__ __forceinline__ void nvfp4_v_scales(const uint8_t *scale_v, int c, int g, int t,
                                               uint32_t (&vs)[2][2][2]) {
    const uint32_t sel = (g >> 2) * 0x1111u + 0x6240u;
#pragma unroll
    for (int kk = 0; kk < 2; kk++)
#pragma unroll
        for (int m = 0; m < 2; m++) {
            const uint8_t *row = scale_v + (16 * kk + 8 * m + 2 * t) * SR;
            nvfp4_scale_word(row, row + SR, c / 2, sel, vs[0][kk][m], vs[1][kk][m]);
        }
}

// V register r of ldmatrix.trans (keys 2t, 2t + 1 of dims 32c + 4g .. 4g + 3) as four scaled
// half pairs, one per dim e (nibble 4j + e is key 2t + j, dim e: byte e / 2 (+ 2j) of .even /
// .odd).
__device__ __forceinline__ void nvfp4_v_pairs(uint32_t r, uint32_t scales, uint32_t (&b)[4]) {
    const ap_nvfp4_hi h = ap_nvfp4_hi_bytes(r);
    b[0] = scaled_pair(ap_nvfp4_pair14(h.even, 0, 2), scales);
    b[1] = scaled_pair(ap_nvfp4_pair14(h.odd, 0, 2), scales);
    b[2] = scaled_pair(ap_nvfp4_pair14(h.even, 1, 3), scales);
    b[3] = scaled_pair(ap_nvfp4_pair14(h.odd, 1, 3), scales);
}

// nvfp4 step over a sub-tile (32 rows of D / 2 bytes, swizzled; K at tile_k, V at tile_v; the
// scale rows of D / 16 bytes at scale_k, scale_v), converted to half in registers by the kit's
// short decode (ap_nvfp4_hi_bytes, ap_nvfp4_pair14: halves of value * 2^-14, times the block
// scale, exact; the caller folds 2^14 into the logit and output scales). One ldmatrix.x4 per
// 32-value chunk c reads keys 0..31 (lane = key). K: lane (g, t) gets key 8n + g, dims
// 32c + 8t .. 8t + 7 (one block scale), decoded into the B fragments of k-step 2c (dims 8t + 0,
// 2 | 4, 6) and 2c + 1 (dims 8t + 1, 3 | 5, 7) (Q loaded to match, state_begin). V (.trans):
// keys 2t, 2t + 1 (and + 8) of dims 32c + 4g .. 4g + 3; each prmt takes one dim e of both keys,
// times the two keys' block scales: the B fragment of n-block 4c + e (column g = dim
// 32c + 4g + e), so lane (g, t) ends up holding dims 32c + 8t .. 8t + 7 of rows g and g + 8
// (state_finish).
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
    uint32_t ks[2][4];
#pragma unroll
    for (int c = 0; c < C; c++) {
        if (c % 2 == 0) nvfp4_k_scales<SR>(scale_k, c, g, t, ks);
        uint32_t r[4];
        ap_ldmatrix_x4(r, tile_k + lane_row + ap_swizzle<C>(lane, c) * 16);
#pragma unroll
        for (int n = 0; n < 4; n++) {
            uint32_t b[4];
            nvfp4_k_pairs(r[n], ks[c % 2][n], b);
            ap_mma_16816<__half>(s[n], st.q[2 * c], b[0], b[1]);
            ap_mma_16816<__half>(s[n], st.q[2 * c + 1], b[2], b[3]);
        }
    }
    tile_softmax<D>(st, s, first_key, key_end, scale_log2, t);
    uint32_t pa[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; kk++) p_fragment<__half>(s, kk, pa[kk]);
    uint32_t vs[2][2][2];
#pragma unroll
    for (int c = 0; c < C; c++) {
        if (c % 2 == 0) nvfp4_v_scales<SR>(scale_v, c, g, t, vs);
        uint32_t r[4];
        ap_ldmatrix_x4_trans(r, tile_v + lane_row + ap_swizzle<C>(lane, c) * 16);
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t b[2][4];
#pragma unroll
            for (int m = 0; m < 2; m++) nvfp4_v_pairs(r[2 * kk + m], vs[c % 2][kk][m], b[m]);
#pragma unroll
            for (int e = 0; e < 4; e++)
                ap_mma_16816<__half>(st.acc[4 * c + e], pa[kk], b[0][e], b[1][e]);
        }
    }
}

} // namespace

#endif // AP_TRTLLM_MHA_DECODE_MATH_CUH
