// merge_state.cu: merge_state/1 on the GPU: (o_a, lse_a) + (o_b, lse_b) -> (o, lse), exactly as
// plugin_api.h defines it (softmax_state.cuh). One warp per row: the row's two lse values are read
// by every lane before lane 0 writes the merged one, so o and lse may alias o_a and lse_a.
#include <cuda_runtime.h>

#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/softmax_state.cuh"
#include "mla.h"

#define MLA_WHO "trtllm_mla merge_state"

namespace {

constexpr int kThreads = 256;

template <typename T> __device__ __forceinline__ float load_f(const T *p, int64_t i) {
    return ap_to_float(p[i]);
}
template <> __device__ __forceinline__ float load_f<float>(const float *p, int64_t i) {
    return p[i];
}
template <typename T> __device__ __forceinline__ void store_f(T *p, int64_t i, float x) {
    p[i] = ap_from_float<T>(x);
}
template <> __device__ __forceinline__ void store_f<float>(float *p, int64_t i, float x) {
    p[i] = x;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) merge_kernel(const mla_merge_params p) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= p.rows) return;
    const ap_state_weights w = ap_state_merge_weights(p.lse_a[row], p.lse_b[row]);
    __syncwarp();
    const T *a = static_cast<const T *>(p.o_a);
    const T *b = static_cast<const T *>(p.o_b);
    T *o = static_cast<T *>(p.o);
    const int64_t base = row * p.dim;
    for (int d = lane; d < p.dim; d += 32) {
        // A side with weight 0 is not read into the sum: its values may be anything (even NaN
        // from an empty pass), and 0 * NaN would spoil the row.
        float x = 0.f;
        if (w.w_a > 0.f) x += w.w_a * load_f(a, base + d);
        if (w.w_b > 0.f) x += w.w_b * load_f(b, base + d);
        store_f(o, base + d, x);
    }
    if (p.lse != NULL && lane == 0) p.lse[row] = w.lse;
}

template <typename T>
ap_status launch(const mla_merge_params &p, cudaStream_t stream, ap_msgbuf *msg) {
    const int64_t blocks = (p.rows + kThreads / 32 - 1) / (kThreads / 32);
    merge_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
    return ap_cuda_launch_status(MLA_WHO, "merge_kernel", msg);
}

} // namespace

extern "C" ap_status mla_merge_run(const mla_merge_params *p, void *stream_ptr, ap_msgbuf *msg) {
    if (p->rows == 0) return AP_OK;
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    switch (p->dtype) {
        case AP_DTYPE_BF16: return launch<__nv_bfloat16>(*p, stream, msg);
        case AP_DTYPE_F16: return launch<__half>(*p, stream, msg);
        case AP_DTYPE_F32: return launch<float>(*p, stream, msg);
        default:
            ap_msgbuf_add(msg, MLA_WHO ": dtype %s is not bf16, f16 or f32",
                          ap_dtype_str(p->dtype));
            return AP_ERR_UNSUPPORTED;
    }
}
