/* test_nvfp4.c: nvfp4_host.h against the tests' own quantizer, and its round-trip error bounds. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "backends/numeric/nvfp4_host.h"
#include "fixture.h"
#include "nvfp4_ref.h"

static uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

static float float_of(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}

/* The block as the kit's append kernel quantizes it, in two halves of 8 (two GPU lanes): each
 * half's amax and NaN flag, combined by max / or, one scale, each half's codes. */
static uint8_t quantize_split(const float *x, float g, uint8_t *packed) {
    int nan_low = 0, nan_high = 0;
    float amax =
        fmaxf(ap_nvfp4_block_amax(x, 8, &nan_low), ap_nvfp4_block_amax(x + 8, 8, &nan_high));
    float inv;
    uint8_t scale = ap_nvfp4_block_scale(amax, nan_low | nan_high, g, &inv);
    ap_nvfp4_block_codes(x, 8, inv, nan_low | nan_high, packed);
    ap_nvfp4_block_codes(x + 8, 8, inv, nan_low | nan_high, packed + 4);
    return scale;
}

/* Quantize one block with both implementations, and in two halves: bytes must agree exactly. */
static uint8_t quantize_both(const float *x, float g, uint8_t *packed, const char *what) {
    uint8_t ours[8], theirs[8], halves[8];
    uint8_t scale = ap_nvfp4_quantize_block(x, g, ours);
    if (quantize_split(x, g, halves) != scale || memcmp(halves, ours, 8) != 0)
        fail_msg("%s: quantized in two halves of 8, the bytes differ from the whole block's", what);
    uint8_t want = nr_quantize_block(x, g, theirs);
    if (scale != want)
        fail_msg("%s: scale byte 0x%02x, reference 0x%02x (g %a)", what, scale, want, (double)g);
    for (int b = 0; b < 8; b++)
        if (ours[b] != theirs[b])
            fail_msg("%s: value byte %d is 0x%02x, reference 0x%02x (x %a %a, g %a)", what, b,
                     ours[b], theirs[b], (double)x[2 * b], (double)x[2 * b + 1], (double)g);
    memcpy(packed, ours, 8);
    return scale;
}

/* The per-value bound of a block quantized with step S = e4m3(s) * g (y = x / S):
 *   |y| <= 2: |x - x'| <= S / 4;  |y| <= 4: S / 2;  <= 6.4: S (the gap 4 -> 6 is 2; past 6
 *   only because the scale rounded down, by at most 1/16: 6 * 16/15 = 6.4);
 *   past 6.4 only where the scale rounded down by more than 1/16: at the largest scale (0x7e,
 *   the block beyond e4m3's range) and at e4m3's subnormal scales 0x01..0x07, 2^-9 apart, where
 *   amax / (6 g) can round down by up to a third (0x01 holds 1.49 * 2^-9): exactly +-6 S.
 * The slack covers x * (1 / S) being rounded twice in float32. */
static void check_round_trip(const float *x, float g, const uint8_t *packed, uint8_t scale,
                             const char *what) {
    double step = nr_e4m3_value(scale) * (double)g;
    for (int i = 0; i < 16; i++) {
        double back = ap_nvfp4_dequantize(packed, scale, g, i);
        double y = fabs((double)x[i]) / step;
        double bound = step == 0.0 ? 0.0 : y <= 2.0 ? step / 4 : y <= 4.0 ? step / 2 : step;
        bound = bound * (1.0 + 1e-6) + step * 1e-6;
        if (step == 0.0) {
            if (back != 0.0) fail_msg("%s: zero-scale block value %d reads %g", what, i, back);
            continue;
        }
        if (y > 6.4 * (1.0 + 1e-6)) {
            /* +-inf and values past the range saturate to +-6 S, only under the largest scale
             * or a subnormal one */
            int coarse_scale = scale == 0x7e || (scale >= 0x01 && scale <= 0x07);
            if (!coarse_scale || back != (double)(float)copysign(6.0 * step, x[i]))
                fail_msg("%s: value %d = %g (y %g) read back as %g under scale 0x%02x, not +-6 S",
                         what, i, (double)x[i], y, back, scale);
            continue;
        }
        if (!(fabs(back - (double)x[i]) <= bound))
            fail_msg("%s: value %d = %.9g read back as %.9g: error %g > bound %g (S %g)", what, i,
                     (double)x[i], back, fabs(back - (double)x[i]), bound, step);
    }
}

/* Every code's value, and every value encodes back to its own code. */
static void test_e2m1_codes(void **state) {
    (void)state;
    for (int code = 0; code < 16; code++) {
        float value = ap_e2m1_to_float((uint8_t)code);
        assert_true(bits_of(value) == bits_of((float)nr_e2m1_value(code)) ||
                    (code == 8 && value == 0.0f));
        assert_int_equal(ap_float_to_e2m1(value), code == 8 ? 8 : code);
        assert_int_equal(ap_float_to_e2m1(-value), code < 8 ? code | 8 : code & 7);
    }
    assert_int_equal(ap_float_to_e2m1(-0.0f), 8);
}

/* Rounding: a fine grid (every midpoint exactly, and one float either side), far values,
 * infinities, tiny values and random floats, all against the nearest-value search. */
static void test_e2m1_rounding(void **state) {
    (void)state;
    for (int k = -1000; k <= 1000; k++) {
        float y = (float)k / 128.0f;
        float around[3] = {y, nextafterf(y, -INFINITY), nextafterf(y, INFINITY)};
        for (int j = 0; j < 3; j++)
            if (ap_float_to_e2m1(around[j]) != nr_e2m1_encode(around[j]))
                fail_msg("e2m1(%a) = 0x%x, reference 0x%x", (double)around[j],
                         ap_float_to_e2m1(around[j]), nr_e2m1_encode(around[j]));
    }
    /* ties to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
     * 5 -> 4; saturation */
    const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.5f, 1e30f, INFINITY};
    const int codes[] = {0, 2, 2, 4, 4, 6, 6, 7, 7, 7};
    for (int i = 0; i < 10; i++) {
        assert_int_equal(ap_float_to_e2m1(ties[i]), codes[i]);
        assert_int_equal(ap_float_to_e2m1(-ties[i]), codes[i] | 8);
    }
    assert_int_equal(ap_float_to_e2m1(float_of(0x00000001u)), 0);
    assert_int_equal(ap_float_to_e2m1(-float_of(0x00000001u)), 8);
    for (int i = 0; i < 200000; i++) {
        float y = float_of((uint32_t)fx_rand_u64());
        if (isnan(y)) continue;
        if (ap_float_to_e2m1(y) != nr_e2m1_encode(y))
            fail_msg("e2m1(%a) = 0x%x, reference 0x%x", (double)y, ap_float_to_e2m1(y),
                     nr_e2m1_encode(y));
    }
}

/* Dequantize: every value byte under every scale byte, for a few global scales, bit-exact
 * against the definition (NaN scales give NaN). */
static void test_dequantize_all_bytes(void **state) {
    (void)state;
    const float globals[] = {1.0f, 0.0078125f, 3.0e-3f, 0.37f, 1.0e-30f};
    for (int gi = 0; gi < 5; gi++)
        for (int scale = 0; scale < 256; scale++)
            for (int byte = 0; byte < 256; byte++) {
                uint8_t packed[8] = {(uint8_t)byte};
                for (int i = 0; i < 2; i++) {
                    float got = ap_nvfp4_dequantize(packed, (uint8_t)scale, globals[gi], i);
                    double want_d = nr_dequantize(packed, (uint8_t)scale, globals[gi], i);
                    /* e2m1 * e4m3 is exact in float, so rounding the double product once is
                     * float32's multiply by g */
                    float want = (float)want_d;
                    int same = isnan(want) ? isnan(got) : bits_of(got) == bits_of(want);
                    if (!same && !(got == 0.0f && want == 0.0f))
                        fail_msg("dequantize byte 0x%02x value %d scale 0x%02x g %a: %a, want %a",
                                 byte, i, scale, (double)globals[gi], (double)got, (double)want);
                    float unscaled = ap_nvfp4_unscaled(packed, (uint8_t)scale, i);
                    double exact = nr_dequantize(packed, (uint8_t)scale, 1.0f, i);
                    assert_true(isnan(exact) ? isnan(unscaled) : (double)unscaled == exact);
                }
            }
}

/* Blocks built to land on each positive scale code: amax = 6 * e4m3(s) * g, so s is chosen
 * exactly and the value codes are tested at every scale, with the reference byte for byte. */
static void test_quantize_every_scale(void **state) {
    (void)state;
    const float globals[] = {1.0f, 0.001953125f, 2.5e-3f};
    for (int gi = 0; gi < 3; gi++)
        for (int s = 1; s < 0x7f; s++) {
            float g = globals[gi];
            float x[16];
            float amax = (float)(6.0 * nr_e4m3_value(s) * (double)g);
            for (int i = 0; i < 16; i++) x[i] = amax * (float)fx_rand_uniform(-1.0, 1.0);
            x[fx_rand_int(0, 15)] = fx_rand_int(0, 1) ? amax : -amax;
            char what[64];
            snprintf(what, sizeof what, "scale 0x%02x g %g", s, (double)g);
            uint8_t packed[8];
            uint8_t scale = quantize_both(x, g, packed, what);
            /* amax / (6 g) lies a few float roundings from e4m3(s): it rounds to s */
            if (scale != s) fail_msg("%s: got scale 0x%02x", what, scale);
            check_round_trip(x, g, packed, scale, what);
        }
}

/* Random blocks of several shapes and global scales: byte-exact with the reference, within the
 * per-value bound, and the overall error of uniform data where theory puts it: with amax ~ 1,
 * S ~ 1/6 and y = x / S uniform on [0, 6], the rounding steps 0.5, 1, 2 over thirds of the range
 * give a mean squared error (0.25 + 1 + 4) / 36 S^2 against E x^2 = 1/3: rel L2 ~ 0.10. */
static void test_quantize_random(void **state) {
    (void)state;
    double diff = 0.0, norm = 0.0;
    for (int iter = 0; iter < 20000; iter++) {
        float x[16];
        int shape = iter % 4;
        float g = (float)exp(fx_rand_uniform(log(1e-4), log(1.0)));
        for (int i = 0; i < 16; i++) {
            double u = fx_rand_uniform(-1.0, 1.0);
            if (shape == 0) x[i] = (float)u;                  /* uniform */
            if (shape == 1) x[i] = (float)(u * u * u * 40.0); /* heavy centre */
            if (shape == 2) x[i] = (float)copysign(exp(fx_rand_uniform(-12, 3)), u); /* decades */
            if (shape == 3) x[i] = (float)(u * 6.0 * 448.0 * (double)g); /* up to the top */
        }
        uint8_t packed[8];
        uint8_t scale = quantize_both(x, g, packed, "random block");
        check_round_trip(x, g, packed, scale, "random block");
        if (shape == 0 && g > 1e-3f && g < 0.02f) /* uniform data, scale well inside e4m3 */
            for (int i = 0; i < 16; i++) {
                double back = ap_nvfp4_dequantize(packed, scale, g, i);
                diff += (back - x[i]) * (back - x[i]);
                norm += (double)x[i] * x[i];
            }
    }
    double rel = sqrt(diff / norm);
    printf("uniform [-1, 1) blocks: rel L2 round-trip error %.4f\n", rel);
    assert_true(rel > 0.09 && rel < 0.115);
}

/* Adversarial blocks, one rule each. */
static void test_quantize_adversarial(void **state) {
    (void)state;
    uint8_t packed[8];
    float x[16];
    const float g = 0.01f;
    /* all equal: every value the same code, the block's amax maps to (about) 6 */
    const float levels[] = {1.0f, -0.3f, 7.5f, 1e-3f};
    for (int l = 0; l < 4; l++) {
        for (int i = 0; i < 16; i++) x[i] = levels[l];
        uint8_t scale = quantize_both(x, g, packed, "all-equal block");
        for (int b = 0; b < 8; b++) assert_int_equal(packed[b] & 15, packed[b] >> 4);
        assert_int_equal(packed[0] & 15, packed[7] >> 4);
        check_round_trip(x, g, packed, scale, "all-equal block");
    }
    /* one outlier per block: it sets the scale; small values flush towards 0 but stay bounded */
    for (int pos = 0; pos < 16; pos++) {
        for (int i = 0; i < 16; i++) x[i] = (float)fx_rand_uniform(-0.01, 0.01);
        x[pos] = pos % 2 ? 20.0f : -20.0f; /* amax / (6 g) = 333: inside e4m3's range */
        uint8_t scale = quantize_both(x, g, packed, "one outlier");
        int code = (pos % 2 ? packed[pos / 2] >> 4 : packed[pos / 2] & 15);
        assert_int_equal(code & 7, 7); /* the outlier is the block's +-6 (or saturated) */
        assert_int_equal(code >> 3, pos % 2 ? 0 : 1);
        check_round_trip(x, g, packed, scale, "one outlier");
    }
    /* zeros (and negative zeros): scale 0, value codes 0 / 0x8, read back as zeros */
    for (int i = 0; i < 16; i++) x[i] = i % 3 ? 0.0f : -0.0f;
    assert_int_equal(quantize_both(x, g, packed, "zero block"), 0);
    for (int i = 0; i < 16; i++) assert_true(ap_nvfp4_dequantize(packed, 0, g, i) == 0.0f);
    /* a block too small for the smallest scale (amax <= 6 g 2^-10): stored as zeros */
    for (int i = 0; i < 16; i++) x[i] = (float)fx_rand_uniform(-1.0, 1.0) * 6.0f * g / 1024.0f;
    assert_int_equal(quantize_both(x, g, packed, "tiny block"), 0);
    check_round_trip(x, g, packed, 0, "tiny block");
    /* subnormal scale codes: amax / (6 g) in e4m3's subnormal range 2^-9 .. 7 * 2^-9 */
    for (int m = 1; m < 8; m++) {
        for (int i = 0; i < 16; i++) x[i] = (float)fx_rand_uniform(-1.0, 1.0) * 6.0f * g * m / 512;
        x[3] = 6.0f * g * (float)m / 512.0f;
        assert_int_equal(quantize_both(x, g, packed, "subnormal scale"), m);
        check_round_trip(x, g, packed, (uint8_t)m, "subnormal scale");
    }
    /* past the range: amax / (6 g) > 448 saturates the scale to 0x7e and the values to +-6 */
    for (int i = 0; i < 16; i++) x[i] = (float)fx_rand_uniform(-1.0, 1.0);
    x[5] = 6.0f * 448.0f * g * 10.0f;
    x[6] = -6.0f * 448.0f * g * 3.0f;
    x[7] = 6.0f * 448.0f * g * 0.5f; /* 3 steps of 448 g: code 5 */
    assert_int_equal(quantize_both(x, g, packed, "past the range"), 0x7e);
    assert_int_equal(packed[2] >> 4, 0x7);
    assert_int_equal(packed[3] & 15, 0xf);
    assert_int_equal(packed[3] >> 4, 0x5);
    /* infinities saturate like values past the range */
    for (int i = 0; i < 16; i++) x[i] = (float)fx_rand_uniform(-1.0, 1.0);
    x[0] = INFINITY;
    x[9] = -INFINITY;
    assert_int_equal(quantize_both(x, g, packed, "inf block"), 0x7e);
    assert_int_equal(packed[0] & 15, 0x7);
    assert_int_equal(packed[4] >> 4, 0xf);
    check_round_trip(x, g, packed, 0x7e, "inf block");
    /* NaN: the block's scale is e4m3's NaN and every value of the block reads back as NaN */
    for (int pos = 0; pos < 16; pos += 5) {
        for (int i = 0; i < 16; i++) x[i] = (float)fx_rand_uniform(-1.0, 1.0);
        x[pos] = NAN;
        assert_int_equal(quantize_both(x, g, packed, "NaN block"), AP_NVFP4_SCALE_NAN);
        for (int i = 0; i < 16; i++) {
            assert_true(isnan(ap_nvfp4_dequantize(packed, AP_NVFP4_SCALE_NAN, g, i)));
            if (i % 2 == 0) assert_int_equal(packed[i / 2], 0);
        }
    }
}

int main(void) {
    fx_seed_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e2m1_codes),           cmocka_unit_test(test_e2m1_rounding),
        cmocka_unit_test(test_dequantize_all_bytes), cmocka_unit_test(test_quantize_every_scale),
        cmocka_unit_test(test_quantize_random),      cmocka_unit_test(test_quantize_adversarial),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
