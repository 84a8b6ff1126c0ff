// combine.cu: the split-KV combine of the MLA decode kernels (decode.cu, and any other decode
// kernel that leaves the same partial states): per row, out = sum_s w_s o_s / sum_s w_s with
// w_s = 2^(lse2_s - max), lse = log(sum_s w_s) + max, launched with programmatic dependent launch.
#include <cuda_runtime.h>
#include <math.h>

#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/pdl.cuh"
#include "decode_flat.cuh"
#include "decode_seq.cuh"
#include "mla.h"

#define MLA_WHO "trtllm_mla combine"

namespace {

// Combine: one CTA per (row, eighth of the 512 output dims): 16 threads cover the chunk's 64
// dims (a float4 each), so the CTA's 256 threads hold 16 splits side by side and each thread
// loads its kCombinePer splits (s = slot + 16 i) all at once before it merges any: one round
// trip to L2 for the partials, not one per split group. B1 H16 (16 rows, 132 splits) is 128 CTAs
// (was 64: rows x 4 chunks of 128 dims, each warp ~5 dependent load rounds). The minimum of
// one CTA per SM in the launch bounds lets ptxas keep all 18 loads ahead of the first exp2 (79
// registers; with its default it sank five of the nine float4 loads past them).
// A thread merges its splits by a local maximum; the 16 slots then merge through shared memory
// by theirs. An empty split wrote zeros and -inf: weight 0, no branch around its loads.
constexpr int kCombineChunks = 8; // 64 output dims per CTA
constexpr int kCombineThreads = 256;
constexpr int kCombineLanes = MLA_LATENT / kCombineChunks / 4; // 16: one float4 each
constexpr int kCombineSlots = kCombineThreads / kCombineLanes; // 16 splits side by side
constexpr int kCombinePer = 9; // splits a thread has in flight: 16 x 9 = 144 >= 132 SMs' splits

// Base-2 merge state of one thread's (or slot's) splits: sum_s 2^(lse2_s - m) o_s and its weights.
struct MergeState {
    float4 acc;
    float m, w;
};

// Where split s of a row left its state: slot s (the split grid: a row's splits side by side), or
// the flat schedule's slots (decode_flat.cuh): piece 0 in `first`, piece s > 0 in 2 (c0 + s).
struct SplitSlots {
    __device__ __forceinline__ int operator()(int s) const {
        return s;
    }
};
struct FlatSlots {
    int first, c0;
    __device__ __forceinline__ int operator()(int s) const {
        return s == 0 ? first : 2 * (c0 + s);
    }
};

// Fold splits s0, s0 + kStride, ... (kCombinePer of them, those below S) into `ms`; their loads
// are all issued before the first weight is formed. lse and src point at the row's split 0 slot
// 0 entries: slot k's at lse[k * M] and src[k * M * 512].
template <int M, int kStride, class SlotOf>
__device__ __forceinline__ void merge_splits(const float *lse, const float *src, int s0, int S,
                                             SlotOf slot_of, MergeState &ms) {
    constexpr int64_t kStep = static_cast<int64_t>(M) * MLA_LATENT; // one slot further
    float l[kCombinePer];
    float4 v[kCombinePer];
    // unpredicated: a split past S loads split S - 1 again (no predicate per load, so ptxas
    // keeps all nine in flight) and gets weight 0 below
#pragma unroll
    for (int i = 0; i < kCombinePer; i++) {
        const int k = slot_of(min(s0 + i * kStride, S - 1));
        l[i] = lse[static_cast<int64_t>(k) * M];
        v[i] = *reinterpret_cast<const float4 *>(src + k * kStep);
    }
#pragma unroll
    for (int i = 0; i < kCombinePer; i++)
        if (s0 + i * kStride >= S) l[i] = -INFINITY;
    float mx = ms.m;
#pragma unroll
    for (int i = 0; i < kCombinePer; i++) mx = fmaxf(mx, l[i]);
    const float base = mx == -INFINITY ? 0.f : mx;
    const float r = exp2f(ms.m - base); // the state so far, to the new base (-inf: 0)
    ms.acc = make_float4(ms.acc.x * r, ms.acc.y * r, ms.acc.z * r, ms.acc.w * r);
    ms.w *= r;
#pragma unroll
    for (int i = 0; i < kCombinePer; i++) {
        const float wi = exp2f(l[i] - base);
        ms.w += wi;
        ms.acc.x += wi * v[i].x;
        ms.acc.y += wi * v[i].y;
        ms.acc.z += wi * v[i].z;
        ms.acc.w += wi * v[i].w;
    }
    ms.m = mx;
}

// Output dims d .. d + 3 of query row gr of sequence sq from a merged state: out (bf16) and, once
// per row (write_lse), lse.
__device__ __forceinline__ void combine_store(const mla_decode_params &p, int q_begin, int gr,
                                              int d, float4 acc, float mx, float wsum,
                                              bool write_lse) {
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    const int tok = gr / p.num_heads, head = gr % p.num_heads;
    const int64_t orow = static_cast<int64_t>(q_begin + tok) * p.num_heads + head;
    uint8_t *dst = static_cast<uint8_t *>(p.out) + (orow * MLA_LATENT + d) * 2;
    *reinterpret_cast<uint2 *>(dst) = make_uint2(ap_pack2<__nv_bfloat16>(acc.x * inv, acc.y * inv),
                                                 ap_pack2<__nv_bfloat16>(acc.z * inv, acc.w * inv));
    if (p.lse != NULL && write_lse)
        p.lse[orow] = wsum > 0.f ? (mx + log2f(wsum)) * 0.69314718055994531f : -INFINITY;
}

// The CTA's 16 slot groups' states (part, part_mw) merged by group 0's lanes and stored.
__device__ __forceinline__ void combine_groups(const mla_decode_params &p,
                                               const float4 (&part)[kCombineSlots][kCombineLanes],
                                               const float2 (&part_mw)[kCombineSlots], int lane,
                                               int q_begin, int gr, int d, bool chunk0) {
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kCombineSlots; k++) mx = fmaxf(mx, part_mw[k].x);
    const float base = mx == -INFINITY ? 0.f : mx;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;
#pragma unroll
    for (int k = 0; k < kCombineSlots; k++) {
        const float f = exp2f(part_mw[k].x - base); // a slot without weight: 0
        const float4 v = part[k][lane];
        wsum += f * part_mw[k].y;
        acc.x += f * v.x;
        acc.y += f * v.y;
        acc.z += f * v.z;
        acc.w += f * v.w;
    }
    combine_store(p, q_begin, gr, d, acc, mx, wsum, chunk0 && lane == 0);
}

template <int M>
__global__ void __launch_bounds__(kCombineThreads, 1)
    mla_combine_kernel(const mla_decode_params p, int row_blocks) {
    __shared__ float4 part[kCombineSlots][kCombineLanes];
    __shared__ float2 part_mw[kCombineSlots];
    const int slot = threadIdx.x / kCombineLanes, lane = threadIdx.x % kCombineLanes;
    const int chunk = static_cast<int>(blockIdx.x % kCombineChunks);
    const int64_t item = blockIdx.x / kCombineChunks; // (seq, rb, row)
    const int r = static_cast<int>(item % M);
    const int64_t sr = item / M;
    const int rb = static_cast<int>(sr % row_blocks), seq = static_cast<int>(sr / row_blocks);
    if (seq >= p.num_seqs) return;
    // qo_indptr is no output of the decode kernel: read before the wait, beside its tail
    const int q_begin = __ldg(p.qo_indptr + seq);
    const int rows = (__ldg(p.qo_indptr + seq + 1) - q_begin) * p.num_heads;
    const int gr = rb * M + r;
    if (gr >= rows) return; // uniform over the CTA
    const int S = p.num_splits;
    const int64_t cta0 = (static_cast<int64_t>(seq) * row_blocks + rb) * S;
    const float *lse = p.partial_lse + cta0 * M + r; // split s at lse[s * M]
    const int d = chunk * (MLA_LATENT / kCombineChunks) + 4 * lane;
    const float *src = p.partial_out + (cta0 * M + r) * MLA_LATENT + d;
    ap_pdl_wait();
    MergeState ms = {make_float4(0.f, 0.f, 0.f, 0.f), -INFINITY, 0.f};
    for (int s0 = slot; s0 < S; s0 += kCombineSlots * kCombinePer)
        merge_splits<M, kCombineSlots>(lse, src, s0, S, SplitSlots(), ms);
    part[slot][lane] = ms.acc;
    if (lane == 0) part_mw[slot] = make_float2(ms.m, ms.w);
    __syncthreads();
    if (slot != 0) return;
    combine_groups(p, part, part_mw, lane, q_begin, gr, d, chunk == 0);
}

// Item `item` of a cut sequence: its row gr and 64-dim chunk, the lane's dims d .. d + 3, and
// where slot 0's state of that row and dims lies (slot k's: lse[k * M], src[k * M * 512]).
struct FlatItem {
    int gr, chunk, d;
    const float *lse, *src;
    __device__ __forceinline__ FlatItem(const mla_decode_params &p, int item, int lane)
        : gr(item / kCombineChunks), chunk(item % kCombineChunks),
          d(chunk * (MLA_LATENT / kCombineChunks) + 4 * lane), lse(p.partial_lse + gr),
          src(p.partial_out + static_cast<int64_t>(gr) * MLA_LATENT + d) {}
};

// The flat schedule's combine (decode_flat.cuh), one CTA per decode CTA. CTA b serves the
// sequence that decode CTA b's share starts inside of, if it does (a cut at b; none when the
// decode ran whole sequences): the sequence's n pieces lie in decode CTAs c0 .. c1 (b among
// them), and its n - 1 combine CTAs b = c0 + 1 .. c1 share its items, (row, 64 of the 512 dims):
// CTA k = b - c0 - 1 takes items k, k + n - 1, ... . With more than 16 pieces (B1's ~128) the 16
// slot groups split each item's pieces as mla_combine_kernel does, item after item; with fewer,
// group g takes every 16th item and merges all n pieces of it alone. The schedule is computed
// before the wait, beside the decode grid's tail.
template <int M>
__global__ void __launch_bounds__(kCombineThreads, 1)
    mla_flat_combine_kernel(const mla_decode_params p) {
    __shared__ float4 part[kCombineSlots][kCombineLanes];
    __shared__ float2 part_mw[kCombineSlots];
    __shared__ int share[6];
    const int group = threadIdx.x / kCombineLanes, lane = threadIdx.x % kCombineLanes;
    const int b = static_cast<int>(blockIdx.x);
    if (b == 0) return;
    const FlatShare f = flat_share_cta(p, b, p.flat_ctas, share);
    if (f.whole || f.seq < 0 || f.seq_start == f.begin) return; // no cut at b
    const Seq sq = seq_of(p, f.seq);
    const int rows = sq.q_len * p.num_heads;
    const int tiles = (sq.kv_len + MLA_TILE - 1) / MLA_TILE;
    const int c0 = f.seq_start / f.per, c1 = (f.seq_start + tiles - 1) / f.per;
    const int n = c1 - c0 + 1, helpers = n - 1, k = b - c0 - 1;
    const FlatSlots slot_of = {2 * c0 + (f.seq_start == c0 * f.per ? 0 : 1), c0};
    const int items = rows * kCombineChunks;
    const int mine = items > k ? (items - k + helpers - 1) / helpers : 0;
    ap_pdl_wait();           // the partial states are the decode grid's
    if (n > kCombineSlots) { // many pieces: all 16 slot groups on each item's pieces
        for (int j = 0; j < mine; j++) {
            const FlatItem it(p, k + j * helpers, lane);
            MergeState ms = {make_float4(0.f, 0.f, 0.f, 0.f), -INFINITY, 0.f};
            for (int s0 = group; s0 < n; s0 += kCombineSlots * kCombinePer)
                merge_splits<M, kCombineSlots>(it.lse, it.src, s0, n, slot_of, ms);
            part[group][lane] = ms.acc;
            if (lane == 0) part_mw[group] = make_float2(ms.m, ms.w);
            __syncthreads();
            if (group == 0)
                combine_groups(p, part, part_mw, lane, sq.q_begin, it.gr, it.d, it.chunk == 0);
            __syncthreads(); // part is free for the next item
        }
        return;
    }
    for (int j = group; j < mine; j += kCombineSlots) {
        const FlatItem it(p, k + j * helpers, lane);
        MergeState ms = {make_float4(0.f, 0.f, 0.f, 0.f), -INFINITY, 0.f};
        for (int s0 = 0; s0 < n; s0 += kCombinePer)
            merge_splits<M, 1>(it.lse, it.src, s0, n, slot_of, ms);
        combine_store(p, sq.q_begin, it.gr, it.d, ms.acc, ms.m, ms.w, it.chunk == 0 && lane == 0);
    }
}

template <int M>
ap_status launch_combine(const mla_decode_params &p, cudaStream_t stream, ap_msgbuf *msg) {
    if (p.flat) {
        const dim3 fgrid(static_cast<unsigned>(p.flat_ctas));
        ap_status st =
            ap_cuda_status(ap_launch(mla_flat_combine_kernel<M>, fgrid, dim3(kCombineThreads), 0,
                                     stream, p.use_pdl != 0, p),
                           MLA_WHO, "mla_flat_combine_kernel", msg);
        if (st != AP_OK) return st;
        return ap_cuda_launch_status(MLA_WHO, "mla_flat_combine_kernel", msg);
    }
    const int row_blocks = (p.max_q_len * p.num_heads + M - 1) / M;
    const int64_t items = static_cast<int64_t>(p.num_seqs) * row_blocks * M * kCombineChunks;
    dim3 cgrid(static_cast<unsigned>(items));
    ap_status st = ap_cuda_status(ap_launch(mla_combine_kernel<M>, cgrid, dim3(kCombineThreads), 0,
                                            stream, p.use_pdl != 0, p, row_blocks),
                                  MLA_WHO, "mla_combine_kernel", msg);
    if (st != AP_OK) return st;
    return ap_cuda_launch_status(MLA_WHO, "mla_combine_kernel", msg);
}

} // namespace

extern "C" ap_status mla_combine_run(const mla_decode_params *p, int32_t block_rows,
                                     void *stream_ptr, ap_msgbuf *msg) {
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    if (block_rows == 16) return launch_combine<16>(*p, stream, msg);
    if (block_rows == 64) return launch_combine<64>(*p, stream, msg);
    ap_msgbuf_add(msg, "%s: no combine for %d rows per block", MLA_WHO,
                  static_cast<int>(block_rows));
    return AP_ERR_INTERNAL;
}

// The combine takes the decode kernels' shared-memory carveout (the most shared memory): with its
// own (the driver picked 102 KB for its 4 KB) every SM would switch configuration between the
// decode grid and the combine, and back for the next decode.
extern "C" ap_status mla_combine_setup(ap_msgbuf *msg) {
    const cudaError_t errs[] = {
        cudaFuncSetAttribute(mla_combine_kernel<16>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared),
        cudaFuncSetAttribute(mla_combine_kernel<64>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared),
        cudaFuncSetAttribute(mla_flat_combine_kernel<16>,
                             cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared),
        cudaFuncSetAttribute(mla_flat_combine_kernel<64>,
                             cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared)};
    for (cudaError_t err : errs)
        if (err != cudaSuccess) return ap_cuda_status(err, MLA_WHO, "cudaFuncSetAttribute", msg);
    return AP_OK;
}
