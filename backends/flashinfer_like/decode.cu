// decode.cu: paged decode attention on tensor cores, one warp per planned KV segment (split-KV).
#include <cuda_runtime.h>
#include <math.h>

#include <type_traits>

#include "../common/cp_async.cuh"
#include "../common/cuda_status.cuh"
#include "../common/dispatch.cuh"
#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/nvfp4.cuh"
#include "../common/paged_kv.cuh"
#include "../common/softmax_state.cuh"
#include "../common/swizzle.cuh"
#include "fil.h"

#define FIL_WHO FIL_NAME ": decode"

namespace {

constexpr int kWarps = FIL_DECODE_WARPS;
constexpr int kSmemPerWarpTarget = 24 * 1024; // enough bytes in flight with two CTAs per SM

// Compile-time sizes of one (head dim, cache type) pair. A KV row is the head_dim elements of
// one (slot, KV head): row_bytes contiguous bytes, moved as 16-byte chunks. A step reads `tile`
// tokens as blocks of 16 (the mma's k): fp8 takes 32 per step (up to D128), halving the
// per-step softmax and bookkeeping that its doubled instructions per byte would otherwise
// leave exposed, and giving the warp two independent mma chains.
template <int HEAD_DIM, typename KV> struct decode_shape {
    static constexpr bool is_fp8 = sizeof(KV) == 1;
    static constexpr int tile = is_fp8 && HEAD_DIM <= 128 ? 32 : 16;
    static constexpr int blocks = tile / 16;
    static constexpr int row_bytes = HEAD_DIM * (int)sizeof(KV);
    static constexpr int chunks = row_bytes / 16;       // 4 .. 32
    static constexpr int tile_bytes = tile * row_bytes; // K (or V) of one step
    static constexpr int stage_bytes = 2 * tile_bytes;  // K and V
    static constexpr int stages_raw = kSmemPerWarpTarget / stage_bytes;
    static constexpr int stages = stages_raw < 2 ? 2 : (stages_raw > 8 ? 8 : stages_raw);
    static constexpr int warp_smem = stages * stage_bytes;
    static constexpr int rows_per_lane = tile * chunks / 32; // rows whose chunk a lane copies
    static constexpr int row_step = 32 / chunks;
    static constexpr int lookups = rows_per_lane; // page-table lookups per lane and tile
    static constexpr bool is_nvfp4 = false;
    static_assert(chunks >= 4 && chunks <= 32, "row of 64..512 bytes");
};

// NVFP4 KV (the kit's tag ap_nvfp4; plugin_api.h's layout): a row is HEAD_DIM / 2 bytes of E2M1 pairs and its
// HEAD_DIM / 16 E4M3 block scales in a buffer of their own. A stage holds 16 tokens as they are
// stored: K values [16][vals_row], V values, K scales [16][scales_row], V scales. Before the
// math, the warp decodes the stage into one 16-bit tile of the query type (nvfp4.cuh: e2m1 *
// e4m3 is exact in half), laid out as the 16-bit kernels' stage (decode_shape<D, __half>), and the
// 16-bit step runs on it in half (Q converted for bf16 queries, as fp8's); the global scales
// fold into scale_log2 and v_scale as fp8's.
template <int HEAD_DIM> struct decode_shape<HEAD_DIM, ap_nvfp4> {
    static constexpr bool is_fp8 = false;
    static constexpr bool is_nvfp4 = true;
    static constexpr int tile = 16;
    static constexpr int vals_row = HEAD_DIM / 2;
    static constexpr int scales_row = HEAD_DIM / AP_NVFP4_BLOCK; // 4, 8 or 16 bytes
    static constexpr int vals_tile = tile * vals_row;
    static constexpr int scales_tile = tile * scales_row;
    static constexpr int stage_bytes = 2 * (vals_tile + scales_tile);
    static constexpr int unpacked_bytes = 2 * tile * HEAD_DIM * 2; // K and V, 16-bit
    // a third of the bytes per token: fewer in flight per warp, more warps (3 CTAs at D128)
    static constexpr int ring_target = kSmemPerWarpTarget / 2 - unpacked_bytes / 2;
    static constexpr int stages_raw = ring_target / stage_bytes;
    static constexpr int stages = stages_raw < 2 ? 2 : (stages_raw > 8 ? 8 : stages_raw);
    static constexpr int warp_smem = stages * stage_bytes + unpacked_bytes;
    static constexpr int chunks = vals_row / 16; // 16-byte copies of a row's values: 2 .. 8
    static constexpr int rows_per_lane = tile * chunks / 32;
    static constexpr int row_step = 32 / chunks;
    static constexpr int lookups = rows_per_lane + 1; // and the scale row lane % 16
};

struct decode_args {
    const void *q; // [num_seqs][num_qo_heads][head_dim]
    void *out;     // same shape
    float *lse;    // [num_seqs][num_qo_heads] or NULL
    const uint8_t *k_pages;
    const uint8_t *v_pages;
    const int32_t *kv_page_indptr;
    const int32_t *kv_page_indices;
    const int32_t *worker_indptr;
    const int4 *segs; // fil_decode_seg
    const int32_t *seg_partial;
    float *partial_out;
    float *partial_lse;
    int32_t num_workers;
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t group;
    int32_t log2_page_size;
    float scale_log2;        // sm_scale * log2(e) * k_scale (fp8, nvfp4's global scale)
    float v_scale;           // 1 unless fp8 or nvfp4
    const uint8_t *k_scales; // nvfp4's block scales, else NULL
    const uint8_t *v_scales;
};

// Where a stream of tiles stands: segment index and the first token of the current tile.
struct decode_cursor {
    int seg, seg_stop;
    int seq, head, pos, begin, end;
    const int32_t *pages; // this sequence's page list
};

__device__ __forceinline__ void cursor_enter(decode_cursor &c, const decode_args &a) {
    if (c.seg >= c.seg_stop) return;
    int4 s = __ldg(a.segs + c.seg);
    c.seq = s.x;
    c.head = s.y;
    c.begin = c.pos = s.z;
    c.end = s.w;
    c.pages = a.kv_page_indices + __ldg(a.kv_page_indptr + c.seq);
}

template <int TILE>
__device__ __forceinline__ void cursor_next(decode_cursor &c, const decode_args &a) {
    c.pos += TILE;
    if (c.pos >= c.end) {
        c.seg++;
        cursor_enter(c, a);
    }
}

// The cache slots of the rows a lane copies for one tile, looked up one step before the copy is
// issued so the page-table reads overlap the math of the current tile.
template <class S> struct tile_rows {
    bool active;
    int head;
    int slot[S::lookups]; // -1: past the segment's end (zero-filled)
};

template <class S>
__device__ __forceinline__ tile_rows<S> tile_slots(const decode_cursor &c, const decode_args &a,
                                                   int lane) {
    tile_rows<S> t;
    t.active = c.seg < c.seg_stop;
    t.head = c.head;
#pragma unroll
    for (int i = 0; i < S::rows_per_lane; i++) {
        int pos = c.pos + lane / S::chunks + i * S::row_step;
        t.slot[i] =
            (t.active && pos < c.end) ? (int)ap_paged_slot(c.pages, pos, a.log2_page_size) : -1;
    }
    if constexpr (S::is_nvfp4) {
        int pos = c.pos + (lane & 15);
        t.slot[S::rows_per_lane] =
            (t.active && pos < c.end) ? (int)ap_paged_slot(c.pages, pos, a.log2_page_size) : -1;
    }
    return t;
}

// nvfp4: the lane's value chunks of K and V, then one scale row (lanes 0-15 K, 16-31 V).
template <class S>
__device__ __forceinline__ void tile_issue_nvfp4(const tile_rows<S> &t, uint32_t stage,
                                                 const decode_args &a, int lane) {
    const int chunk = lane % S::chunks;
#pragma unroll
    for (int i = 0; i < S::rows_per_lane; i++) {
        int row = lane / S::chunks + i * S::row_step;
        bool valid = t.slot[i] >= 0;
        int64_t src = valid ? ((int64_t)t.slot[i] * a.num_kv_heads + t.head) * S::vals_row : 0;
        uint32_t dst = row * S::vals_row + chunk * 16;
        ap_cp_async_16(stage + dst, a.k_pages + src + chunk * 16, valid);
        ap_cp_async_16(stage + S::vals_tile + dst, a.v_pages + src + chunk * 16, valid);
    }
    const int slot = t.slot[S::rows_per_lane];
    const bool is_v = lane >= 16;
    int64_t src = slot >= 0 ? ((int64_t)slot * a.num_kv_heads + t.head) * S::scales_row : 0;
    ap_cp_async_small<S::scales_row>(stage + 2 * S::vals_tile + is_v * S::scales_tile +
                                         (lane & 15) * S::scales_row,
                                     (is_v ? a.v_scales : a.k_scales) + src, slot >= 0);
}

template <class S>
__device__ __forceinline__ void tile_issue_rows(const tile_rows<S> &t, uint32_t stage_k,
                                                const decode_args &a, int lane) {
    const int chunk = lane % S::chunks;
    const uint32_t stage_v = stage_k + S::tile_bytes;
#pragma unroll
    for (int i = 0; i < S::rows_per_lane; i++) {
        int row = lane / S::chunks + i * S::row_step;
        bool valid = t.slot[i] >= 0;
        int64_t src =
            valid ? ((int64_t)t.slot[i] * a.num_kv_heads + t.head) * S::row_bytes + chunk * 16 : 0;
        uint32_t dst = row * S::row_bytes + ap_swizzle<S::chunks>(row, chunk) * 16;
        ap_cp_async_16(stage_k + dst, a.k_pages + src, valid);
        ap_cp_async_16(stage_v + dst, a.v_pages + src, valid);
    }
}

template <class S>
__device__ __forceinline__ void tile_issue(const tile_rows<S> &t, uint32_t stage,
                                           const decode_args &a, int lane) {
    if (!t.active) return;
    if constexpr (S::is_nvfp4)
        tile_issue_nvfp4<S>(t, stage, a, lane);
    else
        tile_issue_rows<S>(t, stage, a, lane);
}

// The online-softmax state of one warp over its current segment. Lane (g = lane/4, t = lane%4)
// holds query head g's running max m and its share of the denominator l (its 4 tokens of each
// step), and O^T fragments: acc[j] = O^T rows (head dims) of block j, columns heads 2t, 2t+1.
template <int HEAD_DIM> struct warp_state {
    uint32_t q[HEAD_DIM / 16][2]; // A fragments of Q (rows g >= group are zero)
    float acc[HEAD_DIM / 16][4];
    float m, l;
};

template <int HEAD_DIM, typename KV, typename QT>
__device__ __forceinline__ void state_begin(warp_state<HEAD_DIM> &st, const decode_cursor &c,
                                            const decode_args &a, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const bool has_head = g < a.group;
    const QT *qrow =
        static_cast<const QT *>(a.q) +
        ((int64_t)c.seq * a.num_qo_heads + c.head * a.group + (has_head ? g : 0)) * HEAD_DIM;
#pragma unroll
    for (int ks = 0; ks < HEAD_DIM / 16; ks++) {
        if constexpr (decode_shape<HEAD_DIM, KV>::is_fp8) {
            // The fp8 K fragment holds dims 4t..4t+3 (see decode_tile); Q is permuted to match
            // and converted to half, the type the fp8 path multiplies in.
            uint2 raw = has_head ? __ldg(reinterpret_cast<const uint2 *>(qrow + 16 * ks + 4 * t))
                                 : make_uint2(0, 0);
            float2 lo = ap_unpack2<QT>(raw.x), hi = ap_unpack2<QT>(raw.y);
            st.q[ks][0] = ap_pack2<__half>(lo.x, lo.y);
            st.q[ks][1] = ap_pack2<__half>(hi.x, hi.y);
        } else {
            const uint32_t *q32 = reinterpret_cast<const uint32_t *>(qrow + 16 * ks);
            st.q[ks][0] = has_head ? __ldg(q32 + t) : 0u;
            st.q[ks][1] = has_head ? __ldg(q32 + 4 + t) : 0u;
            if constexpr (decode_shape<HEAD_DIM, KV>::is_nvfp4 &&
                          !std::is_same<QT, __half>::value) {
                // nvfp4 multiplies in half (nvfp4_unpack_tile): the 16-bit layout, converted
                const float2 lo = ap_unpack2<QT>(st.q[ks][0]), hi = ap_unpack2<QT>(st.q[ks][1]);
                st.q[ks][0] = ap_pack2<__half>(lo.x, lo.y);
                st.q[ks][1] = ap_pack2<__half>(hi.x, hi.y);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 16; j++)
        st.acc[j][0] = st.acc[j][1] = st.acc[j][2] = st.acc[j][3] = 0.f;
    st.m = -INFINITY;
    st.l = 0.f;
}

// Online softmax of one step: per head the new max m' and sum l, P = 2^(s - m'), and O rescaled
// by 2^(m - m') (see decode_tile).
template <int HEAD_DIM, typename KV>
__device__ __forceinline__ void
decode_tile_softmax(warp_state<HEAD_DIM> &st,
                    const float (&s)[decode_shape<HEAD_DIM, KV>::blocks][2][4], int valid_tokens,
                    float scale_log2, int t, float (&p)[decode_shape<HEAD_DIM, KV>::blocks][4]) {
    constexpr int NB = decode_shape<HEAD_DIM, KV>::blocks;
    // Lane holds head g's logits of tokens 16b + {2t, 2t+1} (s[b][0]) and 16b + {8+2t, 9+2t}.
    float x[NB][4];
    float tile_max = -INFINITY;
#pragma unroll
    for (int b = 0; b < NB; b++) {
        const int token[4] = {16 * b + 2 * t, 16 * b + 2 * t + 1, 16 * b + 8 + 2 * t,
                              16 * b + 9 + 2 * t};
        const float raw[4] = {s[b][0][0], s[b][0][1], s[b][1][0], s[b][1][1]};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[b][i] = token[i] < valid_tokens ? raw[i] * scale_log2 : -INFINITY;
            tile_max = fmaxf(tile_max, x[b][i]);
        }
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(st.m, tile_max); // finite: every step has a valid token
    const float alpha = ap_exp2_approx(st.m - m_new);
    float p_sum = 0.f;
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p[b][i] = ap_exp2_approx(x[b][i] - m_new);
            p_sum += p[b][i];
        }
    st.l = st.l * alpha + p_sum;
    st.m = m_new;
    // O^T columns are heads 2t and 2t+1, whose alpha lives with lanes 4*(2t) and 4*(2t+1).
    const float alpha0 = __shfl_sync(0xffffffffu, alpha, 8 * t);
    const float alpha1 = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
    if (__any_sync(0xffffffffu, alpha != 1.f)) { // after the first steps the max rarely moves
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 16; j++) {
            st.acc[j][0] *= alpha0;
            st.acc[j][1] *= alpha1;
            st.acc[j][2] *= alpha0;
            st.acc[j][3] *= alpha1;
        }
    }
}

// The ldmatrix.x4 row addresses of one step: matrix i = lane/8 covers tokens 8*(i&1).. of each
// block of 16 and chunk +(i>>1); lrow[b] is the lane's row in block b, lrow_off[b] its byte offset.
template <class S> struct tile_lanes {
    int mat;
    int lrow[S::blocks];
    uint32_t lrow_off[S::blocks];
};

template <class S> __device__ __forceinline__ tile_lanes<S> tile_lanes_of(int lane) {
    tile_lanes<S> l;
    l.mat = lane >> 3;
#pragma unroll
    for (int b = 0; b < S::blocks; b++) {
        l.lrow[b] = 16 * b + (l.mat & 1) * 8 + (lane & 7);
        l.lrow_off[b] = l.lrow[b] * S::row_bytes;
    }
    return l;
}

// S = Q K^T of one step (16 x tile: rows are query heads, padded to 16; columns the tokens).
// fp8: K stays bytes in shared memory and the ldmatrix fragments are converted to half pairs;
// K's k-index is permuted (thread t holds dims 4t..4t+3 of each 16) and Q is loaded to match.
template <int HEAD_DIM, typename KV, typename MT>
__device__ __forceinline__ void
decode_tile_scores(const warp_state<HEAD_DIM> &st, uint32_t stage_k,
                   const tile_lanes<decode_shape<HEAD_DIM, KV>> &l,
                   float (&s)[decode_shape<HEAD_DIM, KV>::blocks][2][4]) {
    using S = decode_shape<HEAD_DIM, KV>;
#pragma unroll
    for (int b = 0; b < S::blocks; b++)
#pragma unroll
        for (int n = 0; n < 2; n++) s[b][n][0] = s[b][n][1] = s[b][n][2] = s[b][n][3] = 0.f;
#pragma unroll
    for (int b = 0; b < S::blocks; b++) {
        if constexpr (S::is_fp8) {
#pragma unroll
            for (int j = 0; j < HEAD_DIM / 32; j++) {
                uint32_t r[4];
                ap_ldmatrix_x4(r, stage_k + l.lrow_off[b] +
                                      ap_swizzle<S::chunks>(l.lrow[b], 2 * j + (l.mat >> 1)) * 16);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t a[4] = {st.q[2 * j + h][0], 0u, st.q[2 * j + h][1], 0u};
                    uint32_t k0 = r[2 * h], k1 = r[2 * h + 1];
                    ap_mma_16816<__half>(s[b][0], a, ap_fp8x2_to_half2_bits((uint16_t)k0),
                                         ap_fp8x2_to_half2_bits((uint16_t)(k0 >> 16)));
                    ap_mma_16816<__half>(s[b][1], a, ap_fp8x2_to_half2_bits((uint16_t)k1),
                                         ap_fp8x2_to_half2_bits((uint16_t)(k1 >> 16)));
                }
            }
        } else {
#pragma unroll
            for (int ks = 0; ks < HEAD_DIM / 16; ks++) {
                uint32_t r[4];
                ap_ldmatrix_x4(r, stage_k + l.lrow_off[b] +
                                      ap_swizzle<S::chunks>(l.lrow[b], 2 * ks + (l.mat >> 1)) * 16);
                const uint32_t a[4] = {st.q[ks][0], 0u, st.q[ks][1], 0u};
                ap_mma_16816<MT>(s[b][0], a, r[0], r[2]);
                ap_mma_16816<MT>(s[b][1], a, r[1], r[3]);
            }
        }
    }
}

// O^T += V^T P^T of one step (rows head dims, columns heads), P^T as the B operand: k = token,
// n = head g; the logits' C layout is exactly that. fp8: V^T's rows come out as even dims (rows
// 0-7) and odd dims (rows 8-15) of each 16.
template <int HEAD_DIM, typename KV, typename MT>
__device__ __forceinline__ void
decode_tile_accumulate(warp_state<HEAD_DIM> &st, uint32_t stage_v,
                       const tile_lanes<decode_shape<HEAD_DIM, KV>> &l,
                       const float (&p)[decode_shape<HEAD_DIM, KV>::blocks][4]) {
    using S = decode_shape<HEAD_DIM, KV>;
#pragma unroll
    for (int b = 0; b < S::blocks; b++) {
        const uint32_t pb0 = ap_pack2<MT>(p[b][0], p[b][1]);
        const uint32_t pb1 = ap_pack2<MT>(p[b][2], p[b][3]);
        if constexpr (S::is_fp8) {
#pragma unroll
            for (int j = 0; j < HEAD_DIM / 32; j++) {
                uint32_t r[4];
                ap_ldmatrix_x4_trans(r, stage_v + l.lrow_off[b] +
                                            ap_swizzle<S::chunks>(l.lrow[b], 2 * j + (l.mat >> 1)) *
                                                16);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    // bytes of r: V[2t][2g], V[2t][2g+1], V[2t+1][2g], V[2t+1][2g+1] (tokens
                    // 0-7, then 8-15 in the next register); regroup into (even dim) and (odd
                    // dim) pairs
                    uint32_t a[4];
                    ap_fp8x4_trans_split(r[2 * h], a[0], a[1]);
                    ap_fp8x4_trans_split(r[2 * h + 1], a[2], a[3]);
                    ap_mma_16816<__half>(st.acc[2 * j + h], a, pb0, pb1);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < HEAD_DIM / 16; j++) {
                uint32_t r[4];
                ap_ldmatrix_x4_trans(r, stage_v + l.lrow_off[b] +
                                            ap_swizzle<S::chunks>(l.lrow[b], 2 * j + (l.mat >> 1)) *
                                                16);
                const uint32_t a[4] = {r[0], r[2], r[1], r[3]};
                ap_mma_16816<MT>(st.acc[j], a, pb0, pb1);
            }
        }
    }
}

// One step: S::tile tokens of K and V in shared memory (stage_k, then V at + tile_bytes), as
// blocks of 16 (b = 0 .. blocks-1, rows 16b .. 16b+15):
//   S = Q K^T, then per head m' = max(m, max_j s_j), p_j = 2^(s_j - m'),
//   l = l 2^(m - m') + sum_j p_j, O^T = O^T 2^(m - m') + V^T P^T, all in float.
// Logits s_j are pre-scaled by sm_scale * log2(e) (and k_scale for fp8), so exp2 gives e^x.
template <int HEAD_DIM, typename KV, typename QT>
__device__ __forceinline__ void decode_tile(warp_state<HEAD_DIM> &st, uint32_t stage_k,
                                            int valid_tokens, float scale_log2, int lane) {
    using S = decode_shape<HEAD_DIM, KV>;
    using MT = typename std::conditional<S::is_fp8, __half, KV>::type;
    const tile_lanes<S> l = tile_lanes_of<S>(lane);
    float s[S::blocks][2][4];
    decode_tile_scores<HEAD_DIM, KV, MT>(st, stage_k, l, s);
    float p[S::blocks][4];
    decode_tile_softmax<HEAD_DIM, KV>(st, s, valid_tokens, scale_log2, lane & 3, p);
    decode_tile_accumulate<HEAD_DIM, KV, MT>(st, stage_k + S::tile_bytes, l, p);
}

// nvfp4: decode the stage at `stage` (K and V as stored) into the half tile at `unpacked`, where
// the 16-bit step reads it (half whatever the query type: 19 instructions per 8 values, bf16's
// decode takes 31; e2m1 * e4m3 is exact in both). Word w of the 2 * 16 rows of HEAD_DIM / 8 words: 8 values,
// one scale byte, one swizzled 16-byte chunk out; consecutive lanes read consecutive words.
template <int HEAD_DIM>
__device__ __forceinline__ void nvfp4_unpack_tile(uint32_t stage, uint32_t unpacked, int lane) {
    using P = decode_shape<HEAD_DIM, ap_nvfp4>;
    using U = decode_shape<HEAD_DIM, __half>;
    constexpr int words_row = HEAD_DIM / 8; // = U::chunks
    constexpr int words_tile = P::tile * words_row;
#pragma unroll
    for (int i = 0; i < 2 * words_tile / 32; i++) {
        const int w = lane + 32 * i;
        const int is_v = w / words_tile, row = (w % words_tile) / words_row, word = w % words_row;
        uint32_t vals, scale;
        asm volatile("ld.shared.b32 %0, [%1];\n"
                     : "=r"(vals)
                     : "r"(stage + is_v * P::vals_tile + row * P::vals_row + word * 4));
        asm volatile("ld.shared.u8 %0, [%1];\n"
                     : "=r"(scale)
                     : "r"(stage + 2 * P::vals_tile + is_v * P::scales_tile + row * P::scales_row +
                           word / 2));
        uint4 out;
        ap_nvfp4_dequant8_half2(vals, ap_nvfp4_scale_half2((uint8_t)scale),
                                reinterpret_cast<__half2 *>(&out));
        const uint32_t dst = unpacked + is_v * U::tile_bytes + row * U::row_bytes +
                             ap_swizzle<U::chunks>(row, word) * 16;
        ap_sts128(dst, out.x, out.y, out.z, out.w);
    }
}

// One step of any cache type: nvfp4 decodes its stage into `unpacked` first (and the lanes'
// writes must precede the other lanes' ldmatrix reads), the others read their stage directly.
template <int HEAD_DIM, typename KV, typename QT>
__device__ __forceinline__ void decode_step(warp_state<HEAD_DIM> &st, uint32_t stage,
                                            uint32_t unpacked, int valid_tokens, float scale_log2,
                                            int lane) {
    if constexpr (decode_shape<HEAD_DIM, KV>::is_nvfp4) {
        nvfp4_unpack_tile<HEAD_DIM>(stage, unpacked, lane);
        __syncwarp();
        decode_tile<HEAD_DIM, __half, QT>(st, unpacked, valid_tokens, scale_log2, lane);
    } else {
        decode_tile<HEAD_DIM, KV, QT>(st, stage, valid_tokens, scale_log2, lane);
    }
}

// Head dim of accumulator element e (0..3) of block j for this lane: the 16-bit path has rows
// g and g+8 of each 16; the fp8 path rows 2g and 2g+1 (see decode_tile).
template <bool FP8> __device__ __forceinline__ int acc_dim(int j, int e, int g) {
    return FP8 ? 16 * j + 2 * g + (e >> 1) : 16 * j + g + 8 * (e >> 1);
}

// End of a segment: o = O / l * v_scale and lse2 = m + log2(l) per head, written to the output
// (natural-log LSE) or, for a pair cut over several warps, to its partial slot.
template <int HEAD_DIM, typename KV, typename QT>
__device__ __forceinline__ void state_finish(const warp_state<HEAD_DIM> &st, const decode_cursor &c,
                                             const decode_args &a, int lane) {
    constexpr bool fp8 = decode_shape<HEAD_DIM, KV>::is_fp8;
    const int g = lane >> 2, t = lane & 3;
    float l = st.l + __shfl_xor_sync(0xffffffffu, st.l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float l0 = __shfl_sync(0xffffffffu, l, 8 * t);
    const float l1 = __shfl_sync(0xffffffffu, l, 8 * t + 4);
    const float inv[2] = {a.v_scale / l0, a.v_scale / l1};
    const int heads[2] = {2 * t, 2 * t + 1};
    const float lse2 = st.m + __log2f(l);
    const int slot = __ldg(a.seg_partial + c.seg);
    if (slot < 0) {
        QT *out = static_cast<QT *>(a.out) +
                  ((int64_t)c.seq * a.num_qo_heads + c.head * a.group) * HEAD_DIM;
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (heads[e & 1] < a.group)
                    out[heads[e & 1] * HEAD_DIM + acc_dim<fp8>(j, e, g)] =
                        ap_from_float<QT>(st.acc[j][e] * inv[e & 1]);
        if (a.lse != NULL && t == 0 && g < a.group)
            a.lse[(int64_t)c.seq * a.num_qo_heads + c.head * a.group + g] = ap_lse2_to_ln(lse2);
    } else {
        float *out = a.partial_out + (int64_t)slot * a.group * HEAD_DIM;
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (heads[e & 1] < a.group)
                    out[heads[e & 1] * HEAD_DIM + acc_dim<fp8>(j, e, g)] =
                        st.acc[j][e] * inv[e & 1];
        if (t == 0 && g < a.group) a.partial_lse[slot * a.group + g] = lse2;
    }
}

// Each warp is a worker streaming the tiles of its segments through a ring of `stages` shared
// buffers: while it computes tile i, tiles i+1 .. i+stages-2 are in flight and the page-table
// reads of tile i+stages-1 are pending. The stream runs on across segment boundaries.
template <int HEAD_DIM, typename KV, typename QT>
__global__ void __launch_bounds__(kWarps * 32) fil_decode_kernel(const decode_args a) {
    using S = decode_shape<HEAD_DIM, KV>;
    extern __shared__ __align__(128) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int worker = blockIdx.x * kWarps + warp;
    if (worker >= a.num_workers) return;
    const uint32_t ring = ap_smem_addr(smem + warp * S::warp_smem);

    decode_cursor load;
    load.seg = __ldg(a.worker_indptr + worker);
    load.seg_stop = __ldg(a.worker_indptr + worker + 1);
    cursor_enter(load, a);
    decode_cursor comp = load;

#pragma unroll
    for (int s = 0; s < S::stages - 1; s++) {
        tile_issue<S>(tile_slots<S>(load, a, lane), ring + s * S::stage_bytes, a, lane);
        ap_cp_async_commit();
        cursor_next<S::tile>(load, a);
    }

    warp_state<HEAD_DIM> st;
    int stage = 0;
    while (comp.seg < comp.seg_stop) {
        const tile_rows<S> next = tile_slots<S>(load, a, lane);
        if (comp.pos == comp.begin) state_begin<HEAD_DIM, KV, QT>(st, comp, a, lane);
        ap_cp_async_wait<S::stages - 2>();
        __syncwarp();
        decode_step<HEAD_DIM, KV, QT>(st, ring + stage * S::stage_bytes,
                                      ring + S::stages * S::stage_bytes, comp.end - comp.pos,
                                      a.scale_log2, lane);
        __syncwarp(); // every lane's reads of the freed stage precede the next copies into it
        int free_stage = stage == 0 ? S::stages - 1 : stage - 1;
        tile_issue<S>(next, ring + free_stage * S::stage_bytes, a, lane);
        ap_cp_async_commit();
        cursor_next<S::tile>(load, a);
        if (comp.pos + S::tile >= comp.end) state_finish<HEAD_DIM, KV, QT>(st, comp, a, lane);
        cursor_next<S::tile>(comp, a);
        stage = stage + 1 == S::stages ? 0 : stage + 1;
    }
    ap_cp_async_wait<0>();
}

typedef void (*decode_kernel_fn)(const decode_args);

struct decode_kernel_info {
    decode_kernel_fn kernel;
    int smem_bytes;
};

template <int HEAD_DIM, typename KV, typename QT> decode_kernel_info decode_variant() {
    return {fil_decode_kernel<HEAD_DIM, KV, QT>, kWarps * decode_shape<HEAD_DIM, KV>::warp_smem};
}

// The small dispatch: the only place that instantiates kernels (the kit's dispatch.cuh).
decode_kernel_info decode_dispatch(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype) {
    const decode_kernel_info none = {NULL, 0};
    return ap_dispatch_head_dim(head_dim, none, [&](auto dim) {
        return ap_dispatch_q(q_dtype, none, [&](auto q) {
            using QT = typename decltype(q)::type;
            return ap_dispatch_kv<QT, true>(kv_dtype, none, [&](auto kv) {
                return decode_variant<decltype(dim)::value, typename decltype(kv)::type, QT>();
            });
        });
    });
}

} // namespace

extern "C" ap_status fil_decode_max_workers(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype,
                                            int32_t sm_count, int32_t *out, ap_msgbuf *msg) {
    *out = 0;
    decode_kernel_info v = decode_dispatch(head_dim, q_dtype, kv_dtype);
    if (v.kernel == NULL) {
        ap_msgbuf_add(msg, FIL_WHO ": no kernel for head_dim %d, q dtype %d, kv dtype %d", head_dim,
                      (int)q_dtype, (int)kv_dtype);
        return AP_ERR_UNSUPPORTED;
    }
    ap_status status = ap_cuda_smem_optin(v.kernel, (size_t)v.smem_bytes, FIL_WHO, msg);
    if (status != AP_OK) return status;
    int blocks = 0;
    status = ap_cuda_status(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, v.kernel, kWarps * 32, v.smem_bytes),
        FIL_WHO, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", msg);
    if (status != AP_OK) return status;
    if (blocks < 1) {
        ap_msgbuf_add(msg, FIL_WHO ": the kernel does not fit on an SM (%d bytes of shared memory)",
                      v.smem_bytes);
        return AP_ERR_CUDA;
    }
    *out = blocks * kWarps * sm_count;
    return AP_OK;
}

// The kernel's arguments, straight from the entry's (model, layer, tensors) and the plan.
static decode_args decode_args_of(const ap_model *model, const ap_layer *layer,
                                  const ap_forward_args *args, const fil_batch_plan *plan,
                                  int group, int log2_page) {
    const ap_kv_cache *kv = layer->kv;
    const fil_decode_plan *dp = &plan->decode;
    const bool scaled = kv->dtype == AP_DTYPE_FP8_E4M3 || kv->dtype == AP_DTYPE_NVFP4;
    decode_args a;
    a.q = ap_kit_data(args->q);
    a.out = ap_kit_data(args->out);
    a.lse = args->lse != NULL ? static_cast<float *>(ap_kit_data(args->lse)) : NULL;
    a.k_pages = static_cast<const uint8_t *>(kv->k_pages);
    a.v_pages = static_cast<const uint8_t *>(kv->v_pages);
    a.kv_page_indptr = plan->kv_page_indptr;
    a.kv_page_indices = plan->kv_page_indices;
    a.k_scales = static_cast<const uint8_t *>(kv->k_block_scales);
    a.v_scales = static_cast<const uint8_t *>(kv->v_block_scales);
    a.worker_indptr = dp->worker_indptr;
    a.segs = reinterpret_cast<const int4 *>(dp->segs);
    a.seg_partial = dp->seg_partial;
    a.partial_out = dp->partial_out;
    a.partial_lse = dp->partial_lse;
    a.num_workers = dp->num_workers;
    a.num_qo_heads = model->num_qo_heads;
    a.num_kv_heads = kv->num_kv_heads;
    a.group = group;
    a.log2_page_size = log2_page;
    a.scale_log2 = layer->sm_scale * ap_log2e * (scaled ? layer->k_scale : 1.f);
    a.v_scale = scaled ? layer->v_scale : 1.f;
    return a;
}

extern "C" ap_status fil_decode_run(const ap_model *model, const ap_layer *layer,
                                    const ap_forward_args *args, const fil_batch_plan *plan,
                                    void *stream, ap_msgbuf *msg) {
    const ap_kv_cache *kv = layer->kv;
    decode_kernel_info v = decode_dispatch(kv->head_dim_qk, model->dtype, kv->dtype);
    const int log2_page = ap_page_shift(kv->page_size);
    const int group = kv->num_kv_heads > 0 ? model->num_qo_heads / kv->num_kv_heads : 0;
    if (v.kernel == NULL || log2_page < 0 || group < 1 || group > FIL_MAX_GROUP ||
        group * kv->num_kv_heads != model->num_qo_heads) {
        ap_msgbuf_add(msg,
                      FIL_WHO ": unsupported shape (head_dim %d, page size %d, %d query "
                              "heads over %d KV heads)",
                      kv->head_dim_qk, kv->page_size, model->num_qo_heads, kv->num_kv_heads);
        return AP_ERR_UNSUPPORTED;
    }
    if (plan->decode.num_workers == 0) return AP_OK;
    const decode_args a = decode_args_of(model, layer, args, plan, group, log2_page);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int blocks = (a.num_workers + kWarps - 1) / kWarps;
    v.kernel<<<blocks, kWarps * 32, v.smem_bytes, s>>>(a);
    ap_status status = ap_cuda_launch_status(FIL_WHO, "fil_decode_kernel", msg);
    if (status != AP_OK || plan->decode.num_merges == 0) return status;
    ap_kit_merge_args merge;
    merge.merges = plan->decode.merges;
    merge.num_merges = plan->decode.num_merges;
    merge.partial_out = a.partial_out;
    merge.partial_lse = a.partial_lse;
    merge.out_dtype = model->dtype;
    merge.group = group;
    merge.head_dim = kv->head_dim_qk;
    merge.num_qo_heads = model->num_qo_heads;
    merge.out = a.out;
    merge.lse = a.lse;
    return ap_kit_merge_states_run(&merge, stream, FIL_WHO, msg);
}
