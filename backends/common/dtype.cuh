// dtype.cuh: element types of activations and KV caches on the device: traits and conversions.
#ifndef AP_COMMON_DTYPE_CUH
#define AP_COMMON_DTYPE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "../numeric/e4m3_div.h"

// The fp8 e4m3 cache element: a plain byte, value = decoded byte * the layer's scale.
struct ap_fp8_e4m3 {
    uint8_t bits;
};

// Bytes of one element, for the three cache types the kernels read.
template <typename T> struct ap_elem_bytes { static constexpr int value = sizeof(T); };

__device__ __forceinline__ float ap_to_float(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
__device__ __forceinline__ float ap_to_float(__half x) {
    return __half2float(x);
}

template <typename T> __device__ __forceinline__ T ap_from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 ap_from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half ap_from_float<__half>(float x) {
    return __float2half_rn(x);
}

// Two 16-bit values packed in one register, low half first, as floats.
template <typename T> __device__ __forceinline__ float2 ap_unpack2(uint32_t packed);
template <> __device__ __forceinline__ float2 ap_unpack2<__nv_bfloat16>(uint32_t packed) {
    return make_float2(__uint_as_float(packed << 16), __uint_as_float(packed & 0xffff0000u));
}
template <> __device__ __forceinline__ float2 ap_unpack2<__half>(uint32_t packed) {
    __half2 h = *reinterpret_cast<__half2 *>(&packed);
    return __half22float2(h);
}

// Two e4m3 bytes (the low byte first) to two halves in one register: exact, since every e4m3
// value is a half. One cvt instruction on sm_89 and later.
__device__ __forceinline__ uint32_t ap_fp8x2_to_half2_bits(uint16_t two_bytes) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two_bytes, __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// An ldmatrix .trans register of e4m3 bytes (b16 pairs: bytes x0 x1 of row k, then x0 x1 of row
// k + 1) as two half2 B fragments: even = (x0 of k, x0 of k + 1), odd = (x1 of k, x1 of k + 1).
__device__ __forceinline__ void ap_fp8x4_trans_split(uint32_t r, uint32_t &even, uint32_t &odd) {
    const uint32_t e = __byte_perm(r, 0u, 0x3120);
    even = ap_fp8x2_to_half2_bits((uint16_t)e);
    odd = ap_fp8x2_to_half2_bits((uint16_t)(e >> 16));
}

// Four e4m3 bytes (b0 b1 b2 b3) as two half2: lo = (b0, b1), hi = (b2, b3). On sm_89 and later
// two cvt and nothing else: the high pair is read as the register's upper half (SASS `R.H1`),
// where ap_fp8x2_to_half2_bits((uint16_t)(w >> 16)) costs a shift first. Exact, as above.
__device__ __forceinline__ void ap_fp8x4_to_half2x2(uint32_t w, uint32_t &lo, uint32_t &hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
        "cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
#else
    lo = ap_fp8x2_to_half2_bits((uint16_t)w);
    hi = ap_fp8x2_to_half2_bits((uint16_t)(w >> 16));
#endif
}

// float -> e4m3 byte: round to nearest even, saturating to +-448, NaN -> 0x7f. The host's
// ap_float_to_fp8_e4m3 (backends/numeric/host_numeric.h) gives the same bits.
__device__ __forceinline__ uint8_t ap_float_to_fp8_e4m3_dev(float x) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// 8 floats to 8 cache elements, stored with one 16-byte (16-bit types) or 8-byte (fp8) write,
// streaming (st.global.cs: the appends' rows are not read back by the kernel that writes them).
template <typename KV> struct ap_store8 {
    __device__ __forceinline__ static void run(uint8_t *dst, const float *x, float, float = 0.0f) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const KV lo = ap_from_float<KV>(x[2 * i]), hi = ap_from_float<KV>(x[2 * i + 1]);
            w[i] = static_cast<uint32_t>(*reinterpret_cast<const uint16_t *>(&lo)) |
                   (static_cast<uint32_t>(*reinterpret_cast<const uint16_t *>(&hi)) << 16);
        }
        __stcs(reinterpret_cast<uint4 *>(dst), make_uint4(w[0], w[1], w[2], w[3]));
    }
};
// fp8: saturate_e4m3(x / scale), the bits of the host's ap_float_to_fp8_e4m3(x / scale) with a
// true float32 division: numeric/e4m3_div.h's multiply and correction where the caller passes
// rcp = ap_e4m3_div_rcp(scale) (computed once, on the host), else (rcp 0) __fdiv_rn.
template <> struct ap_store8<ap_fp8_e4m3> {
    __device__ __forceinline__ static void run(uint8_t *dst, const float *x, float scale,
                                               float rcp = 0.0f) {
        float q[8];
        if (rcp != 0.0f) {
#pragma unroll
            for (int i = 0; i < 8; i++) q[i] = ap_e4m3_div(x[i], scale, rcp);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) q[i] = __fdiv_rn(x[i], scale);
        }
        uint32_t w[2] = {0u, 0u};
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i >> 2] |= static_cast<uint32_t>(ap_float_to_fp8_e4m3_dev(q[i])) << (8 * (i & 3));
        __stcs(reinterpret_cast<uint2 *>(dst), make_uint2(w[0], w[1]));
    }
};

// 8 16-bit values of one 16-byte load, as floats.
template <typename IN> __device__ __forceinline__ void ap_unpack8(const uint4 &raw, float *x) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = ap_unpack2<IN>(words[i]);
        x[2 * i] = f.x;
        x[2 * i + 1] = f.y;
    }
}

#endif // AP_COMMON_DTYPE_CUH
