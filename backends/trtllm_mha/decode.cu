// decode.cu: decode and multi-token decode over the paged NHD cache on tensor cores: the query
// heads of a group (times the new tokens) are the rows of one K/V tile; split-KV found on device.
#include <cuda_runtime.h>
#include <math.h>

#include <type_traits>

#include "../common/cp_async.cuh"
#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/nvfp4.cuh"
#include "../common/paged_kv.cuh"
#include "../common/pdl.cuh"
#include "../common/softmax_state.cuh"
#include "../common/swizzle.cuh"
#include "decode_flat.cuh"
#include "decode_math.cuh"
#include "mha.h"

#define MHA_WHO MHA_NAME ": decode"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
static_assert(kWarps * 16 == MHA_BLOCK_ROWS, "a warp holds 16 rows");

struct mha_nvfp4 {}; // cache element tag: E2M1 pairs and an e4m3 scale per 16 values

// Which head dims a lane's fragments hold (state_begin, state_finish).
enum { kLayout16 = 0, kLayoutFp8 = 1, kLayoutNvfp4 = 2 };

// Compile-time sizes of one (head dim, cache type, key warps, keys on M) set. KW warps take
// different 32-key sub-tiles of one step (KW = 4: one 16-row block, every warp on its own keys; KW = 1: four
// 16-row blocks on the same keys), so a stage holds KW * 32 keys. Every cache type lands in the
// ring as it is stored, rows of swizzled 16-byte chunks (nvfp4's scale rows after its value rows),
// and the math reads its fragments with ldmatrix: 16-bit tiles straight (tile_math), fp8 and
// nvfp4 converted to half in registers (tile_math_fp8, tile_math_nvfp4; every e4m3 value and
// every e2m1 x e4m3 product is exact in half). No 16-bit copy of a tile is ever stored.
// KM: nvfp4 with at most 8 rows per warp, keys on the M side of the mma (decode_keys_m.cuh):
// kKeysM2H (v2 over two KV heads per CTA, option nvfp4_keys_m auto where the heads pair up: a
// stage of 64 keys of each head, warps 2h, 2h + 1 on head h), kKeysM2 (v2 with one head: auto
// otherwise, option v2) or kKeysM (the first form: D = 64, option v1). kRowsM: rows on M.
enum { kRowsM = 0, kKeysM = 1, kKeysM2 = 2, kKeysM2H = 3 };
template <int D, typename KV, int KW, int KM = kRowsM> struct decode_shape {
    static constexpr bool is_nvfp4 = std::is_same<KV, mha_nvfp4>::value;
    static constexpr bool is_fp8 = std::is_same<KV, ap_fp8_e4m3>::value;
    static constexpr bool half_math = is_nvfp4 || is_fp8;
    static constexpr int layout = is_nvfp4 ? kLayoutNvfp4 : (is_fp8 ? kLayoutFp8 : kLayout16);
    static constexpr int raw_row = is_nvfp4 ? D / 2 : (is_fp8 ? D : D * 2);
    static constexpr int raw_chunks = raw_row / 16;
    static constexpr int scale_row = is_nvfp4 ? D / 16 : 0; // 4, 8 or 16 bytes
    static constexpr int heads = KM == kKeysM2H ? 2 : 1;    // KV heads per CTA
    static constexpr int rows = KW * kTile;                 // ring rows per stage
    static constexpr int keys = rows / heads;               // per stage
    static constexpr int block_rows = 16 * kWarps / KW;
    static constexpr int raw_tile = rows * (raw_row + scale_row);
    static constexpr int stage_bytes = 2 * raw_tile; // K then V
    // The page-table entries of a stage are loaded a step ahead (stage_pages) wherever every
    // thread takes the same number of a stage's copies (all but nvfp4 D64 with one key warp).
    static constexpr bool pages_ahead = keys * raw_chunks % kThreads == 0;
    // 16-bit caches with KW = kWarps over one head: warp w copies the rows of its own 32-key
    // sub-tile, the only rows it reads, so a split-grid step waits for that warp's copies alone
    // (__syncwarp), not for the CTA's (__syncthreads). H200, 2026-11-28: B64 L4096 bf16 -6.2%,
    // B32 D64 group 1 -19%; fp8 measured 0-2.6% slower that way, so it keeps the CTA's copies.
    static constexpr bool warp_private =
        KW == kWarps && heads == 1 && KM == kRowsM && !half_math && pages_ahead;
    // fp8: KW = 4's D128 96 KB ring holds 2 CTAs per SM, so no register cap there (ptxas would
    // aim at 168 for 3); D128 KW = 2's 64 KB ring holds 3: 168 registers as before (4 bytes
    // spilled, one local load per step). 0: the compiler's own choice.
    // KM: 4 CTAs (<= 128 registers, a ring of <= 56 KB: D128 3 stages of 18 KB).
    static constexpr int min_ctas =
        KM ? 4 : (!is_fp8 ? 0 : (KW == 4 ? 1 : (D == 128 && KW == 2 ? 3 : 0)));
    // 16-bit: one CTA per SM with ~200 KB of ring; fp8 / nvfp4 (conversion work per byte):
    // rings of <= 100 KB, so that two or more CTAs share an SM and their barriers interleave.
    static constexpr int ring_budget = (KM ? 56 : (half_math ? 100 : 200)) * 1024;
    static constexpr int stages_fit = ring_budget / stage_bytes;
    static constexpr int stages = stages_fit > 4 ? 4 : (stages_fit < 2 ? 2 : stages_fit);
    // KW > 1: the key warps' states merged through shared memory at the end of a CTA's range
    // (state_merge's regions; keys on M: km_merge's padded rows), the ring's bytes by then.
    static constexpr int merge_scratch_bytes = (kWarps / KW) * (KW - 1) * 16 * D * 4;
    static constexpr int merge_bytes = KW > 1
                                           ? (KM ? kWarps * 16 * (D + 2) * 4 : merge_scratch_bytes)
                                           : 0;
    static constexpr int ring_bytes = stages * stage_bytes;
    // The flat schedule (decode_flat.cuh) merges at every unit's end while the next unit's
    // stages are in flight: in the stage just computed, so its regions must fit one stage
    // (every 16-bit and fp8 set; nvfp4's rows-on-M stages are smaller: the split grid serves it).
    // D = 256 stays there too: its registers are full (the flat walk's state spilled 300-600
    // bytes against the split grid's 16-92).
    static constexpr bool flat = !KM && D <= 128 && merge_bytes <= stage_bytes;
    // The flat kernel's CTAs per SM: fp8 D128 KW = 2's cap of 168 registers spilled 460 bytes
    // with the walk's state; 2 CTAs of <= 255 registers instead (its 64 KB rings fit 3).
    static constexpr int flat_min_ctas = min_ctas == 3 ? 2 : min_ctas;
    static_assert(!(KM && flat) && flat_min_ctas >= 0, "keys on M: the split grid");

    static constexpr int smem = ring_bytes > merge_bytes ? ring_bytes : merge_bytes;
    static_assert(raw_chunks >= 2, "rows of at least 32 bytes");
    static_assert(!KM || (is_nvfp4 && KW == 4 && D <= 128), "keys on M: nvfp4, one row block");
    static_assert(KM < kKeysM2 || D == 128, "keys on M v2: D = 128");
    static_assert(heads == 1 || KW == 4, "v2h: two heads of two key warps");
};

struct decode_args {
    const void *q;
    void *out;
    float *lse;
    const uint8_t *k_pages, *v_pages, *k_scales, *v_scales;
    const int32_t *qo_indptr, *kv_page_indptr, *kv_page_indices, *seq_lens;
    float *partial_out, *partial_lse;
    int32_t num_qo_heads, num_kv_heads, group, log2_page_size, num_splits, row_blocks, num_seqs;
    float scale_log2; // sm_scale * log2(e) * k_scale
    float v_scale;
};

// A cp.async of 4, 8 or 16 bytes (the nvfp4 scale rows), zero-filled when !valid.
template <int BYTES>
__device__ __forceinline__ void cp_async_small(uint32_t dst, const void *src, bool valid) {
    if constexpr (BYTES == 16) {
        ap_cp_async_16(dst, src, valid);
    } else {
        int src_bytes = valid ? BYTES : 0;
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                     "n"(BYTES), "r"(src_bytes)
                     : "memory");
    }
}

// Where one CTA stands: its sequence, rows and KV range [key_begin, key_end).
struct cta_work {
    int seq, kv_head, block, q_start, q_len, prefix, rows;
    int key_begin, key_end;
    const int32_t *pages;
};

} // namespace

#include "decode_keys_m.cuh" // the keys-on-M nvfp4 step and its state (needs the two above)

namespace {

// S::pages_ahead: lane j of every warp holds the page-table entry of stage `index`'s j-th page (0
// from key_end on; a stage of <= 128 keys spans <= 9 pages of >= 16), loaded one step before the
// stage's copies are issued, so that the page table's latency stays off the step.
template <class S>
__device__ __forceinline__ int32_t stage_pages(const cta_work &w, const decode_args &a, int index,
                                               int lane) {
    if constexpr (!S::pages_ahead) return 0;
    const int entry = ((w.key_begin + index * S::keys) >> a.log2_page_size) + lane;
    return (entry << a.log2_page_size) < w.key_end ? __ldg(w.pages + entry) : 0;
}

// The K and V copies of one 16-byte chunk of a stage's row (zero-filled when !valid).
template <class S>
__device__ __forceinline__ void chunk_copy(const cta_work &w, const decode_args &a, uint32_t stage,
                                           int row, int chunk, int64_t slot, bool valid) {
    const int64_t src = (slot * a.num_kv_heads + w.kv_head) * S::raw_row + chunk * 16;
    const uint32_t dst = row * S::raw_row + ap_swizzle<S::raw_chunks>(row, chunk) * 16;
    ap_cp_async_16(stage + dst, a.k_pages + src, valid);
    ap_cp_async_16(stage + S::raw_tile + dst, a.v_pages + src, valid);
}

// S::pages_ahead: the K and V copies of chunk `chunk` of the stage's row `row` (key first + row),
// its page-table entry shuffled from the lane that holds it (stage_pages); k_src / v_src point at
// the chunk of the KV head's row in slot 0. A slot fits 32 bits (K and V each hold slots * H *
// raw_row bytes of device memory): one wide multiply-add per address.
template <class S>
__device__ __forceinline__ void
row_copy_ahead(uint32_t stage, const uint8_t *k_src, const uint8_t *v_src, uint32_t stride,
               int first, int row, int chunk, int shift, int32_t pages, int key_end) {
    const int pos = first + row;
    const uint32_t page = __shfl_sync(0xffffffffu, pages, (pos >> shift) - (first >> shift));
    const bool valid = pos < key_end;
    const uint32_t slot = valid ? (page << shift) + (pos & ((1 << shift) - 1)) : 0u;
    const uint32_t dst = row * S::raw_row + ap_swizzle<S::raw_chunks>(row, chunk) * 16;
    ap_cp_async_16(stage + dst, k_src + (uint64_t)slot * stride, valid);
    ap_cp_async_16(stage + S::raw_tile + dst, v_src + (uint64_t)slot * stride, valid);
}

// Issue the copies of stage `index` (keys key_begin + S::keys * index ..) into a stage buffer.
// S::pages_ahead: `pages` is the stage's stage_pages, each copy takes its row's entry by a
// shuffle; a thread's copies are one chunk of rows r, r + kThreads / chunks, .. (fully unrolled:
// constant swizzle, dst offsets immediate). Else each copy reads its page-table entry.
template <class S>
__device__ __forceinline__ void tile_issue(const cta_work &w, const decode_args &a, int index,
                                           uint32_t stage, int32_t pages) {
    const int first = w.key_begin + index * S::keys;
    constexpr int copies = S::keys * S::raw_chunks;
    if constexpr (S::warp_private) {
        // lane t of warp w: chunk t % raw_chunks of rows 32 w + t / raw_chunks + j (32 /
        // raw_chunks), the sub-tile's 32 rows in raw_chunks rounds
        static_assert(32 % S::raw_chunks == 0 && kTile * S::raw_chunks % 32 == 0, "whole rounds");
        const int lane = threadIdx.x & 31, shift = a.log2_page_size;
        const int chunk = lane % S::raw_chunks, row0 = (threadIdx.x >> 5) * kTile;
        const uint32_t stride = (uint32_t)a.num_kv_heads * S::raw_row;
        const int64_t head = (int64_t)w.kv_head * S::raw_row + chunk * 16;
        const uint8_t *k_src = a.k_pages + head, *v_src = a.v_pages + head;
#pragma unroll
        for (int j = 0; j < kTile * S::raw_chunks / 32; j++) {
            const int row = row0 + lane / S::raw_chunks + j * (32 / S::raw_chunks);
            row_copy_ahead<S>(stage, k_src, v_src, stride, first, row, chunk, shift, pages,
                              w.key_end);
        }
    } else if constexpr (S::pages_ahead) {
        static_assert(copies % kThreads == 0 && kThreads % S::raw_chunks == 0,
                      "every lane shuffles in every round");
        const int shift = a.log2_page_size, chunk = threadIdx.x % S::raw_chunks;
        const uint32_t stride = (uint32_t)a.num_kv_heads * S::raw_row;
        const int64_t head = (int64_t)w.kv_head * S::raw_row + chunk * 16;
        const uint8_t *k_src = a.k_pages + head, *v_src = a.v_pages + head;
#pragma unroll
        for (int j = 0; j < copies / kThreads; j++) {
            const int row = threadIdx.x / S::raw_chunks + j * (kThreads / S::raw_chunks);
            row_copy_ahead<S>(stage, k_src, v_src, stride, first, row, chunk, shift, pages,
                              w.key_end);
        }
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < copies; i += kThreads) {
            const int row = i / S::raw_chunks, chunk = i % S::raw_chunks;
            const int pos = first + row;
            const bool valid = pos < w.key_end;
            const int64_t slot = valid ? ap_paged_slot(w.pages, pos, a.log2_page_size) : 0;
            chunk_copy<S>(w, a, stage, row, chunk, slot, valid);
        }
    }
    if constexpr (S::is_nvfp4) {
        // One scale row per thread, whole warps (S::keys: 32, 64 or 128): no loop, no divergent
        // shuffle; a page-ahead slot fits 32 bits as above (one wide multiply-add per address).
        static_assert(S::keys % 32 == 0 && S::keys <= kThreads, "a scale row per thread");
        const int row = threadIdx.x;
        if (row < S::keys) {
            const int pos = first + row, shift = a.log2_page_size;
            const bool valid = pos < w.key_end;
            uint64_t slot = 0u;
            if constexpr (S::pages_ahead) {
                const uint32_t page =
                    __shfl_sync(0xffffffffu, pages, (pos >> shift) - (first >> shift));
                slot = valid ? (page << shift) + (pos & ((1 << shift) - 1)) : 0u;
            } else {
                slot = valid ? (uint64_t)ap_paged_slot(w.pages, pos, shift) : 0u;
            }
            const uint64_t src = slot * ((uint32_t)a.num_kv_heads * S::scale_row) +
                                 (uint32_t)w.kv_head * S::scale_row;
            const uint32_t dst = S::keys * S::raw_row + row * S::scale_row;
            cp_async_small<S::scale_row>(stage + dst, a.k_scales + src, valid);
            cp_async_small<S::scale_row>(stage + S::raw_tile + dst, a.v_scales + src, valid);
        }
    }
}

// The K fragments of fp8 hold dims 4t..4t+3 of each 16 (tile_math_fp8), those of nvfp4 dims
// 8t..8t+7 of each 32, even dims in k-step 2c, odd in 2c + 1 (tile_math_nvfp4), so Q is loaded
// to match (LAYOUT: kLayout16/Fp8/Nvfp4).
template <int D, typename MT, typename QT, int LAYOUT>
__device__ __forceinline__ void state_begin(warp_state<D> &st, const cta_work &w,
                                            const decode_args &a, int first_row, int lane) {
    const int g = lane >> 2, t = lane & 3;
    st.upper = first_row + 8 < w.rows;
    st.prefix = w.prefix;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = first_row + g + 8 * half;
        const bool live = r < w.rows;
        const int token = live ? r / a.group : 0, head = live ? r % a.group : 0;
        st.limit[half] = w.prefix + token;
        const QT *qrow =
            static_cast<const QT *>(a.q) +
            ((int64_t)(w.q_start + token) * a.num_qo_heads + w.kv_head * a.group + head) * D;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                uint32_t v = 0u;
                if constexpr (LAYOUT == kLayoutNvfp4) { // dims 8t + (ks & 1) + 4 hi, + 2
                    const int dim = 32 * (ks >> 1) + 8 * t + (ks & 1) + 4 * hi;
                    const uint16_t *q16 = reinterpret_cast<const uint16_t *>(qrow);
                    if (live) v = (uint32_t)__ldg(q16 + dim) | (uint32_t)__ldg(q16 + dim + 2) << 16;
                } else {
                    const int dim =
                        16 * ks + (LAYOUT == kLayoutFp8 ? 4 * t + 2 * hi : 8 * hi + 2 * t);
                    if (live) v = __ldg(reinterpret_cast<const uint32_t *>(qrow + dim));
                }
                if constexpr (!std::is_same<MT, QT>::value) {
                    const float2 f = ap_unpack2<QT>(v);
                    v = ap_pack2<MT>(f.x, f.y);
                }
                st.q[ks][half + 2 * hi] = v;
            }
        }
        st.m[half] = -INFINITY;
        st.l[half] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < D / 8; j++) st.acc[j][0] = st.acc[j][1] = st.acc[j][2] = st.acc[j][3] = 0.f;
}

// End of the CTA's range: o = O / l * v_scale, lse2 = m + log2(l) (a row without keys: o = 0,
// lse2 = -inf), to the output rows (partial < 0) or to partial slot `partial`. local0: the warp's first row in
// the CTA's block of block_rows. Lane t holds dims 8j + 2t, + 1 (16-bit), 16c + 4t .. 4t + 3
// (fp8, tile_math_fp8) or 32c + 8t .. 8t + 7 (nvfp4, tile_math_nvfp4).
template <int D, typename QT, int LAYOUT>
__device__ __forceinline__ void state_finish(warp_state<D> &st, const cta_work &w,
                                             const decode_args &a, int64_t partial, int local0,
                                             int block_rows, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float l = st.l[half] + __shfl_xor_sync(0xffffffffu, st.l[half], 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.f ? a.v_scale / l : 0.f;
        const float lse2 = l > 0.f ? st.m[half] + __log2f(l) : -INFINITY;
        const int local = local0 + g + 8 * half;
        const int r = w.block * block_rows + local;
        if (r >= w.rows) continue;
        if (partial < 0) {
            const int64_t row = (int64_t)(w.q_start + r / a.group) * a.num_qo_heads +
                                w.kv_head * a.group + r % a.group;
            QT *out = static_cast<QT *>(a.out) + row * D;
            if constexpr (LAYOUT == kLayoutNvfp4) {
#pragma unroll
                for (int c = 0; c < D / 32; c++) {
                    const float(*x)[4] = st.acc + 4 * c;
                    uint4 v;
                    v.x = ap_pack2<QT>(x[0][2 * half] * inv, x[1][2 * half] * inv);
                    v.y = ap_pack2<QT>(x[2][2 * half] * inv, x[3][2 * half] * inv);
                    v.z = ap_pack2<QT>(x[0][2 * half + 1] * inv, x[1][2 * half + 1] * inv);
                    v.w = ap_pack2<QT>(x[2][2 * half + 1] * inv, x[3][2 * half + 1] * inv);
                    *reinterpret_cast<uint4 *>(out + 32 * c + 8 * t) = v;
                }
            } else if constexpr (LAYOUT == kLayoutFp8) {
#pragma unroll
                for (int c = 0; c < D / 16; c++) {
                    const float(&e)[4] = st.acc[2 * c], (&o)[4] = st.acc[2 * c + 1];
                    *reinterpret_cast<uint2 *>(out + 16 * c + 4 * t) =
                        make_uint2(ap_pack2<QT>(e[2 * half] * inv, o[2 * half] * inv),
                                   ap_pack2<QT>(e[2 * half + 1] * inv, o[2 * half + 1] * inv));
                }
            } else {
#pragma unroll
                for (int j = 0; j < D / 8; j++)
                    *reinterpret_cast<uint32_t *>(out + 8 * j + 2 * t) =
                        ap_pack2<QT>(st.acc[j][2 * half] * inv, st.acc[j][2 * half + 1] * inv);
            }
            if (a.lse != NULL && t == 0) a.lse[row] = ap_lse2_to_ln(lse2);
        } else {
            float *out = a.partial_out + (partial * MHA_BLOCK_ROWS + local) * D;
            if constexpr (LAYOUT == kLayoutNvfp4) {
#pragma unroll
                for (int c = 0; c < D / 32; c++) {
                    const float(*x)[4] = st.acc + 4 * c;
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        *reinterpret_cast<float4 *>(out + 32 * c + 8 * t + 4 * h) =
                            make_float4(x[0][2 * half + h] * inv, x[1][2 * half + h] * inv,
                                        x[2][2 * half + h] * inv, x[3][2 * half + h] * inv);
                }
            } else if constexpr (LAYOUT == kLayoutFp8) {
#pragma unroll
                for (int c = 0; c < D / 16; c++) {
                    const float(&e)[4] = st.acc[2 * c], (&o)[4] = st.acc[2 * c + 1];
                    *reinterpret_cast<float4 *>(out + 16 * c + 4 * t) =
                        make_float4(e[2 * half] * inv, o[2 * half] * inv, e[2 * half + 1] * inv,
                                    o[2 * half + 1] * inv);
                }
            } else {
#pragma unroll
                for (int j = 0; j < D / 8; j++)
                    *reinterpret_cast<float2 *>(out + 8 * j + 2 * t) =
                        make_float2(st.acc[j][2 * half] * inv, st.acc[j][2 * half + 1] * inv);
            }
            if (t == 0) a.partial_lse[partial * MHA_BLOCK_ROWS + local] = lse2;
        }
    }
}

// KW > 1: the warps of one row block hold states over different keys; warps 1..KW-1 leave theirs
// in shared memory (O unnormalised in `scratch`, m and the full l per row in `ml`) and warp 0
// folds them in:
//   M = max_k m_k, O = sum_k O_k 2^(m_k - M), l = sum_k l_k 2^(m_k - M).
// (A row whose keys all lie past its causal limit in one warp has m_k = -inf: weight 0.)
// Key warp k >= 1 of row block b has region b (KW - 1) + k - 1: 16 rows of D floats, each row's
// 8-float groups XORed with its row (conflict-free float2 stores and loads), so the regions take
// merge_scratch_bytes: they fit one ring stage wherever the flat schedule runs (decode_shape).
// The caller's barrier comes first (the scratch is free); one barrier inside.
__device__ __forceinline__ int merge_col(int row, int col) {
    return col ^ ((row & 7) * 8);
}

template <int D>
__device__ __forceinline__ void state_merge(warp_state<D> &st, float *scratch, float2 *ml,
                                            int block, int kg, int kw, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const int region0 = block * (kw - 1) - 1; // key warp k's region: region0 + k
    if (kg > 0) {
        float *mine = scratch + (region0 + kg) * 16 * D;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int row = g + 8 * half;
            float l = st.l[half] + __shfl_xor_sync(0xffffffffu, st.l[half], 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
#pragma unroll
            for (int j = 0; j < D / 8; j++)
                *reinterpret_cast<float2 *>(mine + row * D + merge_col(row, 8 * j + 2 * t)) =
                    make_float2(st.acc[j][2 * half], st.acc[j][2 * half + 1]);
            if (t == 0) ml[(region0 + kg) * 16 + row] = make_float2(st.m[half], l);
        }
    }
    __syncthreads();
    if (kg > 0) return;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = g + 8 * half;
        float l = st.l[half] + __shfl_xor_sync(0xffffffffu, st.l[half], 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float m = st.m[half];
        for (int k = 1; k < kw; k++) m = fmaxf(m, ml[(region0 + k) * 16 + row].x);
        const float ref = m == -INFINITY ? 0.f : m;
        const float own = ap_exp2_approx(st.m[half] - ref);
        l *= own;
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            st.acc[j][2 * half] *= own;
            st.acc[j][2 * half + 1] *= own;
        }
        for (int k = 1; k < kw; k++) {
            const float *other = scratch + (region0 + k) * 16 * D + row * D;
            const float2 their = ml[(region0 + k) * 16 + row];
            const float wk = ap_exp2_approx(their.x - ref);
            l += their.y * wk;
#pragma unroll
            for (int j = 0; j < D / 8; j++) {
                const float2 o =
                    *reinterpret_cast<const float2 *>(other + merge_col(row, 8 * j + 2 * t));
                st.acc[j][2 * half] += o.x * wk;
                st.acc[j][2 * half + 1] += o.y * wk;
            }
        }
        st.m[half] = m;
        st.l[half] = t == 0 ? l : 0.f; // state_finish sums the four lanes' shares
    }
}

// The keys a row block of w (its rows, prefix and block set) can see, causal: 0 .. the prefix
// plus its last row's token, at most seq_len. The split grid's CTA and the flat schedule's
// pieces both range over them.
__device__ __forceinline__ int cta_work_keys(const cta_work &w, const decode_args &a,
                                             int block_rows, int seq_len) {
    const int last_row = min(w.rows, (w.block + 1) * block_rows) - 1;
    return min(seq_len, w.prefix + last_row / a.group + 1);
}

// The CTA's share: rows [block * block_rows, ..) of (sequence, KV head) and split s of the
// stages of keys the block's last row can see (causal): keys 0 .. prefix + last token.
// heads: KV heads per CTA (v2h: 2, the CTA's first head kv_head = 2 blockIdx.y; one row block).
__device__ __forceinline__ bool cta_work_find(const decode_args &a, int block_rows, int stage_keys,
                                              cta_work &w, int heads = 1) {
    w.seq = blockIdx.z;
    w.kv_head = heads * (blockIdx.y / a.row_blocks);
    w.block = blockIdx.y % a.row_blocks;
    // The four loads at once (seq < num_seqs): one latency before the page table, not two. The
    // early return tests the last two as well (never true for a valid batch), so that the
    // compiler cannot sink them below it.
    w.q_start = __ldg(a.qo_indptr + w.seq);
    const int q_end = __ldg(a.qo_indptr + w.seq + 1), seq_len = __ldg(a.seq_lens + w.seq);
    const int page_start = __ldg(a.kv_page_indptr + w.seq);
    w.q_len = q_end - w.q_start;
    w.rows = w.q_len * a.group;
    if (w.block * block_rows >= w.rows || (seq_len | page_start) < 0) return false;
    w.pages = a.kv_page_indices + page_start;
    w.prefix = seq_len - w.q_len;
    const int keys = cta_work_keys(w, a, block_rows, seq_len);
    const int stages = (keys + stage_keys - 1) / stage_keys;
    const int per = (stages + a.num_splits - 1) / a.num_splits;
    w.key_begin = min(keys, (int)blockIdx.x * per * stage_keys);
    w.key_end = min(keys, ((int)blockIdx.x + 1) * per * stage_keys);
    return true;
}

// One warp's math on its sub-tile `sub` of the stage at ring offset at_i: keys first_key .. (<
// key_end), the cache type's fragments (and nvfp4's scale rows after the value rows).
template <class S, int D, int KM, typename MT, class ST>
__device__ __forceinline__ void tile_step(ST &st, const uint8_t *smem, int at_i, int sub,
                                          int first_key, int key_end, float scale_log2, int lane) {
    const uint32_t tile_k = ap_smem_addr(smem) + at_i + sub * kTile * S::raw_row;
    const uint32_t tile_v = tile_k + S::raw_tile;
    if constexpr (S::is_nvfp4) {
        const uint8_t *scales = smem + at_i + S::rows * S::raw_row + sub * kTile * S::scale_row;
        if constexpr (KM >= kKeysM2) {
            if (km_step_full(st, first_key, key_end))
                tile_math_km2<false>(st, tile_k, tile_v, scales, scales + S::raw_tile, first_key,
                                     key_end, scale_log2, lane);
            else
                tile_math_km2<true>(st, tile_k, tile_v, scales, scales + S::raw_tile, first_key,
                                    key_end, scale_log2, lane);
        } else if constexpr (KM != kRowsM)
            tile_math_km<D>(st, tile_k, tile_v, scales, scales + S::raw_tile, first_key, key_end,
                            scale_log2, lane);
        else
            tile_math_nvfp4<D>(st, tile_k, tile_v, scales, scales + S::raw_tile, first_key, key_end,
                               scale_log2, lane);
    } else if constexpr (S::is_fp8) {
        tile_math_fp8<D>(st, tile_k, tile_v, first_key, key_end, scale_log2, lane);
    } else {
        tile_math<D, MT>(st, tile_k, tile_v, first_key, key_end, scale_log2, lane);
    }
}

// The ring: stages i + 1 .. i + stages - 1 are in flight while stage i is computed. One barrier
// per step frees the oldest stage (every warp has finished the previous step) before it is
// refilled. Warp w takes rows
// (w / KW) * 16 .. of the block and the 32-key sub-tile w % KW of each stage.
template <int D, typename KV, typename QT, int KW, int KM>
__global__ void __launch_bounds__(kThreads, (decode_shape<D, KV, KW, KM>::min_ctas))
    mha_decode_kernel(const decode_args a) {
    using S = decode_shape<D, KV, KW, KM>;
    using MT = typename std::conditional<S::half_math, __half, QT>::type;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ float2 merge_ml[KW > 1 && !KM ? kWarps * 16 : 1]; // state_merge's m and l
    cta_work w;
    if (!cta_work_find(a, S::block_rows, S::keys, w, S::heads)) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // KG key warps per head; v2h: warp w on head kv_head + w / 2, keys 32 (w % 2) of a stage, its
    // ring sub-tile w (rows 64 h + 32 (w % 2)); else sub-tile kg.
    constexpr int KG = KW / S::heads;
    const int kg = warp % KG, local0 = S::heads > 1 ? 0 : (warp / KW) * 16;
    const int sub = S::heads > 1 ? warp : kg;
    const bool has_rows = w.block * S::block_rows + local0 < w.rows;
    const uint32_t ring = ap_smem_addr(smem);
    const int steps = (w.key_end - w.key_begin + S::keys - 1) / S::keys;
    km2_sources from = {NULL, NULL};
    if constexpr (KM == kKeysM2H)
        from = km2_sources_of<S, 8>(w, a);
    else if constexpr (KM >= kKeysM2)
        from = km2_sources_of<S>(w, a);
    // The copies of stage `index` into the ring at `stage`, by the set's copy pattern.
    auto issue = [&](int index, uint32_t stage, int32_t pages) {
        if constexpr (KM == kKeysM2H)
            tile_issue_km2h<S>(w, a, from, index, stage, pages);
        else if constexpr (KM >= kKeysM2)
            tile_issue_km2<S>(w, a, from, index, stage, pages);
        else
            tile_issue<S>(w, a, index, stage, pages);
    };
#pragma unroll
    for (int s = 0; s < S::stages - 1; s++) {
        if (s < steps) issue(s, ring + s * S::stage_bytes, stage_pages<S>(w, a, s, lane));
        ap_cp_async_commit();
    }
    int32_t pages_next = stage_pages<S>(w, a, S::stages - 1, lane);
    static_assert(!KM || S::layout == kLayoutNvfp4, "keys on M: nvfp4's dim order");
    typename std::conditional<KM != kRowsM, km_state<D>, warp_state<D>>::type st;
    cta_work wh = w; // the warp's head
    if constexpr (S::heads > 1) wh.kv_head += warp / KG;
    if constexpr (KM != kRowsM)
        km_begin<D, QT>(st, wh, a, w.block * S::block_rows + local0, lane);
    else
        state_begin<D, MT, QT, S::layout>(st, w, a, w.block * S::block_rows + local0, lane);
    // keys on M v2 / v2h: the ring offsets of steps i and i + stages - 1 kept as running
    // counters, not i % stages (a multiply-high and two more per use for 3 stages)
    int ring_i = 0, ring_next = (S::stages - 1) * S::stage_bytes;
    for (int i = 0; i < steps; i++) {
        ap_cp_async_wait<S::stages - 2>();
        if constexpr (S::warp_private)
            __syncwarp(); // this warp's rows of stage i landed; its rows of stage i - 1 are free
        else
            __syncthreads();
        const int next = i + S::stages - 1;
        if (next < steps) {
            issue(next, ring + (KM >= kKeysM2 ? ring_next : (next % S::stages) * S::stage_bytes),
                  pages_next);
            pages_next = stage_pages<S>(w, a, next + 1, lane);
        }
        ap_cp_async_commit();
        const int first_key = w.key_begin + i * S::keys + kg * kTile;
        const int at_i = KM >= kKeysM2 ? ring_i : (i % S::stages) * S::stage_bytes;
        if constexpr (KM >= kKeysM2) {
            ring_i = ring_i + S::stage_bytes == S::ring_bytes ? 0 : ring_i + S::stage_bytes;
            ring_next =
                ring_next + S::stage_bytes == S::ring_bytes ? 0 : ring_next + S::stage_bytes;
        }
        if (has_rows && first_key < w.key_end)
            tile_step<S, D, KM, MT>(st, smem, at_i, sub, first_key, w.key_end, a.scale_log2, lane);
    }
    ap_cp_async_wait<0>();
    ap_pdl_launch_dependents(); // the combine's CTAs may take their slots; it waits for our writes
    if constexpr (KG > 1) {
        __syncthreads(); // the ring is free: its bytes hold the warps' states
        if constexpr (KM != kRowsM)
            km_merge<D>(st, reinterpret_cast<float *>(smem), warp - kg, kg, KG, lane);
        else
            state_merge<D>(st, reinterpret_cast<float *>(smem), merge_ml, warp / KW, kg, KG, lane);
        if (kg > 0) return;
    }
    if (!has_rows) return;
    // The partial slot of (sequence, KV head, row block, split), as the one-head kernel's: v2h
    // writes each head's state where a CTA of that head alone would have (combine.cu's layout).
    const int64_t partial =
        S::heads > 1 ? (((int64_t)w.seq * a.num_kv_heads + wh.kv_head) * a.row_blocks + w.block) *
                               a.num_splits +
                           blockIdx.x
                     : ((int64_t)w.seq * gridDim.y + blockIdx.y) * a.num_splits + blockIdx.x;
    if constexpr (KM != kRowsM)
        km_finish<D, QT>(st, wh, a, partial, local0, S::block_rows, lane);
    else
        state_finish<D, QT, S::layout>(st, w, a, a.num_splits == 1 ? -1 : partial, local0,
                                       S::block_rows, lane);
}

// ---------------------------------------------------------------------------------------------
// The flat schedule (decode_flat.cuh): persistent CTAs, each streaming its share of the batch's
// stages through one ring, unit after unit.

// Sequence `seq`'s four values (its query range, length and first page), loaded together.
struct flat_raw {
    int q0, q1, len, page;
};

__device__ __forceinline__ flat_raw flat_raw_load(const decode_args &a, int seq) {
    if (seq >= a.num_seqs) return flat_raw{0, 0, 0, 0};
    return flat_raw{__ldg(a.qo_indptr + seq), __ldg(a.qo_indptr + seq + 1), __ldg(a.seq_lens + seq),
                    __ldg(a.kv_page_indptr + seq)};
}

// One sequence as the walk sees it: blocks = row blocks (0 without query rows or keys), stages
// of each of its num_kv_heads x blocks units.
struct flat_seq {
    int seq, q_start, q_len, seq_len, page_start, blocks, stages;
};

template <class S>
__device__ __forceinline__ flat_seq flat_seq_of(const decode_args &a, int seq, const flat_raw &r) {
    const int q_len = r.q1 - r.q0;
    const bool live = q_len > 0 && r.len > 0;
    return flat_seq{seq,
                    r.q0,
                    q_len,
                    r.len,
                    r.page,
                    live ? mha_flat_blocks(q_len, a.group, S::block_rows) : 0,
                    live ? mha_flat_stages(r.len, S::keys) : 0};
}

// A walk over the CTA's share, one piece (the part of a unit in the share) at a time: unit
// kv_head x blocks + block of sq, its stages [k, k + steps); `left` stages of the share after
// it. The next sequence's values are loaded when a sequence is entered, so that stepping into it
// waits for nothing.
struct flat_cursor {
    flat_seq sq;
    flat_raw next;
    int unit, k, steps, left;
};

template <class S>
__device__ __forceinline__ void flat_begin(flat_cursor &c, const decode_args &a, int seq,
                                           int seq_start, int begin, int total) {
    c.sq = flat_seq_of<S>(a, seq, flat_raw_load(a, seq));
    c.next = flat_raw_load(a, seq + 1);
    const int within = begin - seq_start;
    c.unit = within / c.sq.stages;
    c.k = within - c.unit * c.sq.stages;
    c.steps = min(c.sq.stages - c.k, total);
    c.left = total - c.steps;
}

// The next piece (the caller checks left > 0): the next unit, or the next sequence with any.
template <class S>
__device__ __forceinline__ void flat_advance(flat_cursor &c, const decode_args &a) {
    if (++c.unit == a.num_kv_heads * c.sq.blocks) {
        c.unit = 0;
        int seq = c.sq.seq + 1;
        c.sq = flat_seq_of<S>(a, seq, c.next);
        while (c.sq.stages == 0 && seq + 1 < a.num_seqs) { // sequences without work: rare
            seq++;
            c.sq = flat_seq_of<S>(a, seq, flat_raw_load(a, seq));
        }
        c.next = flat_raw_load(a, seq + 1);
    }
    c.k = 0;
    c.steps = min(c.sq.stages, c.left);
    c.left -= c.steps;
}

// The piece's cta_work: its rows and the keys [key_begin, key_end) of its stages that the block's
// last row sees (causal), as cta_work_find's.
template <class S>
__device__ __forceinline__ cta_work flat_work(const flat_cursor &c, const decode_args &a) {
    cta_work w;
    w.seq = c.sq.seq;
    w.kv_head = c.sq.blocks == 1 ? c.unit : c.unit / c.sq.blocks;
    w.block = c.unit - w.kv_head * c.sq.blocks;
    w.q_start = c.sq.q_start;
    w.q_len = c.sq.q_len;
    w.rows = w.q_len * a.group;
    w.prefix = c.sq.seq_len - w.q_len;
    w.pages = a.kv_page_indices + c.sq.page_start;
    const int keys = cta_work_keys(w, a, S::block_rows, c.sq.seq_len);
    w.key_begin = min(keys, c.k * S::keys);
    w.key_end = min(keys, (c.k + c.steps) * S::keys);
    return w;
}

// The piece's query rows into L2 (its ring stages are being issued; its Q is read a step or more
// later by state_begin).
template <class S, int D, typename QT>
__device__ __forceinline__ void flat_q_prefetch(const cta_work &w, const decode_args &a) {
    constexpr int lines = D * (int)sizeof(QT) / 128; // 128-byte lines of a row
    const int r0 = w.block * S::block_rows, n = min(S::block_rows, w.rows - r0);
    for (int i = threadIdx.x; i < n * lines; i += kThreads) {
        const int r = r0 + i / lines;
        const QT *row =
            static_cast<const QT *>(a.q) + ((int64_t)(w.q_start + r / a.group) * a.num_qo_heads +
                                            w.kv_head * a.group + r % a.group) *
                                               D;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + (i % lines) * (128 / sizeof(QT))));
    }
}

// The flat decode: CTA blockIdx.x of gridDim.x (one wave) takes its share of the batch's stages
// (warp 0 finds it) and streams it through the ring as the split grid's CTA streams its range;
// the issue side walks the pieces stages - 1 steps ahead of the compute side. At a piece's last
// stage its state is merged (key warps, in the stage just computed) and written: to the output
// when the piece is its unit whole, else to partial slot 2 c (the CTA's first piece) or 2 c + 1
// (its last), for mha_flat_combine_kernel. Rows-on-M kernels whose merge fits a stage (S::flat).
template <int D, typename KV, typename QT, int KW>
__global__ void __launch_bounds__(kThreads, (decode_shape<D, KV, KW, kRowsM>::flat_min_ctas))
    mha_decode_flat_kernel(const decode_args a) {
    using S = decode_shape<D, KV, KW, kRowsM>;
    static_assert(S::flat, "the flat schedule merges in one ring stage");
    using MT = typename std::conditional<S::half_math, __half, QT>::type;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ float2 merge_ml[KW > 1 ? kWarps * 16 : 1];
    __shared__ int share[4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 0) {
        const mha_flat_tiles tiles = {a.qo_indptr, a.seq_lens,    a.num_kv_heads,
                                      a.group,     S::block_rows, S::keys};
        const ApFlatScan<mha_flat_tiles> scan(tiles, a.num_seqs, lane);
        const int per = (scan.total + (int)gridDim.x - 1) / (int)gridDim.x;
        const int begin = min((int)blockIdx.x * per, scan.total);
        const int end = min(begin + per, scan.total);
        int seq = -1, seq_start = 0;
        if (begin < end) scan.find(begin, seq, seq_start);
        if (lane == 0) {
            share[0] = begin;
            share[1] = seq < 0 ? 0 : end - begin;
            share[2] = seq;
            share[3] = seq_start;
        }
    }
    __syncthreads();
    const int total = share[1];
    if (total <= 0) return;
    const int kg = warp % KW, local0 = (warp / KW) * 16;
    const uint32_t ring = ap_smem_addr(smem);
    flat_cursor ic; // the issue side
    flat_begin<S>(ic, a, share[2], share[3], share[0], total);
    flat_cursor cc = ic; // the compute side
    cta_work iw = flat_work<S>(ic, a), cw = iw;
    int ii = 0; // the next stage to issue, within ic's piece
    // One stage issued; the walk moves on to the next piece after the piece's last stage.
    auto issue = [&](uint32_t stage, int32_t pages) {
        tile_issue<S>(iw, a, ii, stage, pages);
        if (++ii == ic.steps && ic.left > 0) {
            flat_advance<S>(ic, a);
            iw = flat_work<S>(ic, a);
            ii = 0;
            flat_q_prefetch<S, D, QT>(iw, a);
        }
    };
#pragma unroll
    for (int s = 0; s < S::stages - 1; s++) {
        if (s < total) issue(ring + s * S::stage_bytes, stage_pages<S>(iw, a, ii, lane));
        ap_cp_async_commit();
    }
    int32_t pages_next = stage_pages<S>(iw, a, ii, lane);
    warp_state<D> st;
    bool first_piece = true, has_rows = cw.block * S::block_rows + local0 < cw.rows;
    state_begin<D, MT, QT, S::layout>(st, cw, a, cw.block * S::block_rows + local0, lane);
    int ci = 0; // the stage computed, within cc's piece
    for (int i = 0; i < total; i++) {
        ap_cp_async_wait<S::stages - 2>();
        __syncthreads();
        const int next = i + S::stages - 1;
        if (next < total) {
            issue(ring + (next % S::stages) * S::stage_bytes, pages_next);
            if (next + 1 < total) pages_next = stage_pages<S>(iw, a, ii, lane);
        }
        ap_cp_async_commit();
        const int at_i = (i % S::stages) * S::stage_bytes;
        const int first_key = cw.key_begin + ci * S::keys + kg * kTile;
        if (has_rows && first_key < cw.key_end)
            tile_step<S, D, kRowsM, MT>(st, smem, at_i, kg, first_key, cw.key_end, a.scale_log2,
                                        lane);
        if (++ci < cc.steps) continue;
        // the piece's last stage: its state out, the next piece's state in
        const bool whole = cc.k == 0 && cc.steps == cc.sq.stages;
        const int64_t partial = whole ? -1 : 2 * (int64_t)blockIdx.x + (first_piece ? 0 : 1);
        if constexpr (KW > 1) {
            __syncthreads(); // every warp is done with stage i: its bytes take the merge
            state_merge<D>(st, reinterpret_cast<float *>(smem + at_i), merge_ml, warp / KW, kg, KW,
                           lane);
        }
        if ((KW == 1 || kg == 0) && has_rows)
            state_finish<D, QT, S::layout>(st, cw, a, partial, local0, S::block_rows, lane);
        if (cc.left == 0) break;
        flat_advance<S>(cc, a);
        cw = flat_work<S>(cc, a);
        ci = 0;
        first_piece = false;
        has_rows = cw.block * S::block_rows + local0 < cw.rows;
        state_begin<D, MT, QT, S::layout>(st, cw, a, cw.block * S::block_rows + local0, lane);
    }
    ap_cp_async_wait<0>();
    ap_pdl_launch_dependents(); // the combine's CTAs may take our slots; it waits for our writes
}

typedef void (*decode_kernel_fn)(const decode_args);

struct decode_kernel_info {
    decode_kernel_fn kernel;
    int smem_bytes;
    int stage_keys, block_rows; // the flat combine's schedule needs them
};

// A rows-on-M set: its split-grid kernel, or (flat) its flat kernel where S::flat, else none.
template <int D, typename KV, typename QT, int KW> decode_kernel_info rows_m_variant(bool flat) {
    using S = decode_shape<D, KV, KW, kRowsM>;
    if constexpr (S::flat) {
        if (flat) return {mha_decode_flat_kernel<D, KV, QT, KW>, S::smem, S::keys, S::block_rows};
    }
    if (flat) return {NULL, 0, 0, 0};
    return {mha_decode_kernel<D, KV, QT, KW, kRowsM>, S::smem, S::keys, S::block_rows};
}

// km: kRowsM, or (at most 8 rows per (sequence, KV head), nvfp4 with 4 key warps) kKeysM or
// kKeysM2 (D = 128 only; D = 64 takes kKeysM). flat: the flat kernel (rows on M), or none.
template <int D, typename KV, typename QT>
decode_kernel_info decode_variant(int kw, int km, bool flat) {
    if constexpr (std::is_same<KV, mha_nvfp4>::value && D <= 128) {
        constexpr int v2 = D == 128 ? kKeysM2 : kKeysM;
        using S2H = decode_shape<D, KV, 4, kKeysM2H>;
        using S2 = decode_shape<D, KV, 4, v2>;
        using S1 = decode_shape<D, KV, 4, kKeysM>;
        if (kw == 4 && km != kRowsM && flat) return {NULL, 0, 0, 0};
        if constexpr (D == 128)
            if (kw == 4 && km == kKeysM2H)
                return {mha_decode_kernel<D, KV, QT, 4, kKeysM2H>, S2H::smem, S2H::keys,
                        S2H::block_rows};
        if (kw == 4 && km >= kKeysM2 && D == 128)
            return {mha_decode_kernel<D, KV, QT, 4, v2>, S2::smem, S2::keys, S2::block_rows};
        if (kw == 4 && km != kRowsM)
            return {mha_decode_kernel<D, KV, QT, 4, kKeysM>, S1::smem, S1::keys, S1::block_rows};
    }
    if (kw == 4) return rows_m_variant<D, KV, QT, 4>(flat);
    if (kw == 2) return rows_m_variant<D, KV, QT, 2>(flat);
    return rows_m_variant<D, KV, QT, 1>(flat);
}

template <int D, typename QT>
decode_kernel_info decode_variant_kv(ap_dtype kv_dtype, int kw, int km, bool flat) {
    switch (kv_dtype) {
        case AP_DTYPE_FP8_E4M3: return decode_variant<D, ap_fp8_e4m3, QT>(kw, kRowsM, flat);
        case AP_DTYPE_NVFP4: return decode_variant<D, mha_nvfp4, QT>(kw, km, flat);
        case AP_DTYPE_BF16:
            if (std::is_same<QT, __nv_bfloat16>::value)
                return decode_variant<D, QT, QT>(kw, kRowsM, flat);
            break;
        case AP_DTYPE_F16:
            if (std::is_same<QT, __half>::value) return decode_variant<D, QT, QT>(kw, kRowsM, flat);
            break;
        default: break;
    }
    return {NULL, 0, 0, 0};
}

template <int D>
decode_kernel_info decode_variant_for(ap_dtype q_dtype, ap_dtype kv_dtype, int kw, int km,
                                      bool flat) {
    if (q_dtype == AP_DTYPE_BF16)
        return decode_variant_kv<D, __nv_bfloat16>(kv_dtype, kw, km, flat);
    if (q_dtype == AP_DTYPE_F16) return decode_variant_kv<D, __half>(kv_dtype, kw, km, flat);
    return {NULL, 0, 0, 0};
}

// The small dispatch: the only place that instantiates kernels.
// Key warps: 4 for D <= 128 and 2 for D = 256 (a stage's size) where one row block fits a warp,
// else 1 (mha_decode_key_warps, plan.c). rows: a (sequence, KV head)'s rows at most (group x
// max_q_len); <= 8 takes the keys-on-M nvfp4 kernel (decode_keys_m.cuh) unless keys_m is
// MHA_KEYS_M_OFF: its v2 (MHA_KEYS_M_AUTO at D = 128), its first form (D = 64, MHA_KEYS_M_V1) or
// v2 over two KV heads per CTA (MHA_KEYS_M_V2H at D = 128; D = 64 takes the first form): the
// caller passes V2H only where mha_decode_heads_per_cta is 2 (mha_decode_keys_m_for).
// flat: the set's flat-schedule kernel (rows on M, the merge within a stage), else none.
decode_kernel_info decode_dispatch(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype, int kw,
                                   int32_t rows, int32_t keys_m, bool flat = false) {
    if (kw != 1 && kw != 2 && kw != 4) return {NULL, 0, 0, 0};
    const int km =
        rows < 1 || rows > 8 || keys_m == MHA_KEYS_M_OFF
            ? kRowsM
            : (keys_m == MHA_KEYS_M_V1 ? kKeysM : (keys_m == MHA_KEYS_M_V2H ? kKeysM2H : kKeysM2));
    switch (head_dim) {
        case 64: return decode_variant_for<64>(q_dtype, kv_dtype, kw, km, flat);
        case 128: return decode_variant_for<128>(q_dtype, kv_dtype, kw, km, flat);
        case 256: return decode_variant_for<256>(q_dtype, kv_dtype, kw == 4 ? 2 : kw, kRowsM, flat);
        default: return {NULL, 0, 0, 0};
    }
}

// Every kernel the dispatch can return gets its shared-memory limit raised once: the sweep below
// reaches most kernels many times over (keys_m and rows values that pick the same one), so a kernel
// already raised is skipped.
ap_status decode_setup_all(ap_msgbuf *msg) {
    const int dims[3] = {64, 128, 256}, kws[3] = {1, 2, 4}, rows[2] = {8, 16};
    const int32_t keys_m[4] = {MHA_KEYS_M_AUTO, MHA_KEYS_M_V1, MHA_KEYS_M_OFF, MHA_KEYS_M_V2H};
    const ap_dtype qs[2] = {AP_DTYPE_BF16, AP_DTYPE_F16};
    const ap_dtype kvs[4] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, AP_DTYPE_NVFP4};
    decode_kernel_fn done[3 * 2 * 4 * 3 * 16];
    int num_done = 0;
    for (int d = 0; d < 3; d++)
        for (int q = 0; q < 2; q++)
            for (int k = 0; k < 4; k++)
                for (int w = 0; w < 3; w++)
                    for (int r = 0; r < 16; r++) { // r >= 8: the flat kernels
                        decode_kernel_info v = decode_dispatch(
                            dims[d], qs[q], kvs[k], kws[w], rows[r % 2], keys_m[r / 2 % 4], r >= 8);
                        bool seen = v.kernel == NULL;
                        for (int i = 0; i < num_done && !seen; i++) seen = done[i] == v.kernel;
                        if (seen) continue;
                        done[num_done++] = v.kernel;
                        ap_status st =
                            ap_cuda_smem_optin(v.kernel, (size_t)v.smem_bytes, MHA_WHO, msg);
                        if (st != AP_OK) return st;
                    }
    return AP_OK;
}

} // namespace

extern "C" ap_status mha_decode_setup(ap_msgbuf *msg) {
    return decode_setup_all(msg);
}

extern "C" ap_status mha_decode_ctas_per_sm(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype,
                                            int32_t key_warps, int32_t rows, int32_t keys_m,
                                            int32_t flat, int32_t *out, ap_msgbuf *msg) {
    *out = flat ? 0 : 1;
    decode_kernel_info v =
        decode_dispatch(head_dim, q_dtype, kv_dtype, key_warps, rows, keys_m, flat != 0);
    if (v.kernel == NULL) return AP_OK; /* no flat kernel, or validate() refused it already */
    int blocks = 0;
    ap_status st = ap_cuda_status(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, v.kernel, kThreads, v.smem_bytes),
        MHA_WHO, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", msg);
    if (st == AP_OK && blocks > 0) *out = blocks;
    return st;
}

static void decode_args_of(const mha_decode_params *p, int32_t row_blocks, decode_args *a) {
    const bool scaled = p->kv_dtype == AP_DTYPE_FP8_E4M3 || p->kv_dtype == AP_DTYPE_NVFP4;
    a->q = p->q;
    a->out = p->out;
    a->lse = p->lse;
    a->k_pages = static_cast<const uint8_t *>(p->k_pages);
    a->v_pages = static_cast<const uint8_t *>(p->v_pages);
    a->k_scales = static_cast<const uint8_t *>(p->k_scales);
    a->v_scales = static_cast<const uint8_t *>(p->v_scales);
    a->qo_indptr = p->qo_indptr;
    a->kv_page_indptr = p->kv_page_indptr;
    a->kv_page_indices = p->kv_page_indices;
    a->seq_lens = p->seq_lens;
    a->partial_out = p->partial_out;
    a->partial_lse = p->partial_lse;
    a->num_qo_heads = p->num_qo_heads;
    a->num_kv_heads = p->num_kv_heads;
    a->group = p->num_qo_heads / p->num_kv_heads;
    a->log2_page_size = ap_page_shift(p->page_size);
    a->num_splits = p->num_splits;
    a->row_blocks = row_blocks;
    a->num_seqs = p->num_seqs;
    // nvfp4's fragments hold value * 2^-14 (ap_nvfp4_pair14): 2^14 joins the global scales
    const float unbias = p->kv_dtype == AP_DTYPE_NVFP4 ? AP_NVFP4_UNBIAS14 : 1.f;
    a->scale_log2 = p->sm_scale * ap_log2e * (scaled ? p->k_scale * unbias : 1.f);
    a->v_scale = scaled ? p->v_scale * unbias : 1.f;
}

extern "C" ap_status mha_decode_run(const mha_decode_params *p, void *stream, ap_msgbuf *msg) {
    const int group = p->num_kv_heads > 0 ? p->num_qo_heads / p->num_kv_heads : 0;
    const int32_t kw = mha_decode_key_warps(group, p->max_q_len, p->head_dim);
    const int32_t heads = mha_decode_heads_per_cta(p->kv_dtype, p->head_dim, group, p->max_q_len,
                                                   p->num_kv_heads, p->keys_m);
    const int32_t keys_m = mha_decode_keys_m_for(p->keys_m, heads);
    decode_kernel_info v = {NULL, 0, 0, 0};
    if (p->flat_ctas > 0) // the flat schedule where this kernel set has it
        v = decode_dispatch(p->head_dim, p->q_dtype, p->kv_dtype, kw, group * p->max_q_len, keys_m,
                            true);
    const bool flat = v.kernel != NULL;
    if (!flat)
        v = decode_dispatch(p->head_dim, p->q_dtype, p->kv_dtype, kw, group * p->max_q_len, keys_m);
    // pages of >= 16 tokens (validate's 16/32/64): stage_pages' 32 lanes cover a stage's pages
    if (v.kernel == NULL || ap_page_shift(p->page_size) < 4 || group < 1 || group > MHA_MAX_GROUP ||
        group * p->num_kv_heads != p->num_qo_heads || p->num_splits < 1 ||
        p->num_splits > MHA_MAX_SPLITS) {
        ap_msgbuf_add(msg,
                      MHA_WHO ": no kernel for head_dim %d, q %s, kv %s, page size %d, %d query "
                              "heads over %d KV heads, %d splits",
                      p->head_dim, ap_dtype_str(p->q_dtype), ap_dtype_str(p->kv_dtype),
                      p->page_size, p->num_qo_heads, p->num_kv_heads, p->num_splits);
        return AP_ERR_UNSUPPORTED;
    }
    if (p->num_seqs == 0) return AP_OK;
    const int32_t row_blocks = mha_decode_row_blocks(group, p->max_q_len, kw);
    decode_args a;
    decode_args_of(p, row_blocks, &a);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    // v2h (heads 2, one row block): a CTA per pair of KV heads
    const dim3 grid = flat ? dim3(p->flat_ctas)
                           : dim3(p->num_splits, p->num_kv_heads / heads * row_blocks, p->num_seqs);
    v.kernel<<<grid, kThreads, v.smem_bytes, s>>>(a);
    ap_status st = ap_cuda_launch_status(MHA_WHO, "mha_decode_kernel", msg);
    if (st != AP_OK || (p->num_splits == 1 && !flat)) return st;
    const mha_combine_params c = {
        .out = p->out,
        .lse = p->lse,
        .q_dtype = p->q_dtype,
        .qo_indptr = p->qo_indptr,
        .partial_out = p->partial_out,
        .partial_lse = p->partial_lse,
        .head_dim = p->head_dim,
        .group = group,
        .num_qo_heads = p->num_qo_heads,
        .num_kv_heads = p->num_kv_heads,
        .num_seqs = p->num_seqs,
        .num_splits = p->num_splits,
        .row_blocks = row_blocks,
        .block_rows = v.block_rows,
        .seq_lens = p->seq_lens,
        .flat_ctas = flat ? p->flat_ctas : 0,
        .stage_keys = v.stage_keys,
    };
    return mha_combine_run(&c, stream, msg);
}
