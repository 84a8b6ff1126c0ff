// pack.cu: pack_prefix_chunk_kv/1: K = [k_nope | k_pe broadcast over heads] and V, quantized per
// tensor to fp8 e4m3 in one pass.
//   k_out[t][h][d] = sat_e4m3(k_nope[t][h][d] / k_scale)          d < nope
//                  = sat_e4m3(k_pe[t][d - nope] / k_scale)          nope <= d < nope + rope
//   v_out[t][h][d] = sat_e4m3(v[t][h][d] / v_scale)
// with a float32 division rounded once (the bits of cpu_ref's pack.c; the vector path divides by
// numeric/e4m3_div.h's multiply and correction: the same e4m3 bytes). A thread makes 16 output
// bytes (one 16-byte store) from two 16-byte loads; few tokens take a 2-D grid (token x units of
// the token), many a flat 1-D grid. The kernel waits on its predecessor with griddepcontrol, so
// under programmatic dependent launch its launch overlaps the previous kernel's tail.
#include <cuda_runtime.h>

#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/pdl.cuh"
#include "../numeric/e4m3_div.h"
#include "mla.h"

#define MLA_WHO "trtllm_mla pack_prefix_chunk_kv"

namespace {

constexpr int kThreads = 256;
constexpr int kTwoDMaxTokens = 64; // up to this many tokens the grid is tokens x units

template <typename T> __device__ __forceinline__ float in_at(const T *base, int64_t i);
template <>
__device__ __forceinline__ float in_at<__nv_bfloat16>(const __nv_bfloat16 *b, int64_t i) {
    return __bfloat162float(b[i]);
}
template <> __device__ __forceinline__ float in_at<__half>(const __half *b, int64_t i) {
    return __half2float(b[i]);
}
template <> __device__ __forceinline__ float in_at<float>(const float *b, int64_t i) {
    return b[i];
}

// The scale of a unit and its reciprocal for ap_e4m3_div (mla_pack_run computes them once).
struct div_by {
    float scale, rcp;
};

// sat_e4m3(a / scale) .. sat_e4m3(d / scale) packed low byte first. One cvt makes two bytes
// (cvt.rn.satfinite.e4m3x2.f32: the same rounding and saturation as the single conversion).
__device__ __forceinline__ uint32_t quant4(float a, float b, float c, float d, div_by s) {
    const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(
        make_float2(ap_e4m3_div(a, s.scale, s.rcp), ap_e4m3_div(b, s.scale, s.rcp)), __NV_SATFINITE,
        __NV_E4M3);
    const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(
        make_float2(ap_e4m3_div(c, s.scale, s.rcp), ap_e4m3_div(d, s.scale, s.rcp)), __NV_SATFINITE,
        __NV_E4M3);
    return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// 16 contiguous 16-bit inputs (two 16-byte words) -> 16 fp8 bytes.
template <typename T>
__device__ __forceinline__ uint4 quant16_words(const uint4 lo, const uint4 hi, div_by scale) {
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 a = ap_unpack2<T>(w[2 * i]), b = ap_unpack2<T>(w[2 * i + 1]);
        out[i] = quant4(a.x, a.y, b.x, b.y, scale);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

template <typename T> __device__ __forceinline__ uint4 quant16(const T *src, div_by scale) {
    return quant16_words<T>(*reinterpret_cast<const uint4 *>(src),
                            *reinterpret_cast<const uint4 *>(src + 8), scale);
}

// Unit u (16 output bytes) of row (t, h): K units first, then V units. The source of its 16
// inputs, the destination of its 16 bytes and the scale.
template <typename T> struct unit_ref {
    const T *src;
    uint8_t *dst;
    div_by scale;
};

template <typename T>
__device__ __forceinline__ unit_ref<T> unit_at(const mla_pack_params &p, int64_t t, int h, int u) {
    const int k_units = (p.nope_dim + p.rope_dim) >> 4;
    const int64_t th = t * p.heads + h;
    if (u < k_units) {
        const int d = u << 4;
        const T *src =
            d < p.nope_dim
                ? static_cast<const T *>(p.k_nope) + t * p.kn_stride_t + h * p.kn_stride_h + d
                : static_cast<const T *>(p.k_pe) + t * p.pe_stride_t + (d - p.nope_dim);
        return {src,
                static_cast<uint8_t *>(p.k_out) + th * (p.nope_dim + p.rope_dim) + d,
                {p.k_scale, p.k_rcp}};
    }
    const int d = (u - k_units) << 4;
    return {static_cast<const T *>(p.v) + t * p.v_stride_t + h * p.v_stride_h + d,
            static_cast<uint8_t *>(p.v_out) + th * p.v_dim + d,
            {p.v_scale, p.v_rcp}};
}

template <typename T>
__device__ __forceinline__ void pack_unit(const mla_pack_params &p, int64_t t, int h, int u) {
    const unit_ref<T> r = unit_at<T>(p, t, h, u);
    *reinterpret_cast<uint4 *>(r.dst) = quant16(r.src, r.scale);
}

// Many tokens: each thread takes kFlatUnits units kThreads apart (a warp's units stay
// contiguous), issues all their 16-byte loads (streaming, ld.cs) before it converts and stores
// any: kFlatUnits * 32 bytes in flight per thread. IDX: uint32_t when tokens * heads * units +
// kFlatUnits * kThreads < 2^32 (the usual case: no 64-bit division).
constexpr int kFlatUnits = 4;

template <typename T, typename IDX>
__global__ void __launch_bounds__(kThreads) pack_flat(const mla_pack_params p) {
    ap_pdl_wait();
    ap_pdl_launch_dependents();
    const IDX units = static_cast<IDX>((p.nope_dim + p.rope_dim + p.v_dim) >> 4);
    const IDX per_token = units * static_cast<IDX>(p.heads);
    const IDX total = per_token * static_cast<IDX>(p.tokens);
    const IDX first = static_cast<IDX>(blockIdx.x) * (kThreads * kFlatUnits) + threadIdx.x;
    uint4 lo[kFlatUnits], hi[kFlatUnits];
    uint8_t *dst[kFlatUnits];
    div_by scale[kFlatUnits];
#pragma unroll
    for (int j = 0; j < kFlatUnits; j++) {
        const IDX i = first + static_cast<IDX>(j) * kThreads;
        dst[j] = nullptr;
        if (i >= total) continue;
        const IDX t = i / per_token;
        const IDX rest = i - t * per_token;
        const IDX h = rest / units;
        const unit_ref<T> r = unit_at<T>(p, static_cast<int64_t>(t), static_cast<int>(h),
                                         static_cast<int>(rest - h * units));
        lo[j] = __ldcs(reinterpret_cast<const uint4 *>(r.src));
        hi[j] = __ldcs(reinterpret_cast<const uint4 *>(r.src + 8));
        dst[j] = r.dst;
        scale[j] = r.scale;
    }
#pragma unroll
    for (int j = 0; j < kFlatUnits; j++)
        if (dst[j] != nullptr)
            __stcs(reinterpret_cast<uint4 *>(dst[j]), quant16_words<T>(lo[j], hi[j], scale[j]));
}

template <typename T> __global__ void __launch_bounds__(kThreads) pack_2d(const mla_pack_params p) {
    ap_pdl_wait();
    ap_pdl_launch_dependents();
    const int units = ((p.nope_dim + p.rope_dim + p.v_dim) >> 4);
    const int rest = blockIdx.x * kThreads + threadIdx.x;
    if (rest >= units * p.heads) return;
    pack_unit<T>(p, blockIdx.y, rest / units, rest % units);
}

// Any strides, any dims: one output element per thread (the fallback when the 16-byte path's
// alignment does not hold).
template <typename T>
__global__ void __launch_bounds__(kThreads) pack_any(const mla_pack_params p) {
    ap_pdl_wait();
    ap_pdl_launch_dependents();
    const int width = p.nope_dim + p.rope_dim + p.v_dim;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    const int64_t th = i / width;
    if (th >= p.tokens * p.heads) return;
    const int d = static_cast<int>(i - th * width);
    const int64_t t = th / p.heads;
    const int h = static_cast<int>(th - t * p.heads);
    const int kw = p.nope_dim + p.rope_dim;
    const T *kn = static_cast<const T *>(p.k_nope);
    const T *pe = static_cast<const T *>(p.k_pe);
    const T *v = static_cast<const T *>(p.v);
    if (d < p.nope_dim) {
        const float x = in_at(kn, t * p.kn_stride_t + h * p.kn_stride_h + d * p.kn_stride_d);
        static_cast<uint8_t *>(p.k_out)[th * kw + d] =
            ap_float_to_fp8_e4m3_dev(__fdiv_rn(x, p.k_scale));
    } else if (d < kw) {
        const float x = in_at(pe, t * p.pe_stride_t + (d - p.nope_dim) * p.pe_stride_d);
        static_cast<uint8_t *>(p.k_out)[th * kw + d] =
            ap_float_to_fp8_e4m3_dev(__fdiv_rn(x, p.k_scale));
    } else {
        const float x = in_at(v, t * p.v_stride_t + h * p.v_stride_h + (d - kw) * p.v_stride_d);
        static_cast<uint8_t *>(p.v_out)[th * p.v_dim + (d - kw)] =
            ap_float_to_fp8_e4m3_dev(__fdiv_rn(x, p.v_scale));
    }
}

// The 16-byte path holds when every dim is a multiple of 16, rows are dense, every row start is
// 16-byte aligned (bases and the token/head strides) and both scales have a reciprocal for
// ap_e4m3_div. f32 takes the fallback.
bool vector_ok(const mla_pack_params &p) {
    if (p.in_dtype == AP_DTYPE_F32 || p.k_rcp == 0.0f || p.v_rcp == 0.0f) return false;
    if (p.nope_dim % 16 || p.rope_dim % 16 || p.v_dim % 16) return false;
    if (p.kn_stride_d != 1 || p.pe_stride_d != 1 || p.v_stride_d != 1) return false;
    const int64_t strides[] = {p.kn_stride_t, p.kn_stride_h, p.pe_stride_t, p.v_stride_t,
                               p.v_stride_h};
    for (int64_t s : strides)
        if (s % 8 != 0) return false;
    return (reinterpret_cast<uintptr_t>(p.k_nope) | reinterpret_cast<uintptr_t>(p.k_pe) |
            reinterpret_cast<uintptr_t>(p.v) | reinterpret_cast<uintptr_t>(p.k_out) |
            reinterpret_cast<uintptr_t>(p.v_out)) %
               16 ==
           0;
}

template <typename T>
ap_status launch(const mla_pack_params &p, cudaStream_t stream, ap_msgbuf *msg) {
    const bool pdl = p.use_pdl != 0;
    cudaError_t err;
    if (sizeof(T) != 2 || !vector_ok(p)) {
        const int64_t n = p.tokens * p.heads * (p.nope_dim + p.rope_dim + p.v_dim);
        err = ap_launch(pack_any<T>, dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads)),
                        dim3(kThreads), 0, stream, pdl, p);
    } else if constexpr (sizeof(T) != 2) {
        err = cudaErrorInvalidValue; // not reached: 32-bit inputs take the path above
    } else if (p.tokens <= kTwoDMaxTokens) {
        const int64_t per_token =
            static_cast<int64_t>((p.nope_dim + p.rope_dim + p.v_dim) >> 4) * p.heads;
        dim3 grid(static_cast<unsigned>((per_token + kThreads - 1) / kThreads),
                  static_cast<unsigned>(p.tokens));
        err = ap_launch(pack_2d<T>, grid, dim3(kThreads), 0, stream, pdl, p);
    } else {
        const int64_t n = p.tokens * p.heads * ((p.nope_dim + p.rope_dim + p.v_dim) >> 4);
        constexpr int64_t per_cta = int64_t{kThreads} * kFlatUnits;
        const dim3 grid(static_cast<unsigned>((n + per_cta - 1) / per_cta));
        err = n + per_cta < (int64_t{1} << 32)
                  ? ap_launch(pack_flat<T, uint32_t>, grid, dim3(kThreads), 0, stream, pdl, p)
                  : ap_launch(pack_flat<T, uint64_t>, grid, dim3(kThreads), 0, stream, pdl, p);
    }
    ap_status st = ap_cuda_status(err, MLA_WHO, "cudaLaunchKernelEx", msg);
    return st != AP_OK ? st : ap_cuda_launch_status(MLA_WHO, "pack kernel", msg);
}

} // namespace

extern "C" ap_status mla_pack_run(const mla_pack_params *params, void *stream_ptr, ap_msgbuf *msg) {
    if (params->tokens == 0 || params->heads == 0) return AP_OK;
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    mla_pack_params p = *params;
    p.k_rcp = ap_e4m3_div_rcp(p.k_scale);
    p.v_rcp = ap_e4m3_div_rcp(p.v_scale);
    switch (p.in_dtype) {
        case AP_DTYPE_BF16: return launch<__nv_bfloat16>(p, stream, msg);
        case AP_DTYPE_F16: return launch<__half>(p, stream, msg);
        case AP_DTYPE_F32: return launch<float>(p, stream, msg);
        default:
            ap_msgbuf_add(msg, MLA_WHO ": input dtype %s is not bf16, f16 or f32",
                          ap_dtype_str(p.in_dtype));
            return AP_ERR_UNSUPPORTED;
    }
}
