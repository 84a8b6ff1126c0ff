/* host_numeric.h: bit-exact host conversions between float and bf16, fp16, fp8 e4m3fn and e5m2. */
#ifndef AP_HOST_NUMERIC_H
#define AP_HOST_NUMERIC_H

/* Header-only, usable from C11, C++ and CUDA host code. Every float -> narrow conversion rounds
 * to nearest, ties to even, from the exact float value (one rounding), and gives the same bits
 * as CUDA's conversions:
 *   ap_float_to_bf16     = __float2bfloat16 (cvt.rn.bf16.f32):   NaN -> 0x7fff, overflow -> inf
 *   ap_float_to_f16      = __float2half     (cvt.rn.f16.f32):    NaN -> 0x7fff, overflow -> inf
 *   ap_float_to_fp8_e4m3 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3):
 *                          |x| past the largest finite (448) and +-inf -> +-448 (0x7e/0xfe),
 *                          NaN -> 0x7f
 *   ap_float_to_fp8_e5m2 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2):
 *                          |x| past 57344 and +-inf -> +-57344 (0x7b/0xfb), NaN -> 0x7f
 * Underflow keeps the sign (-tiny -> negative zero), as CUDA does. The narrow -> float
 * conversions are exact (every narrow value is a float); NaN payloads of bf16/fp16 are kept. */

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Under nvcc the functions are also device functions: tests can compare them with the
 * intrinsics on the GPU itself. */
#if defined(__CUDACC__)
#define AP_HOST_NUMERIC_FN static inline __host__ __device__
#else
#define AP_HOST_NUMERIC_FN static inline
#endif

AP_HOST_NUMERIC_FN uint32_t ap_float_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

AP_HOST_NUMERIC_FN float ap_bits_float(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* Round the finite, non-negative float with bits `abs_bits` to a binary format with `mant_bits`
 * stored mantissa bits and exponent bias `bias` (subnormals included), ties to even. Returns the
 * magnitude code, unbounded above: a code past the format's largest finite one means overflow,
 * which the caller turns into inf or saturation.
 * Why this works: the code of a value is (biased exponent << mant_bits) + mantissa, and for a
 * normal value that equals ((e + bias - 1) << mant_bits) + (significand >> shift) with the
 * implicit bit inside the significand; a round-up carry walks into the exponent on its own. For a
 * target subnormal the exponent field is 0 and the significand shifts further right. */
AP_HOST_NUMERIC_FN uint32_t ap_narrow_round_magnitude(uint32_t abs_bits, int mant_bits, int bias) {
    int float_exp = (int)(abs_bits >> 23);
    uint32_t significand = abs_bits & 0x7fffffu;
    if (float_exp == 0) {
        /* float subnormals (< 2^-126) lie far below half the smallest fp16/fp8 subnormal */
        return 0;
    }
    significand |= 0x800000u;
    int exp = float_exp - 127; /* value = significand * 2^(exp - 23) */
    int min_normal_exp = 1 - bias;
    uint32_t base;
    int shift;
    if (exp >= min_normal_exp) {
        base = (uint32_t)(exp + bias - 1) << mant_bits;
        shift = 23 - mant_bits;
    } else {
        base = 0;
        shift = 23 - mant_bits + (min_normal_exp - exp);
    }
    if (shift > 24) return 0; /* below half the smallest subnormal: significand < 2^(shift-1) */
    uint32_t kept = significand >> shift;
    uint32_t rest = significand & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u))) kept++;
    return base + kept;
}

/* float -> bfloat16 bits, round to nearest even. */
AP_HOST_NUMERIC_FN uint16_t ap_float_to_bf16(float x) {
    uint32_t bits = ap_float_bits(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    /* adding 0x7fff plus the lowest kept bit rounds the low half to nearest, ties to even */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* bfloat16 bits -> float, exact. */
AP_HOST_NUMERIC_FN float ap_bf16_to_float(uint16_t code) {
    return ap_bits_float((uint32_t)code << 16);
}

/* float -> IEEE half bits, round to nearest even; overflow gives inf. */
AP_HOST_NUMERIC_FN uint16_t ap_float_to_f16(float x) {
    uint32_t bits = ap_float_bits(x);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t abs_bits = bits & 0x7fffffffu;
    if (abs_bits > 0x7f800000u) return 0x7fffu;
    if (abs_bits == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
    uint32_t mag = ap_narrow_round_magnitude(abs_bits, 10, 15);
    if (mag >= 0x7c00u) mag = 0x7c00u;
    return (uint16_t)(sign | mag);
}

/* IEEE half bits -> float, exact. */
AP_HOST_NUMERIC_FN float ap_f16_to_float(uint16_t code) {
    uint32_t sign = (uint32_t)(code & 0x8000u) << 16;
    uint32_t exp = (code >> 10) & 0x1fu;
    uint32_t mant = code & 0x3ffu;
    if (exp == 0x1fu) return ap_bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        /* subnormal: mant * 2^-24, exact in float */
        float mag = (float)mant * (1.0f / 16777216.0f);
        return sign ? -mag : mag;
    }
    return ap_bits_float(sign | ((exp - 15u + 127u) << 23) | (mant << 13));
}

/* float -> fp8 with `mant_bits` mantissa bits and exponent bias `bias`, saturating: |x| past
 * the largest finite magnitude code `max_code` and +-inf give +-max_code; NaN gives 0x7f. */
AP_HOST_NUMERIC_FN uint8_t ap_float_to_fp8_saturating(float x, int mant_bits, int bias,
                                                      uint32_t max_code) {
    uint32_t bits = ap_float_bits(x);
    uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
    uint32_t abs_bits = bits & 0x7fffffffu;
    if (abs_bits > 0x7f800000u) return 0x7fu;
    if (abs_bits == 0x7f800000u) return (uint8_t)(sign | max_code);
    uint32_t mag = ap_narrow_round_magnitude(abs_bits, mant_bits, bias);
    if (mag > max_code) mag = max_code;
    return (uint8_t)(sign | mag);
}

/* float -> fp8 e4m3fn (bias 7, 3 mantissa bits, no inf, NaN = 0x7f/0xff), saturating to +-448:
 * 0x7f would be NaN, so the largest finite code is 0x7e. */
AP_HOST_NUMERIC_FN uint8_t ap_float_to_fp8_e4m3(float x) {
    return ap_float_to_fp8_saturating(x, 3, 7, 0x7eu);
}

/* fp8 e4m3fn -> float, exact. */
AP_HOST_NUMERIC_FN float ap_fp8_e4m3_to_float(uint8_t code) {
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t exp = (code >> 3) & 0xfu;
    uint32_t mant = code & 0x7u;
    if ((code & 0x7fu) == 0x7fu) return ap_bits_float(sign | 0x7fc00000u);
    if (exp == 0) {
        float mag = (float)mant * (1.0f / 512.0f); /* subnormal: mant * 2^-9 */
        return sign ? -mag : mag;
    }
    return ap_bits_float(sign | ((exp - 7u + 127u) << 23) | (mant << 20));
}

/* float -> fp8 e5m2 (bias 15, 2 mantissa bits, IEEE-like), saturating to +-57344: 0x7c is inf,
 * so the largest finite code is 0x7b. */
AP_HOST_NUMERIC_FN uint8_t ap_float_to_fp8_e5m2(float x) {
    return ap_float_to_fp8_saturating(x, 2, 15, 0x7bu);
}

/* fp8 e5m2 -> float, exact (0x7c = inf, 0x7d..0x7f = NaN, with sign). */
AP_HOST_NUMERIC_FN float ap_fp8_e5m2_to_float(uint8_t code) {
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t exp = (code >> 2) & 0x1fu;
    uint32_t mant = code & 0x3u;
    if (exp == 0x1fu) return ap_bits_float(sign | 0x7f800000u | (mant << 21));
    if (exp == 0) {
        float mag = (float)mant * (1.0f / 65536.0f); /* subnormal: mant * 2^-16 */
        return sign ? -mag : mag;
    }
    return ap_bits_float(sign | ((exp - 15u + 127u) << 23) | (mant << 21));
}

#ifdef __cplusplus
}
#endif

#endif /* AP_HOST_NUMERIC_H */
