// nvfp4_stage.cu: the pages a batch reads, dequantized from nvfp4 (or fp8_e4m3) into a compact
// 16-bit cache.
#include <cuda_runtime.h>

#include "cuda_status.cuh"
#include "dtype.cuh"
#include "kit.h"
#include "nvfp4.cuh"

namespace {

constexpr int kThreads = 256;

struct stage_args {
    const uint8_t *pages[2];
    const uint8_t *scales[2];
    float multiplier[2];
    uint8_t *out[2];
    const int32_t *page_indices;
    int32_t *staged_indices;
    int64_t blocks_per_page; // page_size * heads * head_dim / 16
    int64_t num_blocks;      // num_pages * blocks_per_page
};

// Two floats as two 16-bit values in one word, the first in the low half (round to nearest even).
template <typename OUT> __device__ __forceinline__ uint32_t stage_pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t stage_pack2<__nv_bfloat16>(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}
template <> __device__ __forceinline__ uint32_t stage_pack2<__half>(float lo, float hi) {
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) |
           (uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16;
}

// The thread's unit idx (< a.num_blocks) of staged page j: its unit in the cache (page
// page_indices[j]); the first unit of a page writes the staged page's index j (once, for K).
__device__ __forceinline__ int64_t stage_source(const stage_args &a, int64_t idx, int which) {
    const int64_t j = idx / a.blocks_per_page;
    const int64_t b = idx - j * a.blocks_per_page;
    if (b == 0 && which == 0 && a.staged_indices != NULL) a.staged_indices[j] = (int32_t)j;
    return (int64_t)__ldg(a.page_indices + j) * a.blocks_per_page + b;
}

// The 16 staged elements of unit idx (32 bytes) to K's or V's staged copy.
__device__ __forceinline__ void stage_store(const stage_args &a, int64_t idx, int which,
                                            const uint32_t (&packed)[8]) {
    uint4 *dst = reinterpret_cast<uint4 *>((which ? a.out[1] : a.out[0])) + 2 * idx;
    dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

// (Parameters picked by ternaries: an index by blockIdx.y would copy them to local memory.)
// One thread per block of 16 values (blockIdx.y: K or V). Staged page j, block b is cache page
// page_indices[j], block b: 8 bytes of codes and a scale byte in, 16 elements (32 bytes) out:
//   out = 16-bit((e2m1 * e4m3) * multiplier)
// the product exact in float32 (the bits of nvfp4_host.h's ap_nvfp4_dequantize with g =
// multiplier), one rounding to 16 bits.
template <typename OUT>
__global__ void __launch_bounds__(kThreads) ap_nvfp4_stage_kernel(const stage_args a) {
    const int which = blockIdx.y;
    const int64_t idx = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (idx >= a.num_blocks) return;
    const int64_t src = stage_source(a, idx, which);
    const uint2 codes =
        __ldg(reinterpret_cast<const uint2 *>((which ? a.pages[1] : a.pages[0])) + src);
    const uint8_t scale = __ldg((which ? a.scales[1] : a.scales[0]) + src);
    const uint32_t words[2] = {codes.x, codes.y};
    const float block_scale = __half2float(__half(__nv_cvt_fp8_to_halfraw(scale, __NV_E4M3)));
    const float mult = (which ? a.multiplier[1] : a.multiplier[0]);
    uint32_t packed[8];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t pairs[4];
        ap_nvfp4_e2m1x8_to_f16x2(words[h], pairs); // exact halves of the codes' magnitudes
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float lo = __half2float(__ushort_as_half((unsigned short)(pairs[i] & 0xffffu)));
            const float hi = __half2float(__ushort_as_half((unsigned short)(pairs[i] >> 16)));
            packed[4 * h + i] = stage_pack2<OUT>(__fmul_rn(__fmul_rn(lo, block_scale), mult),
                                                 __fmul_rn(__fmul_rn(hi, block_scale), mult));
        }
    }
    stage_store(a, idx, which, packed);
}

// fp8_e4m3 pages: one thread per 16 bytes (16 values; blockIdx.y: K or V) of staged page j, cache
// page page_indices[j]: out = 16-bit(e4m3 * multiplier), the e4m3 value exact in half and float,
// one rounding to 16 bits (none with multiplier 1). blocks_per_page counts 16-value units here.
template <typename OUT>
__global__ void __launch_bounds__(kThreads) ap_fp8_stage_kernel(const stage_args a) {
    const int which = blockIdx.y;
    const int64_t idx = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (idx >= a.num_blocks) return;
    const int64_t src = stage_source(a, idx, which);
    const uint4 in =
        __ldg(reinterpret_cast<const uint4 *>((which ? a.pages[1] : a.pages[0])) + src);
    const uint32_t words[4] = {in.x, in.y, in.z, in.w};
    const float mult = (which ? a.multiplier[1] : a.multiplier[0]);
    uint32_t packed[8];
#pragma unroll
    for (int w = 0; w < 4; w++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const __half2 two = __half2(__nv_cvt_fp8x2_to_halfraw2(
                static_cast<__nv_fp8x2_storage_t>((words[w] >> (16 * h)) & 0xffffu), __NV_E4M3));
            const float2 f = __half22float2(two);
            packed[2 * w + h] = stage_pack2<OUT>(__fmul_rn(f.x, mult), __fmul_rn(f.y, mult));
        }
    }
    stage_store(a, idx, which, packed);
}

} // namespace

extern "C" ap_status ap_kit_nvfp4_stage_run(const ap_kit_nvfp4_stage_args *p, void *stream,
                                            const char *who, ap_msgbuf *msg) {
    if ((p->out_dtype != AP_DTYPE_BF16 && p->out_dtype != AP_DTYPE_F16) ||
        p->head_dim % AP_NVFP4_BLOCK != 0 || p->head_dim <= 0 || p->page_size <= 0 ||
        p->num_kv_heads <= 0 || p->num_pages < 0) {
        ap_msgbuf_add(msg, "%s: staging: no kernel into %s for head_dim %d", who,
                      ap_dtype_str(p->out_dtype), p->head_dim);
        return AP_ERR_UNSUPPORTED;
    }
    stage_args a;
    for (int i = 0; i < 2; i++) {
        a.pages[i] = static_cast<const uint8_t *>(p->pages[i]);
        a.scales[i] = static_cast<const uint8_t *>(p->block_scales[i]);
        a.multiplier[i] = p->multiplier[i];
        a.out[i] = static_cast<uint8_t *>(p->out[i]);
    }
    a.page_indices = p->page_indices;
    a.staged_indices = p->staged_indices;
    const bool fp8 = p->in_dtype == AP_DTYPE_FP8_E4M3; // 16 values a unit, as nvfp4's blocks
    a.blocks_per_page = (int64_t)p->page_size * p->num_kv_heads * (p->head_dim / AP_NVFP4_BLOCK);
    a.num_blocks = (int64_t)p->num_pages * a.blocks_per_page;
    if (a.num_blocks == 0) return AP_OK;
    const int64_t ctas = (a.num_blocks + kThreads - 1) / kThreads;
    if (ctas > 0x7fffffff) {
        ap_msgbuf_add(msg, "%s: staging: %d pages are more than one launch covers", who,
                      p->num_pages);
        return AP_ERR_UNSUPPORTED;
    }
    const dim3 grid((unsigned)ctas, 2);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (fp8 && p->out_dtype == AP_DTYPE_BF16)
        ap_fp8_stage_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(a);
    else if (fp8)
        ap_fp8_stage_kernel<__half><<<grid, kThreads, 0, s>>>(a);
    else if (p->out_dtype == AP_DTYPE_BF16)
        ap_nvfp4_stage_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(a);
    else
        ap_nvfp4_stage_kernel<__half><<<grid, kThreads, 0, s>>>(a);
    return ap_cuda_launch_status(who, fp8 ? "ap_fp8_stage_kernel" : "ap_nvfp4_stage_kernel", msg);
}
