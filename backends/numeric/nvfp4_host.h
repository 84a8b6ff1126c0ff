/* nvfp4_host.h: the NVFP4 KV-cache format, once: quantize and dequantize, bit-exact host/device. */
#ifndef AP_NVFP4_HOST_H
#define AP_NVFP4_HOST_H

/* The format (plugin_api.h's ap_kv_cache holds the bytes):
 *   value  E2M1, 4 bits: sign (bit 3), 2 exponent bits (bias 1), 1 mantissa bit. Codes 0..7
 *          are the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (code 1 is the one subnormal); 8..15
 *          the same, negative. No inf, no NaN. Two per byte, the lower-indexed in the low nibble.
 *   block  16 consecutive values of one (token, head) row share one FP8 E4M3 scale byte s.
 *   global one FP32 scale g per layer for K and one for V: ap_layer.k_scale / v_scale.
 *   real value = e2m1(q) * e4m3(s) * g. The first product is exact in float32 (at most 6
 *   significant bits, within 2^-10 .. 2688) and in bf16 and fp16 too; then one rounding by g.
 *
 * Quantizing a block x[0..15] with global scale g, every operation in float32, rounded to
 * nearest even, in this order (the device does the same with __fmul_rn / __fdiv_rn, so no
 * multiply-add contraction and no approximate division changes a bit):
 *   amax  = max |x_i|                                   (+inf counts; +-0 blocks give 0)
 *   s     = e4m3_satfinite(amax / (6 * g))              RNE; past 448 and +inf give 448 (0x7e)
 *   inv   = s == 0 ? 0 : 1 / (e4m3(s) * g)
 *   q_i   = e2m1_satfinite(x_i * inv)                   RNE, ties to the even code; past 6 and
 *                                                       +-inf give +-6; the sign is kept, so a
 *                                                       negative value that rounds to 0 is 0x8
 * Decisions:
 *   - rounding the scale to nearest (not up) can leave amax / (e4m3(s) * g) a little above 6:
 *     such values saturate to 6 (error <= 1/16 of amax), as NVIDIA's NVFP4 recipe does;
 *   - a block whose scale rounds to 0 (amax <= 6 * g * 2^-10, zero blocks included) stores
 *     scale 0x00 and value codes 0 or 0x8 (x_i * 0): it reads back as zeros;
 *   - infinities and values past the range saturate (to 6 * 448 * g at most);
 *   - NaN is neither saturated nor refused: a block holding a NaN stores the E4M3 NaN scale
 *     0x7f and value codes 0, so all 16 of its values read back as NaN and the NaN reaches
 *     the attention output (the engine's finiteness check sees it), as a bf16 or fp8 cache
 *     would carry it. Enforced here, in ap_nvfp4_quantize_block, on the host and the device;
 *   - g must be finite and > 0; cpu_ref refuses a layer whose nvfp4 global scales are not.
 *     (For any g the bytes are still determined by the rules above, identically everywhere.)
 *
 * Header-only: C11 on the host; under nvcc the functions are also device functions, so the
 * kernels quantize with this very code (backends/common/nvfp4.cuh adds the fast decode). */

#include <math.h>
#include <stdint.h>

#include "host_numeric.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define AP_NVFP4_BLOCK 16        /* values per E4M3 scale */
#define AP_NVFP4_SCALE_NAN 0x7fu /* the scale of a block that held a NaN */

#if defined(__CUDA_ARCH__)
#define AP_NVFP4_MUL(a, b) __fmul_rn((a), (b))
#define AP_NVFP4_DIV(a, b) __fdiv_rn((a), (b))
#else
#define AP_NVFP4_MUL(a, b) ((a) * (b))
#define AP_NVFP4_DIV(a, b) ((a) / (b))
#endif

/* E2M1 code (low 4 bits) -> float, exact. */
AP_HOST_NUMERIC_FN float ap_e2m1_to_float(uint8_t code) {
    float magnitude;
    switch (code & 7u) {
        case 0: magnitude = 0.0f; break;
        case 1: magnitude = 0.5f; break;
        case 2: magnitude = 1.0f; break;
        case 3: magnitude = 1.5f; break;
        case 4: magnitude = 2.0f; break;
        case 5: magnitude = 3.0f; break;
        case 6: magnitude = 4.0f; break;
        default: magnitude = 6.0f; break;
    }
    return (code & 8u) ? -magnitude : magnitude;
}

/* float -> E2M1 code, round to nearest, ties to the even code, saturating at +-6. Each
 * comparison is one midpoint between neighbouring magnitudes; `>` where the lower neighbour has
 * the even code (ties go down), `>=` where the upper one has (ties go up). The sign bit is the
 * float's (-0 -> 0x8); NaN gives 0 (ap_nvfp4_quantize_block never passes one for a finite g). */
AP_HOST_NUMERIC_FN uint8_t ap_float_to_e2m1(float y) {
    if (y != y) return 0;
    float a = fabsf(y);
    unsigned magnitude = (unsigned)(a > 0.25f) + (unsigned)(a >= 0.75f) + (unsigned)(a > 1.25f) +
                         (unsigned)(a >= 1.75f) + (unsigned)(a > 2.5f) + (unsigned)(a >= 3.5f) +
                         (unsigned)(a > 5.0f);
    return (uint8_t)(magnitude | ((ap_float_bits(y) >> 28) & 8u));
}

/* The block quantizer in three steps, so that a kernel whose block lies in two threads (8 values
 * each) runs the same code: the largest magnitude of some of the block's values (and whether one
 * is NaN), combined over the block by max / or, then the block's scale byte and the reciprocal
 * the values are multiplied by, then the codes of any even run of its values. */

/* max |x_i| over x[0 .. n), NaN skipped (+inf counts); *has_nan |= any x_i is NaN. */
AP_HOST_NUMERIC_FN float ap_nvfp4_block_amax(const float *x, int n, int *has_nan) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        if (x[i] != x[i])
            *has_nan = 1;
        else
            amax = fmaxf(amax, fabsf(x[i]));
    }
    return amax;
}

/* The scale byte of a block with largest magnitude amax, and *inv, what its values are
 * multiplied by: s = e4m3_satfinite(amax / (6 * g)), inv = s == 0 ? 0 : 1 / (e4m3(s) * g); a
 * block holding a NaN gets the NaN scale and inv 0. On the device the e4m3 conversions are the
 * hardware's, which give the host functions' bits (host_numeric.h). */
AP_HOST_NUMERIC_FN uint8_t ap_nvfp4_block_scale(float amax, int has_nan, float g, float *inv) {
    if (has_nan) {
        *inv = 0.0f;
        return (uint8_t)AP_NVFP4_SCALE_NAN;
    }
#if defined(__CUDA_ARCH__)
    uint8_t scale = (uint8_t)__nv_cvt_float_to_fp8(AP_NVFP4_DIV(amax, AP_NVFP4_MUL(6.0f, g)),
                                                   __NV_SATFINITE, __NV_E4M3);
    float decoded = __half2float(__half(__nv_cvt_fp8_to_halfraw(scale, __NV_E4M3)));
#else
    uint8_t scale = ap_float_to_fp8_e4m3(AP_NVFP4_DIV(amax, AP_NVFP4_MUL(6.0f, g)));
    float decoded = ap_fp8_e4m3_to_float(scale);
#endif
    *inv = decoded == 0.0f ? 0.0f : AP_NVFP4_DIV(1.0f, AP_NVFP4_MUL(decoded, g));
    return scale;
}

/* Codes of x[0 .. n), n even, into packed[0 .. n / 2) (value 2i in the low nibble of byte i);
 * all 0 for a block holding a NaN. */
AP_HOST_NUMERIC_FN void ap_nvfp4_block_codes(const float *x, int n, float inv, int has_nan,
                                             uint8_t *packed) {
    for (int i = 0; i < n / 2; i++) {
        uint8_t low = ap_float_to_e2m1(AP_NVFP4_MUL(x[2 * i], inv));
        uint8_t high = ap_float_to_e2m1(AP_NVFP4_MUL(x[2 * i + 1], inv));
        packed[i] = has_nan ? 0 : (uint8_t)(low | (high << 4));
    }
}

/* Quantize 16 floats with global scale g (the rules above): 8 bytes of codes into `packed`
 * (value 2i in the low nibble of byte i, 2i + 1 in the high one); returns the scale byte. */
AP_HOST_NUMERIC_FN uint8_t ap_nvfp4_quantize_block(const float *x, float g, uint8_t *packed) {
    int has_nan = 0;
    float amax = ap_nvfp4_block_amax(x, AP_NVFP4_BLOCK, &has_nan);
    float inv;
    uint8_t scale = ap_nvfp4_block_scale(amax, has_nan, g, &inv);
    ap_nvfp4_block_codes(x, AP_NVFP4_BLOCK, inv, has_nan, packed);
    return scale;
}

/* Value i of a block without the global scale: e2m1 * e4m3, exact in float32. */
AP_HOST_NUMERIC_FN float ap_nvfp4_unscaled(const uint8_t *packed, uint8_t scale, int i) {
    uint8_t code = (uint8_t)((i & 1) ? packed[i / 2] >> 4 : packed[i / 2] & 15u);
    return ap_e2m1_to_float(code) * ap_fp8_e4m3_to_float(scale);
}

/* Value i of a block: (e2m1 * e4m3) * g, one float32 rounding. */
AP_HOST_NUMERIC_FN float ap_nvfp4_dequantize(const uint8_t *packed, uint8_t scale, float g, int i) {
    return AP_NVFP4_MUL(ap_nvfp4_unscaled(packed, scale, i), g);
}

#ifdef __cplusplus
}
#endif

#endif /* AP_NVFP4_HOST_H */
