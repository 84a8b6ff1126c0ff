// nvfp4.cuh: NVFP4 on the device: fast E2M1 decode (Hopper has no conversion) and quantize.
#ifndef AP_COMMON_NVFP4_CUH
#define AP_COMMON_NVFP4_CUH

// The format and the quantizer are nvfp4_host.h's, compiled here as device code: one source, so
// a kernel's bytes equal cpu_ref's (tests/gpu/test_nvfp4.cu checks it on the GPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "backends/numeric/nvfp4_host.h"

// prmt.b32: byte n of the result is byte ((sel >> 4n) & 7) of the 8 bytes hi:lo, for selector
// nibbles without bit 3 (prmt's sign-replicate mode), which the selectors here never set. Inline
// PTX, not __byte_perm: __byte_perm masks its selector with 0x7777 first, one more instruction
// per use. On the host (tests) the same by hand.
__host__ __device__ __forceinline__ uint32_t ap_nvfp4_prmt(uint32_t lo, uint32_t hi, uint32_t sel) {
#if defined(__CUDA_ARCH__)
    uint32_t out;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(lo), "r"(hi), "r"(sel));
    return out;
#else
    uint64_t bytes = ((uint64_t)hi << 32) | lo;
    uint32_t out = 0;
    for (int n = 0; n < 4; n++)
        out |= (uint32_t)((bytes >> (8 * ((sel >> (4 * n)) & 7))) & 0xff) << (8 * n);
    return out;
#endif
}

// Eight E2M1 codes in one 32-bit word (value i in nibble i, the cache's order) to four registers
// of 16-bit pairs, exactly: out[k] holds value 2k in its low half and 2k + 1 in its high half.
//
// How: every E2M1 magnitude is a half whose low byte is 0, so its high byte comes from an 8-entry
// table held in two registers and indexed by prmt: one prmt decodes two values. For pair k,
//   sel = prmt(E, O, k | (4 + k) << 4): the even value's magnitude in selector nibble 1, the
//         odd one's in nibble 3 (E, O: the even and odd magnitudes, one per byte, shifted up 4);
//   mag = prmt(table_lo, table_hi, sel): high bytes of both halves, low bytes table[0] = 0;
//   sgn = prmt(w << 4, w, k << 4 | (4 + k) << 12): the two sign bits land on bits 15 and 31.
// 3 shared instructions and 4 per pair (3 prmt, 1 lop3): 19 for 8 values, no table in memory.
// (The loops over pairs have constant bounds and unroll; these functions also compile for the
// host, where prmt is emulated, so that the decode's logic is checkable without a GPU.)
// bf16's magnitudes need both bytes: a second pair of table registers and one more prmt (with
// the selector moved down one nibble) per pair: 31 for 8 values. (Counted in the PTX for sm_90a,
// and/or pairs counted as the one lop3 ptxas makes of them.)
#define AP_NVFP4_F16_HI_0 0x3e3c3800u // high bytes of the halves 0, 0.5, 1, 1.5
#define AP_NVFP4_F16_HI_1 0x46444240u // 2, 3, 4, 6
#define AP_NVFP4_BF16_HI_0 0x3f3f3f00u
#define AP_NVFP4_BF16_HI_1 0x40404040u
#define AP_NVFP4_BF16_LO_0 0xc0800000u
#define AP_NVFP4_BF16_LO_1 0xc0804000u

__host__ __device__ __forceinline__ void ap_nvfp4_selectors(uint32_t w, int k, uint32_t *sel,
                                                            uint32_t *sign) {
    uint32_t shifted = w << 4;
    uint32_t even = shifted & 0x70707070u, odd = w & 0x70707070u;
    *sel = ap_nvfp4_prmt(even, odd, (uint32_t)k | (uint32_t)(4 + k) << 4);
    *sign = ap_nvfp4_prmt(shifted, w, (uint32_t)k << 4 | (uint32_t)(4 + k) << 12) & 0x80008000u;
}

__host__ __device__ __forceinline__ void ap_nvfp4_e2m1x8_to_f16x2(uint32_t w, uint32_t out[4]) {
    for (int k = 0; k < 4; k++) {
        uint32_t sel, sign;
        ap_nvfp4_selectors(w, k, &sel, &sign);
        out[k] = ap_nvfp4_prmt(AP_NVFP4_F16_HI_0, AP_NVFP4_F16_HI_1, sel) | sign;
    }
}

__host__ __device__ __forceinline__ void ap_nvfp4_e2m1x8_to_bf16x2(uint32_t w, uint32_t out[4]) {
    for (int k = 0; k < 4; k++) {
        uint32_t sel, sign;
        ap_nvfp4_selectors(w, k, &sel, &sign);
        // sel's nibbles 1 and 3 move to 0 and 2; its nibble 4 (now 3) is a low nibble of E: 0
        out[k] = ap_nvfp4_prmt(AP_NVFP4_BF16_HI_0, AP_NVFP4_BF16_HI_1, sel) |
                 ap_nvfp4_prmt(AP_NVFP4_BF16_LO_0, AP_NVFP4_BF16_LO_1, sel >> 4) | sign;
    }
}

// The block scale as a pair of halves / bf16s (exact: every e4m3 value is both; 0x7f is NaN).
__device__ __forceinline__ __half2 ap_nvfp4_scale_half2(uint8_t scale) {
    __half h = __half(__nv_cvt_fp8_to_halfraw(scale, __NV_E4M3));
    return __halves2half2(h, h);
}

__device__ __forceinline__ __nv_bfloat162 ap_nvfp4_scale_bf162(uint8_t scale) {
    __nv_bfloat16 b = __float2bfloat16_rn(ap_fp8_e4m3_to_float(scale));
    return __halves2bfloat162(b, b);
}

// Eight values of one block times its scale, without the global scale: e2m1 * e4m3 has at most
// 6 significant bits within 2^-10 .. 2688, so each product is exact in half and in bf16. The
// global scale g is left to the caller, in float (fold it into the logit or output scale).
__device__ __forceinline__ void ap_nvfp4_dequant8_half2(uint32_t w, __half2 scale, __half2 out[4]) {
    uint32_t codes[4];
    ap_nvfp4_e2m1x8_to_f16x2(w, codes);
#pragma unroll
    for (int k = 0; k < 4; k++) out[k] = __hmul2(*reinterpret_cast<__half2 *>(&codes[k]), scale);
}

__device__ __forceinline__ void ap_nvfp4_dequant8_bf162(uint32_t w, __nv_bfloat162 scale,
                                                        __nv_bfloat162 out[4]) {
    uint32_t codes[4];
    ap_nvfp4_e2m1x8_to_bf16x2(w, codes);
#pragma unroll
    for (int k = 0; k < 4; k++)
        out[k] = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&codes[k]), scale);
}

// Eight values as floats, global scale applied: (e2m1 * e4m3) * g with one rounding, the bits
// of the host's ap_nvfp4_dequantize.
__device__ __forceinline__ void ap_nvfp4_dequant8_float(uint32_t w, uint8_t scale, float g,
                                                        float out[8]) {
    uint32_t codes[4];
    ap_nvfp4_e2m1x8_to_f16x2(w, codes);
    float block_scale = ap_fp8_e4m3_to_float(scale);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 pair = __half22float2(*reinterpret_cast<__half2 *>(&codes[k]));
        out[2 * k] = __fmul_rn(__fmul_rn(pair.x, block_scale), g);
        out[2 * k + 1] = __fmul_rn(__fmul_rn(pair.y, block_scale), g);
    }
}

// Quantize one block of 16 floats (nvfp4_host.h's recipe, the same code) into two words of
// codes, value 0 in the lowest nibble of words[0]; returns the scale byte.
__device__ __forceinline__ uint8_t ap_nvfp4_quantize16(const float x[16], float g,
                                                       uint32_t words[2]) {
    uint8_t packed[8];
    uint8_t scale = ap_nvfp4_quantize_block(x, g, packed);
    words[0] = (uint32_t)packed[0] | (uint32_t)packed[1] << 8 | (uint32_t)packed[2] << 16 |
               (uint32_t)packed[3] << 24;
    words[1] = (uint32_t)packed[4] | (uint32_t)packed[5] << 8 | (uint32_t)packed[6] << 16 |
               (uint32_t)packed[7] << 24;
    return scale;
}

// ap_float_to_e2m1's codes with no chain of compares, for y not NaN (a NaN gets some code, as
// fminf(NaN, 6) is 6): on each stretch of equal spacing the code is an offset plus y's magnitude
// rounded to an integer after an exact scaling, |y| in [0, 2): rint(2|y|) (codes 0..4), [2, 4):
// 2 + rint(|y|) (4..6), [4, 6]: 4 + rint(|y| / 2) (6, 7), past 6 saturated to 6 first. rint is
// one add of 2^23 (round to nearest even: the scaled product is exact, so the add rounds once, as
// the compares' ties do: every offset is even, so ties to an even integer are ties to the even
// code). The sign bit is y's. No branch: callers that zero a block holding a NaN anyway call it
// per value (ap_nvfp4_codes8).
__host__ __device__ __forceinline__ uint32_t ap_e2m1_code_not_nan(float y) {
    const float a = fminf(fabsf(y), 6.0f);
    const float m = a < 2.0f ? 2.0f : (a < 4.0f ? 1.0f : 0.5f);
    const uint32_t off = a < 2.0f ? 0u : (a < 4.0f ? 2u : 4u);
#if defined(__CUDA_ARCH__)
    const float r = __fadd_rn(__fmul_rn(a, m), 8388608.0f);
#else
    const float r = a * m + 8388608.0f;
#endif
    return (ap_float_bits(r) - 0x4b000000u + off) | ((ap_float_bits(y) >> 28) & 8u);
}

// The same with NaN giving 0 (ap_float_to_e2m1's rule; tests/cpu_ref/test_nvfp4_decode.cu).
__host__ __device__ __forceinline__ uint32_t ap_e2m1_code_fast(float y) {
    return y != y ? 0u : ap_e2m1_code_not_nan(y);
}

// ap_nvfp4_block_codes on 8 values (n = 8) as one word, value i in nibble i, by
// ap_e2m1_code_not_nan (tests/cpu_ref/test_nvfp4_decode.cu checks both against the host
// functions). has_nan must be set when a value is NaN (the word is then 0, as the host's): y is
// NaN only for a NaN x, since inv is 0 only for a block whose largest magnitude is finite.
__host__ __device__ __forceinline__ uint32_t ap_nvfp4_codes8(const float x[8], float inv,
                                                             int has_nan) {
    uint32_t w = 0;
    for (int i = 0; i < 8; i++) {
#if defined(__CUDA_ARCH__)
        const float y = __fmul_rn(x[i], inv);
#else
        const float y = x[i] * inv;
#endif
        w |= ap_e2m1_code_not_nan(y) << (4 * i);
    }
    return has_nan ? 0u : w;
}

// ap_nvfp4_block_amax on 8 values, without a branch: max.NaN carries a NaN through, which sets
// has_nan (the block then takes the NaN scale, its amax unused); otherwise the same amax.
__device__ __forceinline__ float ap_nvfp4_amax8(const float x[8], int *has_nan) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float a = fabsf(x[i]);
        asm("max.NaN.f32 %0, %0, %1;" : "+f"(m) : "f"(a));
    }
    *has_nan = m != m;
    return m;
}

// A shorter decode for kernels that multiply by the block scale anyway (decode on fragment
// load): the halves it yields are value * 2^-14, the caller folds 2^14 into its float scale.
// A code's three magnitude bits placed at a half's bits 9..11 (the two low exponent bits and the
// top mantissa bit) read as value * 2^-14 (E2M1's exponent bias is 1, a half's 15; code 1, 0.5,
// lands on the subnormal 2^-15, code 0 on 0), its sign at bit 15. No table: the high bytes of
// all eight halves in two registers, 7 instructions,
//   odd  = sign bits of the high nibbles | their magnitudes >> 3   (byte b: value 2b + 1)
//   even = the same of w << 4                                     (byte b: value 2b)
// then one prmt per pair of halves (ap_nvfp4_pair14) takes two high bytes and zero low bytes:
// 11 instructions for 8 values (the exact decode above: 19, and 4 table loads when registers
// run short). Times an e4m3 scale each half stays exact (<= 6 significant bits, multiples of
// 2^-24: subnormal halves included, which the tensor cores read as they are).
struct ap_nvfp4_hi {
    uint32_t even, odd;
};

__host__ __device__ __forceinline__ ap_nvfp4_hi ap_nvfp4_hi_bytes(uint32_t w) {
    const uint32_t s = w << 4;
    return {(s & 0x80808080u) | ((s & 0x70707070u) >> 3),
            (w & 0x80808080u) | ((w & 0x70707070u) >> 3)};
}

// Halves (low, high) of value * 2^-14 from high bytes a and b (0..3) of one ap_nvfp4_hi word.
__host__ __device__ __forceinline__ uint32_t ap_nvfp4_pair14(uint32_t hi, int a, int b) {
    return ap_nvfp4_prmt(hi, 0u, 4u | (uint32_t)a << 4 | 4u << 8 | (uint32_t)b << 12);
}

#define AP_NVFP4_UNBIAS14 16384.f // what ap_nvfp4_pair14's halves are multiplied by

#endif // AP_COMMON_NVFP4_CUH
