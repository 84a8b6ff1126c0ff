// combine.cu: the split-KV combine of the MLA decode kernels (decode.cu, and any other decode
// kernel that leaves the same partial states): per row, out = sum_s w_s o_s / sum_s w_s with
// w_s = 2^(lse2_s - max), lse = log(sum_s w_s) + max, launched with programmatic dependent launch.
#include <cuda_runtime.h>
#include <math.h>

#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/pdl.cuh"
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

// Fold splits s0, s0 + 16, ... (kCombinePer of them, those below S) into `ms`; their loads are
// all issued before the first weight is formed.
template <int M>
__device__ __forceinline__ void merge_splits(const float *lse, const float *src, int s0, int S,
                                             MergeState &ms) {
    constexpr int64_t kStep = static_cast<int64_t>(M) * MLA_LATENT; // one split further
    float l[kCombinePer];
    float4 v[kCombinePer];
    // unpredicated: a split past S loads split S - 1 again (no predicate per load, so ptxas
    // keeps all nine in flight) and gets weight 0 below
#pragma unroll
    for (int i = 0; i < kCombinePer; i++) {
        const int s = min(s0 + i * kCombineSlots, S - 1);
        l[i] = lse[static_cast<int64_t>(s) * M];
        v[i] = *reinterpret_cast<const float4 *>(src + s * kStep);
    }
#pragma unroll
    for (int i = 0; i < kCombinePer; i++)
        if (s0 + i * kCombineSlots >= S) l[i] = -INFINITY;
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
        merge_splits<M>(lse, src, s0, S, ms);
    part[slot][lane] = ms.acc;
    if (lane == 0) part_mw[slot] = make_float2(ms.m, ms.w);
    __syncthreads();
    if (slot != 0) return;
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
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    const int tok = gr / p.num_heads, head = gr % p.num_heads;
    const int64_t orow = static_cast<int64_t>(q_begin + tok) * p.num_heads + head;
    uint8_t *dst = static_cast<uint8_t *>(p.out) + (orow * MLA_LATENT + d) * 2;
    *reinterpret_cast<uint2 *>(dst) = make_uint2(ap_pack2<__nv_bfloat16>(acc.x * inv, acc.y * inv),
                                                 ap_pack2<__nv_bfloat16>(acc.z * inv, acc.w * inv));
    if (p.lse != NULL && chunk == 0 && lane == 0)
        p.lse[orow] = wsum > 0.f ? (mx + log2f(wsum)) * 0.69314718055994531f : -INFINITY;
}

template <int M>
ap_status launch_combine(const mla_decode_params &p, cudaStream_t stream, ap_msgbuf *msg) {
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
                             cudaSharedmemCarveoutMaxShared)};
    for (cudaError_t err : errs)
        if (err != cudaSuccess) return ap_cuda_status(err, MLA_WHO, "cudaFuncSetAttribute", msg);
    return AP_OK;
}
