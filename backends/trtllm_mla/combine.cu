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

// Combine: one CTA per (row, quarter of the 512 output dims); its 8 warps take every 8th split,
// so a batch of few rows with many splits (B1: 16 rows x 132 splits) still has 8 x 4 loads in
// flight per CTA. The splits' base-2 states merge by their weights 2^(lse2 - max); the loop over
// splits has no branch around its loads (an empty split wrote zeros and -inf: weight 0).
constexpr int kCombineChunks = 4; // 128 output dims per CTA: one float4 per lane
constexpr int kCombineThreads = 256;

template <int M>
__global__ void __launch_bounds__(kCombineThreads)
    mla_combine_kernel(const mla_decode_params p, int row_blocks) {
    constexpr int kWarpsC = kCombineThreads / 32;
    __shared__ float4 part[kWarpsC][32];
    __shared__ float part_w[kWarpsC];
    ap_pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunk = static_cast<int>(blockIdx.x % kCombineChunks);
    const int64_t item = blockIdx.x / kCombineChunks; // (seq, rb, row)
    const int r = static_cast<int>(item % M);
    const int64_t sr = item / M;
    const int rb = static_cast<int>(sr % row_blocks), seq = static_cast<int>(sr / row_blocks);
    if (seq >= p.num_seqs) return;
    const int q_begin = __ldg(p.qo_indptr + seq);
    const int rows = (__ldg(p.qo_indptr + seq + 1) - q_begin) * p.num_heads;
    const int gr = rb * M + r;
    if (gr >= rows) return; // uniform over the CTA
    const int S = p.num_splits;
    const int64_t cta0 = (static_cast<int64_t>(seq) * row_blocks + rb) * S;
    const float *lse = p.partial_lse + cta0 * M + r; // split s at lse[s * M]
    float mx = -INFINITY;
    for (int s = lane; s < S; s += 32) mx = fmaxf(mx, lse[static_cast<int64_t>(s) * M]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float base = mx == -INFINITY ? 0.f : mx;
    const int d = chunk * (MLA_LATENT / kCombineChunks) + 4 * lane;
    const float *src = p.partial_out + (cta0 * M + r) * MLA_LATENT + d;
    const int64_t step = static_cast<int64_t>(M) * MLA_LATENT; // one split further
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;
#pragma unroll 4
    for (int s = warp; s < S; s += kWarpsC) {
        const float4 v = *reinterpret_cast<const float4 *>(src + s * step);
        const float w = exp2f(lse[static_cast<int64_t>(s) * M] - base); // -inf: 0
        wsum += w;
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
    }
    part[warp][lane] = acc;
    if (lane == 0) part_w[warp] = wsum;
    __syncthreads();
    if (warp != 0) return;
    acc = part[0][lane];
    wsum = part_w[0];
#pragma unroll
    for (int w = 1; w < kWarpsC; w++) {
        const float4 v = part[w][lane];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
        wsum += part_w[w];
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
