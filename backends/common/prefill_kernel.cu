// prefill_kernel.cu: the kit's prefill (extend) attention kernel on mma.sync, and its launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>

#include <atomic>
#include <type_traits>

#include "cp_async.cuh"
#include "cuda_status.cuh"
#include "dispatch.cuh"
#include "dtype.cuh"
#include "mma.cuh"
#include "paged_kv.cuh"
#include "prefill.h"
#include "prefill_hopper.h"
#include "prefill_internal.h"
#include "softmax_state.cuh"
#include "swizzle.cuh"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Kernel options (a bit set; benchmark builds time the others):
//   kPagesEarly: load the next tile's page numbers before the ring barrier, all at once, and
//     find a position's page with a shift when the page size is a power of two; without it
//     each row's page lookup (a division and a dependent load) sits between barrier and MMAs.
//   kAlwaysRescale: rescale o on every tile instead of branching on whether a row max moved,
//     so the exponentials and the P.V products form one block the scheduler can interleave.
//   kRagged: the K/V source is ragged rows of dense k / v tensors (kv_indptr), not the cache.
constexpr int kPagesEarly = 1;
constexpr int kAlwaysRescale = 2;
constexpr int kRagged = 4;
constexpr int kDefaultOpts = kPagesEarly;

// Everything a CTA needs, passed by value (kernel parameter space). The ragged source reuses the
// paged source's fields (a larger struct cost the D128 kernel 4 more bytes of spill).
struct extend_args {
    const void *q;
    void *out;
    float *lse;
    const void *k_src; // the K pages, or (ragged) k [kv][num_kv_heads][DQK]
    const void *v_src; // the V pages, or (ragged) v [kv][num_kv_heads][DV]
    const int32_t *qo_indptr;
    const int32_t *kv_indptr; // kv_page_indptr, or (ragged) the rows' kv_indptr
    const int32_t *kv_page_indices;
    const int32_t *kv_last_page_len;
    const int4 *items;
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t group; // query heads per KV head
    int32_t page_size;
    int32_t page_shift;  // log2(page_size) when it is a power of two, else -1
    int32_t tile_tokens; // new tokens per item
    int32_t causal;
    float scale_log2; // sm_scale * k_scale * log2(e)
    float v_scale;
};

// Where one CTA's work lies in the batch.
struct extend_cta {
    int kvh;
    int t0;       // first new token of the tile within its sequence
    int qo_begin; // the sequence's first row in q / out
    int q_len;
    int kv_first; // the sequence's first entry in kv_page_indices, or (ragged) row of k / v
    int kv_len;
    int prefix;    // kv_len - q_len: position of new token j is prefix + j
    int kv_end;    // positions [0, kv_end) are read
    int rows_used; // tile_tokens * group
};

// Byte offset of chunk `chunk` of row `row` in a tile of D 16-bit elements a row (swizzle.cuh).
template <int D> __device__ __forceinline__ uint32_t swz(int row, int chunk) {
    return static_cast<uint32_t>(row * (D * 2) + (ap_swizzle<D * 2 / 16>(row, chunk) << 4));
}

// An operand whose lane reads chunk 2kk + c of row r + 16i (r % 8 = lane % 8, c in {0, 1})
// finds it at (base ^ ((kk % 4) << 5)) + (kk / 4) * 128 + 16i * row bytes, where base is the
// 128-byte aligned tile address plus swz(r, c): the swizzle XOR only touches byte-offset bits
// 4..6, and moving from chunk c to 2j + c flips bits 5..6 by j. One register per operand.
__device__ __forceinline__ uint32_t swz_step(uint32_t base, int kk) {
    return (base ^ ((uint32_t)(kk % 4) << 5)) + (uint32_t)(kk / 4) * 128;
}

// Reads where this CTA's work item lies. Called again after the main loop: reloading a few
// cached words is cheaper than keeping them in registers through it.
template <bool RAGGED> __device__ __forceinline__ extend_cta cta_locate(const extend_args &a) {
    extend_cta c;
    const int4 item = a.items[blockIdx.x / a.num_kv_heads];
    c.kvh = blockIdx.x % a.num_kv_heads;
    c.t0 = item.y;
    c.qo_begin = a.qo_indptr[item.x];
    c.q_len = a.qo_indptr[item.x + 1] - c.qo_begin;
    if constexpr (RAGGED) {
        c.kv_first = a.kv_indptr[item.x];
        c.kv_len = a.kv_indptr[item.x + 1] - c.kv_first;
    } else {
        c.kv_first = a.kv_indptr[item.x];
        c.kv_len =
            (a.kv_indptr[item.x + 1] - c.kv_first - 1) * a.page_size + a.kv_last_page_len[item.x];
    }
    c.prefix = c.kv_len - c.q_len;
    c.rows_used = a.tile_tokens * a.group;
    const int t_end = min(c.q_len, c.t0 + a.tile_tokens);
    c.kv_end = a.causal ? min(c.kv_len, c.prefix + t_end) : c.kv_len;
    return c;
}

template <int D, int ROWS, typename QT>
__device__ void load_q_tile(const extend_args &a, const extend_cta &c, uint32_t sq) {
    constexpr int CHUNKS = D / 8;
    const QT *q = static_cast<const QT *>(a.q);
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += kThreads) {
        const int row = i / CHUNKS, chunk = i % CHUNKS;
        const int token = c.t0 + row / a.group;
        const bool live = row < c.rows_used && token < c.q_len;
        const QT *src = q;
        if (live) {
            const int head = c.kvh * a.group + row % a.group;
            src += ((int64_t)(c.qo_begin + token) * a.num_qo_heads + head) * D + chunk * 8;
        }
        ap_cp_async_16(sq + swz<D>(row, chunk), src, live);
    }
}

// One KV tile into the ring. 16-bit caches land swizzled, ready for ldmatrix; fp8 caches land
// as raw rows for convert_fp8_tile.
template <int D, int BC, typename KVT>
__device__ void load_kv_tile(const extend_args &a, const extend_cta &c, int tile, uint32_t sk,
                             uint32_t sv) {
    constexpr int ROW_BYTES = D * (int)sizeof(KVT);
    constexpr int CHUNKS = ROW_BYTES / 16;
    constexpr int ROWS_PER_PASS = kThreads / CHUNKS;
    constexpr bool FP8 = sizeof(KVT) == 1;
    const char *kbase = static_cast<const char *>(a.k_src);
    const char *vbase = static_cast<const char *>(a.v_src);
    const int chunk = threadIdx.x % CHUNKS;
#pragma unroll
    for (int pass = 0; pass < BC / ROWS_PER_PASS; ++pass) {
        const int row = threadIdx.x / CHUNKS + pass * ROWS_PER_PASS;
        const int pos = tile * BC + row;
        const bool live = pos < c.kv_end;
        int64_t offset = 0;
        if (live) {
            const int page = a.kv_page_indices[c.kv_first + ap_page_entry<false>(pos, a.page_size,
                                                                                 a.page_shift)];
            const int64_t slot = ap_page_slot<false>(page, pos, a.page_size, a.page_shift);
            offset = (slot * a.num_kv_heads + c.kvh) * ROW_BYTES + chunk * 16;
        }
        const uint32_t dst = FP8 ? (uint32_t)(row * ROW_BYTES + chunk * 16) : swz<D>(row, chunk);
        ap_cp_async_16(sk + dst, kbase + offset, live); // zero-filled past kv_end
        ap_cp_async_16(sv + dst, vbase + offset, live);
    }
}

// Rows of the KV tile this thread copies: kv_rows<...>::PASSES of them, ROWS_PER_PASS apart.
template <int D, int BC, typename KVT> struct kv_rows {
    static constexpr int ROW_BYTES = D * (int)sizeof(KVT);
    static constexpr int CHUNKS = ROW_BYTES / 16;
    static constexpr int ROWS_PER_PASS = kThreads / CHUNKS;
    static constexpr int PASSES = BC / ROWS_PER_PASS;
};

// First half of a tile load: the page numbers of this thread's rows, issued together so their
// latencies overlap (and the caller's barrier hides them). Positions past kv_end read the last
// live row's page: always a valid index, never used.
template <int D, int BC, typename KVT, bool POW2>
__device__ __forceinline__ void kv_tile_pages(const extend_args &a, const extend_cta &c, int tile,
                                              int (&pages)[kv_rows<D, BC, KVT>::PASSES]) {
    using R = kv_rows<D, BC, KVT>;
#pragma unroll
    for (int pass = 0; pass < R::PASSES; ++pass) {
        const int pos =
            min(tile * BC + (int)threadIdx.x / R::CHUNKS + pass * R::ROWS_PER_PASS, c.kv_end - 1);
        pages[pass] = __ldg(a.kv_page_indices + c.kv_first +
                            ap_page_entry<POW2>(pos, a.page_size, a.page_shift));
    }
}

// Second half: the copies themselves (same layout as load_kv_tile).
template <int D, int BC, typename KVT, bool POW2>
__device__ __forceinline__ void kv_tile_copy(const extend_args &a, const extend_cta &c, int tile,
                                             const int (&pages)[kv_rows<D, BC, KVT>::PASSES],
                                             uint32_t sk, uint32_t sv) {
    using R = kv_rows<D, BC, KVT>;
    constexpr bool FP8 = sizeof(KVT) == 1;
    const char *kbase = static_cast<const char *>(a.k_src);
    const char *vbase = static_cast<const char *>(a.v_src);
    const int chunk = threadIdx.x % R::CHUNKS;
#pragma unroll
    for (int pass = 0; pass < R::PASSES; ++pass) {
        const int row = threadIdx.x / R::CHUNKS + pass * R::ROWS_PER_PASS;
        const int pos = tile * BC + row;
        const bool live = pos < c.kv_end;
        const int64_t slot = ap_page_slot<POW2>(pages[pass], pos, a.page_size, a.page_shift);
        const int64_t offset =
            live ? (slot * a.num_kv_heads + c.kvh) * R::ROW_BYTES + chunk * 16 : 0;
        const uint32_t dst = FP8 ? (uint32_t)(row * R::ROW_BYTES + chunk * 16) : swz<D>(row, chunk);
        ap_cp_async_16(sk + dst, kbase + offset, live); // zero-filled past kv_end
        ap_cp_async_16(sv + dst, vbase + offset, live);
    }
}

// The two halves, each a straight run of code for one kind of page size (one uniform branch).
template <int D, int BC, typename KVT>
__device__ __forceinline__ void kv_tile_pages(const extend_args &a, const extend_cta &c, int tile,
                                              int (&pages)[kv_rows<D, BC, KVT>::PASSES]) {
    if (a.page_shift >= 0)
        kv_tile_pages<D, BC, KVT, true>(a, c, tile, pages);
    else
        kv_tile_pages<D, BC, KVT, false>(a, c, tile, pages);
}
template <int D, int BC, typename KVT>
__device__ __forceinline__ void kv_tile_copy(const extend_args &a, const extend_cta &c, int tile,
                                             const int (&pages)[kv_rows<D, BC, KVT>::PASSES],
                                             uint32_t sk, uint32_t sv) {
    if (a.page_shift >= 0)
        kv_tile_copy<D, BC, KVT, true>(a, c, tile, pages, sk, sv);
    else
        kv_tile_copy<D, BC, KVT, false>(a, c, tile, pages, sk, sv);
}

// Ragged source: rows kv_first + tile * BC .. of one dense tensor (k or v, D wide) into a ring
// tile laid out as the paged copies lay theirs (zero-filled past kv_end).
template <int D, int BC, typename KVT>
__device__ __forceinline__ void ragged_tile_copy(const void *base, const extend_cta &c,
                                                 int num_kv_heads, int tile, uint32_t dst_tile) {
    constexpr int ROW_BYTES = D * (int)sizeof(KVT);
    constexpr int CHUNKS = ROW_BYTES / 16;
    constexpr int COPIES = BC * CHUNKS;
    constexpr bool FP8 = sizeof(KVT) == 1;
    const char *src = static_cast<const char *>(base);
#pragma unroll
    for (int pass = 0; pass < (COPIES + kThreads - 1) / kThreads; ++pass) {
        const int i = (int)threadIdx.x + pass * kThreads;
        if (COPIES % kThreads != 0 && i >= COPIES) break;
        const int row = i / CHUNKS, chunk = i % CHUNKS;
        const int pos = tile * BC + row;
        const bool live = pos < c.kv_end;
        const int64_t offset =
            live ? ((int64_t)(c.kv_first + pos) * num_kv_heads + c.kvh) * ROW_BYTES + chunk * 16
                 : 0;
        const uint32_t dst = FP8 ? (uint32_t)(row * ROW_BYTES + chunk * 16) : swz<D>(row, chunk);
        ap_cp_async_16(dst_tile + dst, src + offset, live);
    }
}

// Four e4m3 values to four QT values in two registers (exact: e4m3 fits in bf16 and fp16).
template <typename QT> __device__ __forceinline__ uint2 fp8x4_convert(uint32_t four) {
    const uint32_t lo = ap_fp8x2_to_half2_bits((uint16_t)(four & 0xffff));
    const uint32_t hi = ap_fp8x2_to_half2_bits((uint16_t)(four >> 16));
    if constexpr (std::is_same<QT, __half>::value) {
        return make_uint2(lo, hi);
    } else {
        const float2 flo = ap_unpack2<__half>(lo), fhi = ap_unpack2<__half>(hi);
        return make_uint2(ap_pack2<QT>(flo.x, flo.y), ap_pack2<QT>(fhi.x, fhi.y));
    }
}

// Raw fp8 rows (D wide) of one ring tile to a swizzled QT tile.
template <int D, int BC, typename QT>
__device__ void convert_fp8_rows(const unsigned char *raw, unsigned char *tile) {
    constexpr int CHUNKS = D / 16; // 16 fp8 values in, two 16-byte chunks out
    for (int i = threadIdx.x; i < BC * CHUNKS; i += kThreads) {
        const int row = i / CHUNKS, chunk = i % CHUNKS;
        const uint4 x = *reinterpret_cast<const uint4 *>(raw + row * D + chunk * 16);
        const uint2 x0 = fp8x4_convert<QT>(x.x), x1 = fp8x4_convert<QT>(x.y);
        const uint2 x2 = fp8x4_convert<QT>(x.z), x3 = fp8x4_convert<QT>(x.w);
        *reinterpret_cast<uint4 *>(tile + swz<D>(row, 2 * chunk)) =
            make_uint4(x0.x, x0.y, x1.x, x1.y);
        *reinterpret_cast<uint4 *>(tile + swz<D>(row, 2 * chunk + 1)) =
            make_uint4(x2.x, x2.y, x3.x, x3.y);
    }
}

// Raw fp8 K and V rows of one ring stage (equal dims) to swizzled QT tiles, in one loop.
template <int D, int BC, typename QT>
__device__ void convert_fp8_pair(const unsigned char *raw_k, const unsigned char *raw_v,
                                 unsigned char *tile_k, unsigned char *tile_v) {
    constexpr int CHUNKS = D / 16; // 16 fp8 values in, two 16-byte chunks out
    for (int i = threadIdx.x; i < BC * CHUNKS; i += kThreads) {
        const int row = i / CHUNKS, chunk = i % CHUNKS;
        const uint4 k = *reinterpret_cast<const uint4 *>(raw_k + row * D + chunk * 16);
        const uint4 v = *reinterpret_cast<const uint4 *>(raw_v + row * D + chunk * 16);
        const uint2 k0 = fp8x4_convert<QT>(k.x), k1 = fp8x4_convert<QT>(k.y);
        const uint2 k2 = fp8x4_convert<QT>(k.z), k3 = fp8x4_convert<QT>(k.w);
        const uint2 v0 = fp8x4_convert<QT>(v.x), v1 = fp8x4_convert<QT>(v.y);
        const uint2 v2 = fp8x4_convert<QT>(v.z), v3 = fp8x4_convert<QT>(v.w);
        *reinterpret_cast<uint4 *>(tile_k + swz<D>(row, 2 * chunk)) =
            make_uint4(k0.x, k0.y, k1.x, k1.y);
        *reinterpret_cast<uint4 *>(tile_k + swz<D>(row, 2 * chunk + 1)) =
            make_uint4(k2.x, k2.y, k3.x, k3.y);
        *reinterpret_cast<uint4 *>(tile_v + swz<D>(row, 2 * chunk)) =
            make_uint4(v0.x, v0.y, v1.x, v1.y);
        *reinterpret_cast<uint4 *>(tile_v + swz<D>(row, 2 * chunk + 1)) =
            make_uint4(v2.x, v2.y, v3.x, v3.y);
    }
}

// Raw fp8 K (DQK wide) and V (DV wide) rows of one ring stage to swizzled QT tiles.
template <int DQK, int DV, int BC, typename QT>
__device__ __forceinline__ void convert_fp8_tile(const unsigned char *raw_k,
                                                 const unsigned char *raw_v, unsigned char *tile_k,
                                                 unsigned char *tile_v) {
    if constexpr (DQK == DV) {
        convert_fp8_pair<DQK, BC, QT>(raw_k, raw_v, tile_k, tile_v);
    } else {
        convert_fp8_rows<DQK, BC, QT>(raw_k, tile_k);
        convert_fp8_rows<DV, BC, QT>(raw_v, tile_v);
    }
}

// s = Q K^T for this warp's 16*MT rows and the tile's 64 positions (raw dot products).
template <int D, int MT, int BC, typename QT>
__device__ __forceinline__ void tile_scores(float s[MT][BC / 8][4], uint32_t sq, uint32_t sk,
                                            int warp_row0) {
    const int lane = threadIdx.x % 32;
    const uint32_t qbase = sq + swz<D>(warp_row0 + (lane & 15), lane >> 4);
    const uint32_t kbase = sk + swz<D>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nb = 0; nb < BC / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nb][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            ap_ldmatrix_x4(qa[mt], swz_step(qbase, kk) + mt * 16 * D * 2);
#pragma unroll
        for (int np = 0; np < BC / 16; ++np) {
            uint32_t kb[4];
            ap_ldmatrix_x4(kb, swz_step(kbase, kk) + np * 16 * D * 2);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                ap_mma_16816<QT>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
                ap_mma_16816<QT>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
            }
        }
    }
}

// Masks the scores of positions past each row's limit: its own position when causal, and the
// sequence's end. Only the few tiles that straddle a limit come here.
template <int MT, int BC>
__device__ __forceinline__ void tile_mask(float s[MT][BC / 8][4], const extend_args &a,
                                          const extend_cta &c, int pos0, int warp_row0) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int token = c.t0 + (warp_row0 + mt * 16 + (lane >> 2) + 8 * h) / a.group;
            const int limit = a.causal ? min(c.kv_len, c.prefix + token + 1) : c.kv_len;
#pragma unroll
            for (int nb = 0; nb < BC / 8; ++nb)
#pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; ++e)
                    if (pos0 + nb * 8 + 2 * (lane & 3) + (e & 1) >= limit) s[mt][nb][e] = -INFINITY;
        }
}

// Online-softmax step: s becomes the unnormalised probabilities 2^(s scale - m), and m, l and
// o are rescaled to the new row maxima. Masked positions must already hold -inf. Once the row
// maxima settle, every alpha is 1 and the warp skips rescaling o (D/2 * MT multiplies a tile).
template <int D, int MT, int BC, bool ALWAYS_RESCALE>
__device__ __forceinline__ void tile_softmax(float s[MT][BC / 8][4], float o[MT][D / 8][4],
                                             float m[MT][2], float l[MT][2], float scale_log2) {
    float alpha[MT][2];
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = -INFINITY;
#pragma unroll
            for (int nb = 0; nb < BC / 8; ++nb)
                mx = fmaxf(mx, fmaxf(s[mt][nb][2 * h], s[mt][nb][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[mt][h], mx * scale_log2);
            // A row with nothing visible yet keeps m = -inf; subtract 0 then, never inf - inf.
            const float m_base = m_new == -INFINITY ? 0.f : m_new;
            alpha[mt][h] = ap_exp2_approx(m[mt][h] - m_base);
            moved |= m_new != m[mt][h];
            m[mt][h] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int nb = 0; nb < BC / 8; ++nb) {
#pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; ++e) {
                    s[mt][nb][e] = ap_exp2_approx(fmaf(s[mt][nb][e], scale_log2, -m_base));
                    sum += s[mt][nb][e];
                }
            }
            l[mt][h] = l[mt][h] * alpha[mt][h] + sum; // this thread's columns; quad sums at the end
        }
    }
    if (ALWAYS_RESCALE || __any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int db = 0; db < D / 8; ++db)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[mt][db][e] *= alpha[mt][e >> 1];
    }
}

// o += P V, P taken from the score registers (the C layout of two n8 blocks is the A layout of
// one k16 step).
template <int D, int MT, int BC, typename QT>
__device__ __forceinline__ void tile_accumulate(const float s[MT][BC / 8][4], float o[MT][D / 8][4],
                                                uint32_t sv) {
    const int lane = threadIdx.x % 32;
    const uint32_t vbase = sv + swz<D>((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
#pragma unroll
    for (int ks = 0; ks < BC / 16; ++ks) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            pa[mt][0] = ap_pack2<QT>(s[mt][2 * ks][0], s[mt][2 * ks][1]);
            pa[mt][1] = ap_pack2<QT>(s[mt][2 * ks][2], s[mt][2 * ks][3]);
            pa[mt][2] = ap_pack2<QT>(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
            pa[mt][3] = ap_pack2<QT>(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t vb[4];
            ap_ldmatrix_x4_trans(vb, swz_step(vbase, dp) + ks * 16 * D * 2);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                ap_mma_16816<QT>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
                ap_mma_16816<QT>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
            }
        }
    }
}

// Normalised outputs through shared memory (the Q tile's space) to 16-byte coalesced stores,
// and the LSE of each live row.
template <int D, int MT, typename QT>
__device__ __forceinline__ void store_output(const extend_args &a, const extend_cta &c,
                                             float o[MT][D / 8][4], const float m[MT][2],
                                             float l[MT][2], unsigned char *sq_ptr, int warp_row0) {
    constexpr int ROWS = kWarps * 16 * MT;
    constexpr int CHUNKS = D / 8;
    const int lane = threadIdx.x % 32;
    __syncthreads(); // every warp is done reading the K/V ring and Q
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float sum = l[mt][h];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const float inv = sum > 0.f ? a.v_scale / sum : 0.f;
            const int row = warp_row0 + mt * 16 + (lane >> 2) + 8 * h;
#pragma unroll
            for (int db = 0; db < D / 8; ++db) {
                const uint32_t packed =
                    ap_pack2<QT>(o[mt][db][2 * h] * inv, o[mt][db][2 * h + 1] * inv);
                *reinterpret_cast<uint32_t *>(sq_ptr + swz<D>(row, db) + (lane & 3) * 4) = packed;
            }
            const int token = c.t0 + row / a.group;
            if (a.lse != nullptr && (lane & 3) == 0 && row < c.rows_used && token < c.q_len) {
                const int head = c.kvh * a.group + row % a.group;
                a.lse[(int64_t)(c.qo_begin + token) * a.num_qo_heads + head] =
                    sum > 0.f ? ap_lse2_to_ln(m[mt][h] + log2f(sum)) : -INFINITY;
            }
        }
    }
    __syncthreads();
    QT *out = static_cast<QT *>(a.out);
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += kThreads) {
        const int row = i / CHUNKS, chunk = i % CHUNKS;
        const int token = c.t0 + row / a.group;
        if (row >= c.rows_used || token >= c.q_len) continue;
        const int head = c.kvh * a.group + row % a.group;
        *reinterpret_cast<uint4 *>(
            out + ((int64_t)(c.qo_begin + token) * a.num_qo_heads + head) * D + chunk * 8) =
            *reinterpret_cast<const uint4 *>(sq_ptr + swz<D>(row, chunk));
    }
}

template <int DQK, int DV, int MT, int BC, int STAGES, typename KVT>
constexpr size_t extend_smem_bytes() {
    constexpr size_t q = (size_t)kWarps * 16 * MT * DQK * 2;
    constexpr size_t ring = (size_t)STAGES * BC * (DQK + DV) * sizeof(KVT);
    constexpr size_t converted = sizeof(KVT) == 1 ? (size_t)BC * (DQK + DV) * 2 : 0;
    return q + ring + converted;
}

// Issues KV tile `tile` into ring stage (sk, sv) from the source OPTS names (the paged copy's
// page numbers were loaded by kv_tile_pages before the barrier when kPagesEarly).
template <int DQK, int DV, int BC, typename KVT, int OPTS>
__device__ __forceinline__ void kv_tile_issue(const extend_args &a, const extend_cta &c, int tile,
                                              const int (&pages)[kv_rows<DQK, BC, KVT>::PASSES],
                                              uint32_t sk, uint32_t sv) {
    if constexpr ((OPTS & kRagged) != 0) {
        ragged_tile_copy<DQK, BC, KVT>(a.k_src, c, a.num_kv_heads, tile, sk);
        ragged_tile_copy<DV, BC, KVT>(a.v_src, c, a.num_kv_heads, tile, sv);
    } else if constexpr ((OPTS & kPagesEarly) != 0) {
        kv_tile_copy<DQK, BC, KVT>(a, c, tile, pages, sk, sv);
    } else {
        load_kv_tile<DQK, BC, KVT>(a, c, tile, sk, sv);
    }
}

// One CTA: one work item (a sequence's new tokens t0.., packed into 64 * MT query rows) and
// one KV head kvh; 4 warps of 16 * MT rows each.
//   rows r = (new token t0 + r / g, query head kvh*g + r % g), the g query heads of kvh;
//   position of new token j is prefix + j, prefix = kv_len - q_len (causal aligned to the end);
//   S[r][p] = sm_scale * k_scale * q_r . k_p over key positions p < kv_len (DQK wide), masked
//   to p <= position(r) when causal;
//   out_r = v_scale * sum_p softmax_p(S[r]) v_p (DV wide),  lse_r = ln sum_p exp(S[r][p]);
//   a row that sees no key (kv_len 0) gets out 0 and lse -inf.
// Keys come from the paged cache (page table) or, with kRagged, from rows kv_indptr[seq] ..
// of dense k / v tensors.
// FlashAttention-2 order: KV tiles of BC positions stream through a STAGES-deep cp.async ring,
// each K/V tile loaded once for the g heads of the group; Q.K^T and P.V run on mma.sync
// m16n8k16 with float accumulators; the online softmax runs in base 2 in registers:
//   m' = max(m, max_p S log2e),  l' = l 2^(m-m') + sum_p 2^(S log2e - m'),
//   o' = o 2^(m-m') + sum_p 2^(S log2e - m') v_p;  out = o / l,  lse = (m + log2 l) ln 2.
// Tiles entirely below every row's causal limit skip the mask; tiles past the last row's
// limit are never visited.
template <int DQK, int DV, int MT, int BC, int STAGES, typename QT, typename KVT, int OPTS>
__global__ void __launch_bounds__(kThreads, 2) ap_prefill_kernel(const extend_args a) {
    constexpr bool FP8 = sizeof(KVT) == 1;
    constexpr bool RAGGED = (OPTS & kRagged) != 0;
    constexpr bool PAGES_EARLY = !RAGGED && (OPTS & kPagesEarly) != 0;
    static_assert(RAGGED || DQK == DV, "the paged source has one head dim for K and V");
    static_assert(DV <= DQK, "the output is staged in the Q tile's space");
    [[maybe_unused]] int pages[kv_rows<DQK, BC, KVT>::PASSES];
    constexpr int ROWS = kWarps * 16 * MT;
    constexpr int RING_K = BC * DQK * (int)sizeof(KVT);
    constexpr int RING_STAGE = BC * (DQK + DV) * (int)sizeof(KVT);
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *sq_ptr = smem;
    unsigned char *ring = smem + ROWS * DQK * 2;
    unsigned char *converted = ring + STAGES * RING_STAGE;
    const uint32_t sq = ap_smem_addr(sq_ptr);

    extend_cta c = cta_locate<RAGGED>(a);
    const int num_tiles = (c.kv_end + BC - 1) / BC;
    const int unmasked_tiles = (a.causal ? min(c.kv_len, c.prefix + c.t0 + 1) : c.kv_len) / BC;

    const int warp = threadIdx.x / 32;
    const int warp_row0 = warp * 16 * MT;
    load_q_tile<DQK, ROWS, QT>(a, c, sq);
    ap_cp_async_commit();
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        const uint32_t sk = ap_smem_addr(ring + st * RING_STAGE);
        if (st < num_tiles) {
            if constexpr (PAGES_EARLY) kv_tile_pages<DQK, BC, KVT>(a, c, st, pages);
            kv_tile_issue<DQK, DV, BC, KVT, OPTS>(a, c, st, pages, sk, sk + RING_K);
        }
        ap_cp_async_commit();
    }

    float o[MT][DV / 8][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int db = 0; db < DV / 8; ++db)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][db][e] = 0.f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.f;
    }

    for (int tile = 0; tile < num_tiles; ++tile) {
        const int next = tile + STAGES - 1;
        if constexpr (PAGES_EARLY)
            if (next < num_tiles) kv_tile_pages<DQK, BC, KVT>(a, c, next, pages);
        ap_cp_async_wait<STAGES - 2>(); // this tile (and Q) have landed
        __syncthreads();                // ...for every thread; the stage reused next is free
        {
            const uint32_t sk = ap_smem_addr(ring + (next % STAGES) * RING_STAGE);
            if (next < num_tiles)
                kv_tile_issue<DQK, DV, BC, KVT, OPTS>(a, c, next, pages, sk, sk + RING_K);
            ap_cp_async_commit();
        }
        unsigned char *stage = ring + (tile % STAGES) * RING_STAGE;
        uint32_t sk = ap_smem_addr(stage), sv = sk + RING_K;
        if constexpr (FP8) {
            convert_fp8_tile<DQK, DV, BC, QT>(stage, stage + RING_K, converted,
                                              converted + BC * DQK * 2);
            __syncthreads();
            sk = ap_smem_addr(converted);
            sv = sk + BC * DQK * 2;
        }

        float s[MT][BC / 8][4];
        tile_scores<DQK, MT, BC, QT>(s, sq, sk, warp_row0);
        if (tile >= unmasked_tiles) tile_mask<MT, BC>(s, a, c, tile * BC, warp_row0);
        tile_softmax<DV, MT, BC, (OPTS & kAlwaysRescale) != 0>(s, o, m, l, a.scale_log2);
        tile_accumulate<DV, MT, BC, QT>(s, o, sv);
    }
    ap_cp_async_wait<0>(); // no copy may still target shared memory when the CTA reuses it

    store_output<DV, MT, QT>(a, cta_locate<RAGGED>(a), o, m, l, sq_ptr, warp_row0);
}

template <int DQK, int DV, int MT, int BC, int STAGES, typename QT, typename KVT,
          int OPTS = kDefaultOpts>
ap_status extend_launch(const extend_args &a, int num_blocks, cudaStream_t stream, const char *who,
                        ap_msgbuf *msg) {
    constexpr size_t smem = extend_smem_bytes<DQK, DV, MT, BC, STAGES, KVT>();
    static std::atomic<uint64_t> devices_ready{0};
    ap_status st = ap_cuda_smem_optin_once(
        ap_prefill_kernel<DQK, DV, MT, BC, STAGES, QT, KVT, OPTS>, smem, devices_ready, who, msg);
    if (st != AP_OK) return st;
    ap_prefill_kernel<DQK, DV, MT, BC, STAGES, QT, KVT, OPTS>
        <<<num_blocks, kThreads, smem, stream>>>(a);
    return ap_cuda_launch_status(who, "ap_prefill_kernel", msg);
}

// The built kernels: equal head dims 64 / 128 / 256 over either source (the same tiles; 256 takes
// one m-tile a warp and 32-position KV tiles), and MLA's MHA form over the ragged source (qk 192 /
// v 128: 32-position tiles keep two CTAs of 88 KB on an SM).
template <typename QT, typename KVT, int OPTS>
ap_status extend_dispatch_equal(const extend_args &a, int head_dim, int num_blocks,
                                cudaStream_t stream, const char *who, ap_msgbuf *msg) {
    return ap_dispatch_head_dim(head_dim, AP_ERR_UNSUPPORTED, [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        constexpr int MT = D == 256 ? 1 : 2;
        constexpr int BC = D == 256 ? 32 : 64;
        return extend_launch<D, D, MT, BC, 2, QT, KVT, OPTS>(a, num_blocks, stream, who, msg);
    });
}

template <typename QT, typename KVT>
ap_status extend_dispatch(const extend_args &a, int ragged, int head_dim_qk, int head_dim_v,
                          int num_blocks, cudaStream_t stream, const char *who, ap_msgbuf *msg) {
    if (ragged && head_dim_qk == 192 && head_dim_v == 128)
        return extend_launch<192, 128, 2, 32, 2, QT, KVT, kDefaultOpts | kRagged>(a, num_blocks,
                                                                                  stream, who, msg);
    ap_status st = AP_ERR_UNSUPPORTED;
    if (head_dim_qk == head_dim_v)
        st = ragged ? extend_dispatch_equal<QT, KVT, kDefaultOpts | kRagged>(
                          a, head_dim_qk, num_blocks, stream, who, msg)
                    : extend_dispatch_equal<QT, KVT, kDefaultOpts>(a, head_dim_qk, num_blocks,
                                                                   stream, who, msg);
    if (st != AP_ERR_UNSUPPORTED) return st;
    ap_msgbuf_add(msg, "%s: head dims %d / %d over a %s source are not built", who, head_dim_qk,
                  head_dim_v, ragged ? "ragged" : "paged");
    return AP_ERR_UNSUPPORTED;
}

} // namespace

extern "C" int32_t ap_kit_prefill_default_tile_rows(int32_t head_dim_qk, int32_t head_dim_v) {
    if (head_dim_qk == 192 && head_dim_v == 128) return kWarps * 16 * 2;
    if (head_dim_qk != head_dim_v) return 0;
    switch (head_dim_qk) {
        case 64: return kWarps * 16 * 2;
        case 128: return kWarps * 16 * 2;
        case 256: return kWarps * 16;
        default: return 0;
    }
}

extern "C" int32_t ap_kit_prefill_tile_rows_built(int32_t head_dim_qk, int32_t head_dim_v,
                                                  int32_t tile_rows) {
    return tile_rows != 0 && tile_rows == ap_kit_prefill_default_tile_rows(head_dim_qk, head_dim_v);
}

namespace {

// The plan and the call agree, and every array the source needs is there.
ap_status extend_check_call(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan,
                            int ragged, const char *who, ap_msgbuf *msg) {
    if (plan->head_dim_qk != p->head_dim_qk || plan->head_dim_v != p->head_dim_v ||
        plan->num_qo_heads != p->num_qo_heads || plan->num_kv_heads != p->num_kv_heads ||
        plan->causal != (p->causal != 0) || plan->ragged != ragged ||
        !ap_kit_prefill_tile_rows_built(plan->head_dim_qk, plan->head_dim_v, plan->tile_rows)) {
        ap_msgbuf_add(msg,
                      "%s: the plan (head dims %d/%d, heads %d/%d, causal %d, ragged %d) does not "
                      "match the call (head dims %d/%d, heads %d/%d, causal %d, ragged %d)",
                      who, plan->head_dim_qk, plan->head_dim_v, plan->num_qo_heads,
                      plan->num_kv_heads, plan->causal, plan->ragged, p->head_dim_qk, p->head_dim_v,
                      p->num_qo_heads, p->num_kv_heads, p->causal != 0, ragged);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (plan->num_items == 0) return AP_OK;
    if ((int64_t)plan->num_items * p->num_kv_heads > INT_MAX) {
        ap_msgbuf_add(msg, "%s: %d work items x %d KV heads is too many CTAs", who, plan->num_items,
                      p->num_kv_heads);
        return AP_ERR_UNSUPPORTED;
    }
    const bool source_missing =
        ragged ? (p->k == NULL || p->v == NULL)
               : (p->k_pages == NULL || p->v_pages == NULL || p->kv_page_indptr == NULL ||
                  p->kv_page_indices == NULL || p->kv_last_page_len == NULL);
    if (p->q == NULL || p->out == NULL || p->qo_indptr == NULL || source_missing) {
        ap_msgbuf_add(msg, "%s: a tensor or batch array is NULL", who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}

// Checks a call against its plan and builds the kernel's arguments: AP_OK with *num_blocks 0
// when there is nothing to compute.
ap_status extend_prepare(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan,
                         extend_args *out, int *num_blocks, const char *who, ap_msgbuf *msg) {
    *num_blocks = 0;
    if (p == NULL || plan == NULL) {
        ap_msgbuf_add(msg, "%s: NULL params or plan", who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    const int ragged = p->kv_indptr != NULL;
    ap_status st =
        ap_kit_prefill_check_config(ragged, p->head_dim_qk, p->head_dim_v, p->q_dtype, p->kv_dtype,
                                    p->num_qo_heads, p->num_kv_heads, p->page_size, who, msg);
    if (st == AP_OK) st = extend_check_call(p, plan, ragged, who, msg);
    if (st != AP_OK || plan->num_items == 0) return st;

    const bool fp8 = p->kv_dtype == AP_DTYPE_FP8_E4M3;
    extend_args &a = *out;
    a = extend_args{};
    a.q = p->q;
    a.out = p->out;
    a.lse = p->lse;
    a.k_src = ragged ? p->k : p->k_pages;
    a.v_src = ragged ? p->v : p->v_pages;
    a.qo_indptr = p->qo_indptr;
    a.kv_indptr = ragged ? p->kv_indptr : p->kv_page_indptr;
    a.kv_page_indices = p->kv_page_indices;
    a.kv_last_page_len = p->kv_last_page_len;
    a.items = static_cast<const int4 *>(plan->items);
    a.num_qo_heads = p->num_qo_heads;
    a.num_kv_heads = p->num_kv_heads;
    a.group = p->num_qo_heads / p->num_kv_heads;
    a.page_size = ragged ? 1 : p->page_size;
    a.page_shift = ragged ? 0 : ap_page_shift(p->page_size);
    a.tile_tokens = plan->tile_tokens;
    a.causal = p->causal != 0;
    a.scale_log2 = p->sm_scale * (fp8 ? p->k_scale : 1.f) * ap_log2e;
    a.v_scale = fp8 ? p->v_scale : 1.f;

    *num_blocks = plan->num_items * p->num_kv_heads;
    return AP_OK;
}

} // namespace

extern "C" ap_status ap_kit_prefill_run(const ap_kit_prefill_params *p,
                                        const ap_kit_prefill_plan *plan, void *stream,
                                        const char *who, ap_msgbuf *msg) {
    if (plan != NULL && plan->hopper) return ap_kit_prefill_hopper_run(p, plan, stream, who, msg);
    extend_args a;
    int num_blocks = 0;
    ap_status st = extend_prepare(p, plan, &a, &num_blocks, who, msg);
    if (st != AP_OK || num_blocks == 0) return st;
    const int ragged = p->kv_indptr != NULL;
    const int dqk = p->head_dim_qk, dv = p->head_dim_v;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return ap_dispatch_q(p->q_dtype, AP_ERR_UNSUPPORTED, [&](auto q) {
        using QT = typename decltype(q)::type;
        return ap_dispatch_kv<QT>(p->kv_dtype, AP_ERR_UNSUPPORTED, [&](auto kv) {
            return extend_dispatch<QT, typename decltype(kv)::type>(a, ragged, dqk, dv, num_blocks,
                                                                    s, who, msg);
        });
    });
}
