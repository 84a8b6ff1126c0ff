// merge_states.cu: combines the partial attention states of (sequence, KV head) pairs split over
// workers (split-KV decode, chunked prefill): output and LSE by log-sum-exp.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_status.cuh"
#include "dispatch.cuh"
#include "dtype.cuh"
#include "kit.h"
#include "softmax_state.cuh"

namespace {

constexpr int kThreads = 128;

// Block-wide max or sum of one float per thread (4 warps), the result in every thread.
template <bool MAX> __device__ __forceinline__ float block_reduce(float x, float *scratch) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float y = __shfl_xor_sync(0xffffffffu, x, off);
        x = MAX ? fmaxf(x, y) : x + y;
    }
    __syncthreads(); // scratch may still be read by a previous reduction
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = x;
    __syncthreads();
    x = scratch[0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; w++) x = MAX ? fmaxf(x, scratch[w]) : x + scratch[w];
    return x;
}

// One block per (merge, query head of the group). With partial states (o_p, lse2_p), p = 1..n:
//   M = max_p lse2_p,  w_p = 2^(lse2_p - M),  o = sum_p w_p o_p / sum_p w_p,
//   lse = ln2 * (M + log2 sum_p w_p)            (softmax_state.cuh)
// Threads split the head dims into float4 columns and the partials into `lanes` interleaved
// streams, so n partials cost n / lanes dependent loads per thread, not n.
template <typename QT>
__global__ void __launch_bounds__(kThreads)
    ap_merge_states_kernel(const ap_kit_merge *merges, const float *partial_out,
                           const float *partial_lse, QT *out, float *lse, int32_t group,
                           int32_t head_dim, int32_t num_qo_heads) {
    __shared__ float scratch[kThreads / 32];
    __shared__ float4 sums[kThreads];
    const ap_kit_merge mg = merges[blockIdx.x];
    const int h = blockIdx.y;
    const int n = mg.end_partial - mg.first_partial;
    const float *lse_h = partial_lse + (int64_t)mg.first_partial * group + h;

    float max_lse2 = -INFINITY;
    for (int p = threadIdx.x; p < n; p += kThreads) max_lse2 = fmaxf(max_lse2, lse_h[p * group]);
    max_lse2 = block_reduce<true>(max_lse2, scratch);
    float weight_sum = 0.f;
    for (int p = threadIdx.x; p < n; p += kThreads)
        weight_sum += ap_softmax_merge_weight(lse_h[p * group], max_lse2);
    weight_sum = block_reduce<false>(weight_sum, scratch);

    const int vecs = head_dim / 4, lanes = kThreads / vecs;
    const int v = threadIdx.x % vecs, lane = threadIdx.x / vecs;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lane < lanes) {
#pragma unroll 4
        for (int p = lane; p < n; p += lanes) {
            const float w = ap_softmax_merge_weight(lse_h[p * group], max_lse2);
            const float4 o = *reinterpret_cast<const float4 *>(
                partial_out + ((int64_t)(mg.first_partial + p) * group + h) * head_dim + 4 * v);
            acc.x += w * o.x;
            acc.y += w * o.y;
            acc.z += w * o.z;
            acc.w += w * o.w;
        }
    }
    sums[threadIdx.x] = acc;
    __syncthreads();
    const int64_t row = (int64_t)mg.seq * num_qo_heads + mg.kv_head * group + h;
    if (threadIdx.x < vecs) {
        for (int k = 1; k < lanes; k++) {
            const float4 o = sums[k * vecs + v];
            acc.x += o.x;
            acc.y += o.y;
            acc.z += o.z;
            acc.w += o.w;
        }
        const float inv = 1.f / weight_sum;
        QT *dst = out + row * head_dim + 4 * v;
        dst[0] = ap_from_float<QT>(acc.x * inv);
        dst[1] = ap_from_float<QT>(acc.y * inv);
        dst[2] = ap_from_float<QT>(acc.z * inv);
        dst[3] = ap_from_float<QT>(acc.w * inv);
    }
    if (lse != NULL && threadIdx.x == 0) lse[row] = ap_lse2_to_ln(max_lse2 + log2f(weight_sum));
}

// The split-KV prefill's merge (ap_kit_merge_rows_args): one row (token t, head h) per width / 8
// threads, each thread 8 columns (a 16-byte load per part). With M = max_s lse_s and w_s =
// e^(lse_s - M): out = sum_s w_s o_s / sum_s w_s, lse = M + ln sum_s w_s.
template <typename QT>
__global__ void __launch_bounds__(kThreads)
    ap_merge_rows_kernel(const QT *partial_out, const float *partial_lse, QT *out, float *lse,
                         int32_t tokens, int32_t heads, int32_t parts, int32_t width) {
    const int per_row = width / 8;
    const int64_t row = (int64_t)blockIdx.x * (kThreads / per_row) + threadIdx.x / per_row;
    const int col = 8 * (threadIdx.x % per_row);
    if (threadIdx.x >= kThreads / per_row * per_row || row >= (int64_t)tokens * heads) return;
    const int64_t t = row / heads, h = row - t * heads;
    const float *lse_row = partial_lse + t * parts * heads + h; /* part s at s * heads */
    float m = -INFINITY;
    for (int s = 0; s < parts; s++) m = fmaxf(m, lse_row[(int64_t)s * heads]);
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, sum = 0.f;
    for (int s = 0; m != -INFINITY && s < parts; s++) {
        const float w = __expf(lse_row[(int64_t)s * heads] - m);
        if (w == 0.f) continue; /* an empty part (its rows are 0) */
        sum += w;
        const uint4 raw = *reinterpret_cast<const uint4 *>(
            partial_out + ((t * parts + s) * heads + h) * width + col);
        const QT *x = reinterpret_cast<const QT *>(&raw);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] += w * ap_to_float(x[j]);
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    uint4 packed;
    QT *y = reinterpret_cast<QT *>(&packed);
#pragma unroll
    for (int j = 0; j < 8; j++) y[j] = ap_from_float<QT>(acc[j] * inv);
    *reinterpret_cast<uint4 *>(out + row * width + col) = packed;
    if (lse != NULL && col == 0) lse[row] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

} // namespace

extern "C" ap_status ap_kit_merge_rows_run(const ap_kit_merge_rows_args *args, void *stream,
                                           const char *who, ap_msgbuf *msg) {
    const int64_t rows = (int64_t)args->tokens * args->heads;
    if (rows == 0) return AP_OK;
    if (args->width % 8 != 0 || args->width <= 0 || args->width / 8 > kThreads || args->parts < 1 ||
        ((uintptr_t)args->partial_out | (uintptr_t)args->out) % 16 != 0) {
        ap_msgbuf_add(msg,
                      "%s: merge of split-KV rows: width %d, parts %d not served (or the rows are "
                      "not 16-byte aligned)",
                      who, args->width, args->parts);
        return AP_ERR_UNSUPPORTED;
    }
    const int64_t per_block = kThreads / (args->width / 8);
    const dim3 grid((unsigned)((rows + per_block - 1) / per_block));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const bool launched = ap_dispatch_q(args->out_dtype, false, [&](auto out) {
        using OT = typename decltype(out)::type;
        ap_merge_rows_kernel<OT>
            <<<grid, kThreads, 0, s>>>(static_cast<const OT *>(args->partial_out),
                                       args->partial_lse, static_cast<OT *>(args->out), args->lse,
                                       args->tokens, args->heads, args->parts, args->width);
        return true;
    });
    if (!launched) {
        ap_msgbuf_add(msg, "%s: merge of split-KV rows: output dtype %s not served", who,
                      ap_dtype_str(args->out_dtype));
        return AP_ERR_UNSUPPORTED;
    }
    return ap_cuda_launch_status(who, "ap_merge_rows_kernel", msg);
}

extern "C" ap_status ap_kit_merge_states_run(const ap_kit_merge_args *args, void *stream,
                                             const char *who, ap_msgbuf *msg) {
    if (args->num_merges == 0) return AP_OK;
    const int32_t group = args->group, head_dim = args->head_dim;
    if (head_dim % 4 != 0 || head_dim / 4 > kThreads || group < 1) {
        ap_msgbuf_add(msg, "%s: merge of partial states: head_dim %d, group %d not served", who,
                      head_dim, group);
        return AP_ERR_UNSUPPORTED;
    }
    const dim3 grid((unsigned)args->num_merges, (unsigned)group);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const bool launched = ap_dispatch_q(args->out_dtype, false, [&](auto out) {
        using OT = typename decltype(out)::type;
        ap_merge_states_kernel<OT><<<grid, kThreads, 0, s>>>(
            args->merges, args->partial_out, args->partial_lse, static_cast<OT *>(args->out),
            args->lse, group, head_dim, args->num_qo_heads);
        return true;
    });
    if (!launched) {
        ap_msgbuf_add(msg, "%s: merge of partial states: output dtype %s not served", who,
                      ap_dtype_str(args->out_dtype));
        return AP_ERR_UNSUPPORTED;
    }
    return ap_cuda_launch_status(who, "ap_merge_states_kernel", msg);
}
