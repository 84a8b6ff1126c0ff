// dtype.cuh: element types of activations and KV caches on the device: traits and conversions.
#ifndef AP_COMMON_DTYPE_CUH
#define AP_COMMON_DTYPE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

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

// float -> e4m3 byte: round to nearest even, saturating to +-448, NaN -> 0x7f. The host's
// ap_float_to_fp8_e4m3 (backends/numeric/host_numeric.h) gives the same bits.
__device__ __forceinline__ uint8_t ap_float_to_fp8_e4m3_dev(float x) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

#endif // AP_COMMON_DTYPE_CUH
