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

// n / d for 0 <= n < 2^31 and 1 <= d <= 2^31 without a division: with l = ceil(log2 d) and
// m = floor(2^32 (2^l - d) / d) + 1 (the host computes both once), n / d = (umulhi(m, n) + n) >> l
// (Granlund and Montgomery's round-up method; n < 2^31 keeps the sum within 32 bits).
// tests/cpu_ref/test_div_rcp.cu checks it against plain division.
struct ap_div_rcp {
    uint32_t mul;
    uint32_t shift;
};

static inline ap_div_rcp ap_div_rcp_make(uint32_t d) {
    uint32_t l = 0;
    while (l < 32 && (uint64_t{1} << l) < d) l++;
    const uint64_t m = ((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1;
    return {static_cast<uint32_t>(m), l};
}

__host__ __device__ __forceinline__ uint32_t ap_div_rcp_apply(uint32_t n, ap_div_rcp r) {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(r.mul, n);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(r.mul) * n) >> 32);
#endif
    return (hi + n) >> r.shift;
}

// float -> e4m3 byte: round to nearest even, saturating to +-448, NaN -> 0x7f. The host's
// ap_float_to_fp8_e4m3 (backends/numeric/host_numeric.h) gives the same bits.
__device__ __forceinline__ uint8_t ap_float_to_fp8_e4m3_dev(float x) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// Two floats rounded to T and packed into one register, the first in the low half (the order
// the A and B fragments expect).
template <typename T> __device__ __forceinline__ uint32_t ap_pack2(float lo, float hi);

template <> __device__ __forceinline__ uint32_t ap_pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

template <> __device__ __forceinline__ uint32_t ap_pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// 8 floats to 8 cache elements, stored with one 16-byte (16-bit types) or 8-byte (fp8) write.
template <typename KV> struct ap_store8 {
    __device__ __forceinline__ static void run(uint8_t *dst, const float *x, float) {
        uint32_t w[4]; // one cvt.rn.{bf16,f16}x2.f32 a pair: each value RNE as on its own
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = ap_pack2<KV>(x[2 * i], x[2 * i + 1]);
        *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    }
};
// fp8: saturate_e4m3(x / scale) with a true float32 division, the bits of the host's
// ap_float_to_fp8_e4m3(x / scale).
template <> struct ap_store8<ap_fp8_e4m3> {
    __device__ __forceinline__ static void run(uint8_t *dst, const float *x, float scale) {
        uint32_t pairs[4]; // cvt.rn.satfinite.e4m3x2.f32, as the one-value conversion issues it
#pragma unroll
        for (int i = 0; i < 4; i++)
            pairs[i] = __nv_cvt_float2_to_fp8x2(
                make_float2(__fdiv_rn(x[2 * i], scale), __fdiv_rn(x[2 * i + 1], scale)),
                __NV_SATFINITE, __NV_E4M3);
        *reinterpret_cast<uint2 *>(dst) =
            make_uint2(pairs[0] | pairs[1] << 16, pairs[2] | pairs[3] << 16);
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
