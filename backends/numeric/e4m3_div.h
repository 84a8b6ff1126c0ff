/* e4m3_div.h: x / scale for an fp8 e4m3 quantization in three float operations, with the e4m3
 * bytes of a true float32 division (host and device). */
#ifndef AP_E4M3_DIV_H
#define AP_E4M3_DIV_H

/* Quantizing to e4m3 divides by a per-tensor scale and rounds once (host_numeric.h's
 * ap_float_to_fp8_e4m3 of x / scale). On the GPU the division is MUFU.RCP, four FMAs, a check
 * and a branch to its slow path (taken for extreme operands). Here, with no branch:
 *   rcp = ap_e4m3_div_rcp(scale)       once per scale: 1 / scale rounded once; 0 where the
 *                                      scale is outside [2^-60, 2^60] (the caller divides then)
 *   q   = x * rcp
 *   |q| in [2^-12, 2^100]: q + fma(-q, scale, x) * rcp (two fmas). Markstein's theorem: with
 *         rcp = 1 / scale rounded to nearest and q within an ulp of x / scale, this is x / scale
 *         rounded to nearest when the remainder is exact, as it is here: |x| >= 2^-12 * 2^-60
 *         lies far above where it could underflow;
 *   else q itself: below 2^-12 the e4m3 of either is +-0 (half the smallest e4m3 subnormal is
 *         2^-10), above 2^100 (+-inf included) +-448 (saturated), NaN stays NaN.
 * The float32 quotient is x / scale's wherever its e4m3 can differ; elsewhere only the e4m3
 * bytes agree, which is all the callers store. Checked against the division on the host
 * (tests/cpu_ref/test_e4m3_div.c) and on the GPU for every float over six scales
 * (test_numeric_cuda.cu). */

#include <math.h>

#include "host_numeric.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDA_ARCH__)
#define AP_E4M3_DIV_MUL(a, b) __fmul_rn((a), (b))
#define AP_E4M3_DIV_DIV(a, b) __fdiv_rn((a), (b))
#else
#define AP_E4M3_DIV_MUL(a, b) ((a) * (b))
#define AP_E4M3_DIV_DIV(a, b) ((a) / (b))
#endif

AP_HOST_NUMERIC_FN float ap_e4m3_div_rcp(float scale) {
    return scale >= 0x1p-60f && scale <= 0x1p60f ? AP_E4M3_DIV_DIV(1.0f, scale) : 0.0f;
}

/* rcp = ap_e4m3_div_rcp(scale), nonzero. */
AP_HOST_NUMERIC_FN float ap_e4m3_div(float x, float scale, float rcp) {
    const float q = AP_E4M3_DIV_MUL(x, rcp);
    const float corrected = fmaf(fmaf(-q, scale, x), rcp, q);
    const float aq = fabsf(q);
    return aq >= 0x1p-12f && aq <= 0x1p100f ? corrected : q;
}

#ifdef __cplusplus
}
#endif

#endif
