/* test_e4m3_div.c: numeric/e4m3_div.h's division against a true float32 division, on the host:
 * the e4m3 bytes always, the float32 quotient itself where the correction runs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "backends/numeric/e4m3_div.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* One quotient: the bytes must agree; in [2^-12, 2^100] the quotient's bits too. A scale without
 * a reciprocal (rcp 0) is the caller's to divide by. */
static int check_one(float x, float scale, float rcp, unsigned long *corrected) {
    if (rcp == 0.0f) return 1;
    const float want = x / scale, got = ap_e4m3_div(x, scale, rcp);
    if (ap_float_to_fp8_e4m3(got) != ap_float_to_fp8_e4m3(want)) {
        print_error("x %a scale %a: e4m3 0x%02x, want 0x%02x\n", (double)x, (double)scale,
                    ap_float_to_fp8_e4m3(got), ap_float_to_fp8_e4m3(want));
        return 0;
    }
    const float aq = fabsf(x * rcp);
    if (aq >= 0x1p-12f && aq <= 0x1p100f) {
        ++*corrected;
        if (ap_float_bits(got) != ap_float_bits(want)) {
            print_error("x %a scale %a: quotient %a, want %a\n", (double)x, (double)scale,
                        (double)got, (double)want);
            return 0;
        }
    }
    return 1;
}

/* Any float x (every bit pattern: subnormals, inf, NaN) over scales from the whole range the
 * reciprocal serves and from near its limits; outside them there is no reciprocal. */
static void test_random_sweep(void **state) {
    (void)state;
    unsigned long corrected = 0, bad = 0;
    for (long i = 0; i < (1L << 25) && bad < 5; i++) {
        const uint64_t r = rng_next();
        const float x = ap_bits_float((uint32_t)r);
        const uint32_t mant = (uint32_t)(r >> 32) & 0x7fffffu;
        int exp;
        switch ((r >> 55) % 4) {
            case 0: exp = -8 + (int)((r >> 57) % 9); break;    /* 2^-8 .. 2^0: typical */
            case 1: exp = -60 + (int)((r >> 57) % 121); break; /* the whole served range */
            case 2: exp = (r >> 57) % 2 ? 59 : -61; break;     /* at the limits */
            default: exp = (r >> 57) % 2 ? 70 : -80; break;    /* outside: no reciprocal */
        }
        const float scale = ap_bits_float(((uint32_t)(exp + 127) << 23) | mant);
        const float rcp = ap_e4m3_div_rcp(scale);
        if ((scale < 0x1p-60f || scale > 0x1p60f) != (rcp == 0.0f)) {
            print_error("scale %a: reciprocal %a\n", (double)scale, (double)rcp);
            bad++;
        }
        bad += !check_one(x, scale, rcp, &corrected);
    }
    assert_int_equal(bad, 0);
    /* most quotients took the correction, so the sweep tested it */
    assert_true(corrected > (1UL << 23));
}

/* Activations' values (bf16 of magnitude 2^-20 .. 2^12, every mantissa and sign) over a scale
 * that puts them across e4m3's whole range, subnormals and saturation included. */
static void test_activation_range(void **state) {
    (void)state;
    unsigned long corrected = 0, bad = 0;
    const float scales[] = {0.0213f, 1.0f / 448.0f, 3.0f, 0.5f, 1.7e-5f};
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        const float rcp = ap_e4m3_div_rcp(scales[s]);
        for (uint32_t e = 127 - 20; e <= 127 + 12; e++)
            for (uint32_t m = 0; m < 128; m++)
                for (uint32_t sign = 0; sign < 2; sign++) {
                    const float x = ap_bits_float((sign << 31) | (e << 23) | (m << 16));
                    bad += !check_one(x, scales[s], rcp, &corrected);
                }
    }
    assert_int_equal(bad, 0);
}

/* The edges: zeros keep their sign, infinities saturate, NaN stays NaN; a scale outside
 * [2^-60, 2^60] (0, negative, NaN, huge, tiny) has no reciprocal. */
static void test_edges(void **state) {
    (void)state;
    const float xs[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -3.5f, 0x1p-140f, 448.0f};
    const float scales[] = {0.02f, 0.0f, -0.02f, NAN, 0x1p70f, 0x1p-70f, INFINITY};
    unsigned long corrected = 0;
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++)
            assert_true(check_one(xs[i], scales[s], ap_e4m3_div_rcp(scales[s]), &corrected));
    const float none[] = {0.0f, -0.02f, NAN, 0x1p61f, 0x1p-61f, INFINITY};
    for (size_t s = 0; s < sizeof none / sizeof none[0]; s++)
        assert_true(ap_e4m3_div_rcp(none[s]) == 0.0f);
    assert_true(ap_e4m3_div_rcp(0x1p60f) == 0x1p-60f && ap_e4m3_div_rcp(0.5f) == 2.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_sweep),
        cmocka_unit_test(test_activation_range),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
