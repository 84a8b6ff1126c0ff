/* test_numeric.c: host_numeric.h against an independent brute-force nearest-value search. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backends/numeric/host_numeric.h"
#include "fixture.h"

/* A narrow format as the tests see it, described only by its field widths. */
typedef struct fmt {
    const char *name;
    int exp_bits, mant_bits, bias;
    int saturating;   /* 1: fp8 __NV_SATFINITE; 0: IEEE overflow to inf */
    int ieee_special; /* 1: top exponent holds inf/NaN (bf16, f16, e5m2); 0: e4m3fn */
    uint32_t (*encode)(float);
    float (*decode)(uint32_t);
} fmt;

static uint32_t enc_bf16(float x) {
    return ap_float_to_bf16(x);
}
static float dec_bf16(uint32_t c) {
    return ap_bf16_to_float((uint16_t)c);
}
static uint32_t enc_f16(float x) {
    return ap_float_to_f16(x);
}
static float dec_f16(uint32_t c) {
    return ap_f16_to_float((uint16_t)c);
}
static uint32_t enc_e4m3(float x) {
    return ap_float_to_fp8_e4m3(x);
}
static float dec_e4m3(uint32_t c) {
    return ap_fp8_e4m3_to_float((uint8_t)c);
}
static uint32_t enc_e5m2(float x) {
    return ap_float_to_fp8_e5m2(x);
}
static float dec_e5m2(uint32_t c) {
    return ap_fp8_e5m2_to_float((uint8_t)c);
}

static const fmt FMT_BF16 = {"bf16", 8, 7, 127, 0, 1, enc_bf16, dec_bf16};
static const fmt FMT_F16 = {"f16", 5, 10, 15, 0, 1, enc_f16, dec_f16};
static const fmt FMT_E4M3 = {"e4m3", 4, 3, 7, 1, 0, enc_e4m3, dec_e4m3};
static const fmt FMT_E5M2 = {"e5m2", 5, 2, 15, 1, 1, enc_e5m2, dec_e5m2};

static int fmt_bits(const fmt *f) {
    return 1 + f->exp_bits + f->mant_bits;
}

/* Value of a code from the definition: (-1)^s * 2^(e - bias) * (1 + m / 2^M), or for e == 0
 * 2^(1 - bias) * m / 2^M. Returns 0 for a NaN code, 2 for an infinity, 1 for a finite value. */
static int fmt_value(const fmt *f, uint32_t code, double *value) {
    uint32_t mant = code & ((1u << f->mant_bits) - 1u);
    uint32_t exp = (code >> f->mant_bits) & ((1u << f->exp_bits) - 1u);
    int negative = (code >> (f->exp_bits + f->mant_bits)) & 1u;
    uint32_t exp_max = (1u << f->exp_bits) - 1u;
    if (f->ieee_special && exp == exp_max) {
        *value = negative ? -INFINITY : INFINITY;
        return mant == 0 ? 2 : 0;
    }
    if (!f->ieee_special && exp == exp_max && mant == (1u << f->mant_bits) - 1u) return 0;
    double magnitude =
        exp == 0 ? ldexp((double)mant, 1 - f->bias - f->mant_bits)
                 : ldexp((double)(mant | (1u << f->mant_bits)), (int)exp - f->bias - f->mant_bits);
    *value = negative ? -magnitude : magnitude;
    return 1;
}

/* The sorted non-negative finite values: codes 0 .. largest finite are monotonic in value. */
typedef struct table {
    double *values;
    uint32_t count; /* codes 0 .. count-1 */
} table;

static table table_build(const fmt *f) {
    table t = {malloc(sizeof(double) << fmt_bits(f)), 0};
    double value;
    for (uint32_t code = 0; code < (1u << (fmt_bits(f) - 1)); code++) {
        if (fmt_value(f, code, &value) != 1) break;
        t.values[t.count++] = value;
    }
    return t;
}

/* Brute force: the nearest finite value to |x|, ties to the even code (the one whose last
 * mantissa bit is 0). Past the largest finite value: saturating formats clamp; IEEE ones go to
 * inf from largest + half an ulp on (that tie goes "up", to the even code of inf). */
static uint32_t nearest_code(const fmt *f, const table *t, double x) {
    uint32_t sign = x < 0 || (x == 0 && signbit(x)) ? 1u << (fmt_bits(f) - 1) : 0;
    double a = fabs(x);
    double largest = t->values[t->count - 1];
    double next_up = largest + (largest - t->values[t->count - 2]);
    if (a >= largest) {
        if (f->saturating || a < (largest + next_up) / 2) return sign | (t->count - 1);
        return sign | t->count; /* inf */
    }
    uint32_t lo = 0, hi = t->count - 1; /* values[lo] <= a < values[hi] */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (t->values[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    double below = a - t->values[lo], above = t->values[hi] - a;
    uint32_t code = below < above ? lo : above < below ? hi : ((lo & 1u) == 0 ? lo : hi);
    return sign | code;
}

static uint32_t nearest_code_linear(const fmt *f, const table *t, double x) {
    uint32_t best = 0;
    double best_dist = INFINITY;
    for (uint32_t c = 0; c < t->count; c++) {
        double dist = fabs(fabs(x) - t->values[c]);
        if (dist < best_dist || (dist == best_dist && (c & 1u) == 0)) {
            best = c;
            best_dist = dist;
        }
    }
    uint32_t sign = signbit(x) ? 1u << (fmt_bits(f) - 1) : 0;
    return sign | best;
}

static void check_one(const fmt *f, const table *t, float x) {
    uint32_t want = nearest_code(f, t, x);
    uint32_t got = f->encode(x);
    if (got != want)
        fail_msg("%s: %a (%.9g) encodes to 0x%x, nearest is 0x%x", f->name, (double)x, (double)x,
                 got, want);
    if (fmt_bits(f) == 8) {
        uint32_t linear = nearest_code_linear(f, t, x);
        if (fabs(x) < t->values[t->count - 1] && linear != want)
            fail_msg("%s: searches disagree on %a: 0x%x vs 0x%x", f->name, (double)x, want, linear);
    }
}

/* Every code decodes to its defined value and a finite or infinite one encodes back to itself;
 * then every midpoint (a tie), the floats next to it, and random floats across the format's
 * range match the brute-force search. */
static void check_format(const fmt *f) {
    table t = table_build(f);
    uint32_t codes = 1u << fmt_bits(f);
    for (uint32_t code = 0; code < codes; code++) {
        double want;
        int kind = fmt_value(f, code, &want);
        float got = f->decode(code);
        if (kind == 0) {
            if (!isnan(got))
                fail_msg("%s: NaN code 0x%x decodes to %g", f->name, code, (double)got);
            continue;
        }
        if ((double)got != want || !signbit(got) != !signbit(want))
            fail_msg("%s: code 0x%x decodes to %a, defined as %a", f->name, code, (double)got,
                     want);
        if (kind == 1 || !f->saturating) {
            if (f->encode(got) != code)
                fail_msg("%s: code 0x%x does not round-trip (0x%x)", f->name, code, f->encode(got));
        }
    }
    for (uint32_t c = 0; c + 1 < t.count; c++) {
        float mid = (float)((t.values[c] + t.values[c + 1]) / 2); /* exact: a few more bits */
        assert_true((double)mid == (t.values[c] + t.values[c + 1]) / 2);
        float probes[] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 3; i++) {
            check_one(f, &t, probes[i]);
            check_one(f, &t, -probes[i]);
        }
    }
    int emin = 1 - f->bias - f->mant_bits - 3, emax = (1 << f->exp_bits) - f->bias + 2;
    for (int i = 0; i < 400000; i++) {
        int e = fx_rand_int(emin, emax);
        float x = ldexpf((float)fx_rand_uniform(1.0, 2.0), e);
        check_one(f, &t, fx_rand_u64() & 1 ? -x : x);
    }
    free(t.values);
}

static void test_bf16_exhaustive(void **state) {
    (void)state;
    check_format(&FMT_BF16);
}
static void test_f16_exhaustive(void **state) {
    (void)state;
    check_format(&FMT_F16);
}
static void test_e4m3_exhaustive(void **state) {
    (void)state;
    check_format(&FMT_E4M3);
}
static void test_e5m2_exhaustive(void **state) {
    (void)state;
    check_format(&FMT_E5M2);
}

static void test_known_values(void **state) {
    (void)state;
    /* e4m3fn */
    assert_int_equal(ap_float_to_fp8_e4m3(1.0f), 0x38);
    assert_int_equal(ap_float_to_fp8_e4m3(-1.0f), 0xb8);
    assert_int_equal(ap_float_to_fp8_e4m3(448.0f), 0x7e);
    assert_int_equal(ap_float_to_fp8_e4m3(464.0f), 0x7e); /* tie 448/480: 448 is even */
    assert_int_equal(ap_float_to_fp8_e4m3(500.0f), 0x7e); /* saturated */
    assert_int_equal(ap_float_to_fp8_e4m3(-1e30f), 0xfe);
    assert_int_equal(ap_float_to_fp8_e4m3(INFINITY), 0x7e);
    assert_int_equal(ap_float_to_fp8_e4m3(-INFINITY), 0xfe);
    assert_int_equal(ap_float_to_fp8_e4m3(NAN), 0x7f);
    assert_int_equal(ap_float_to_fp8_e4m3(0x1p-9f), 0x01);   /* smallest subnormal */
    assert_int_equal(ap_float_to_fp8_e4m3(0x1p-10f), 0x00);  /* tie 0 / 2^-9: to even 0 */
    assert_int_equal(ap_float_to_fp8_e4m3(0x1.8p-9f), 0x02); /* tie 1 / 2 subnormals: to 2 */
    assert_int_equal(ap_float_to_fp8_e4m3(1.0625f), 0x38);   /* tie 1.0 / 1.125: to 1.0 */
    assert_int_equal(ap_float_to_fp8_e4m3(1.1875f), 0x3a);   /* tie 1.125 / 1.25: to 1.25 */
    assert_int_equal(ap_float_to_fp8_e4m3(-0x1p-12f), 0x80); /* underflow keeps the sign */
    assert_true(isnan(ap_fp8_e4m3_to_float(0x7f)) && isnan(ap_fp8_e4m3_to_float(0xff)));
    assert_true(ap_fp8_e4m3_to_float(0x7e) == 448.0f);
    assert_true(ap_fp8_e4m3_to_float(0x08) == 0x1p-6f); /* smallest normal */
    /* e5m2 */
    assert_int_equal(ap_float_to_fp8_e5m2(1.0f), 0x3c);
    assert_int_equal(ap_float_to_fp8_e5m2(57344.0f), 0x7b);
    assert_int_equal(ap_float_to_fp8_e5m2(61440.0f), 0x7b); /* tie to inf, saturated */
    assert_int_equal(ap_float_to_fp8_e5m2(1e6f), 0x7b);
    assert_int_equal(ap_float_to_fp8_e5m2(-INFINITY), 0xfb);
    assert_int_equal(ap_float_to_fp8_e5m2(0x1p-16f), 0x01);
    assert_int_equal(ap_float_to_fp8_e5m2(0x1p-17f), 0x00);
    assert_true(isnan(ap_fp8_e5m2_to_float(ap_float_to_fp8_e5m2(NAN))));
    assert_true(isinf(ap_fp8_e5m2_to_float(0x7c)));
    /* bf16 */
    assert_int_equal(ap_float_to_bf16(1.0f), 0x3f80);
    assert_int_equal(ap_float_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie: to even */
    assert_int_equal(ap_float_to_bf16(1.0f + 0x3p-8f), 0x3f82); /* tie: to even, up */
    assert_int_equal(ap_float_to_bf16(NAN), 0x7fff);
    assert_int_equal(ap_float_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(ap_float_to_bf16(3.4e38f), 0x7f80); /* past bf16's largest + half ulp */
    /* f16 */
    assert_int_equal(ap_float_to_f16(1.0f), 0x3c00);
    assert_int_equal(ap_float_to_f16(65504.0f), 0x7bff);
    assert_int_equal(ap_float_to_f16(65519.996f), 0x7bff);
    assert_int_equal(ap_float_to_f16(65520.0f), 0x7c00); /* tie: to inf */
    assert_int_equal(ap_float_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(ap_float_to_f16(0x1p-25f), 0x0000);
    assert_int_equal(ap_float_to_f16(0x1.8p-25f), 0x0001);
    assert_int_equal(ap_float_to_f16(0x1.8p-24f), 0x0002); /* tie 1/2 subnormals: to 2 */
    assert_int_equal(ap_float_to_f16(NAN), 0x7fff);
    assert_int_equal(ap_float_to_f16(-0.0f), 0x8000);
    assert_true(ap_f16_to_float(0x0001) == 0x1p-24f);
    /* NaN payloads of the 16-bit formats survive decoding */
    uint32_t bits;
    float nan_f16 = ap_f16_to_float(0x7e01);
    memcpy(&bits, &nan_f16, 4);
    assert_int_equal(bits, 0x7fc02000u);
}

int main(void) {
    fx_seed_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_values),    cmocka_unit_test(test_e4m3_exhaustive),
        cmocka_unit_test(test_e5m2_exhaustive), cmocka_unit_test(test_f16_exhaustive),
        cmocka_unit_test(test_bf16_exhaustive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
