/* test_arch.c: CUDA's arch rules and pick order, the device query without a GPU, and enum names. */
#include "support.h"

typedef struct arch_case {
    ap_arch_target target;
    int32_t major, minor;
    int runs;
} arch_case;

/* CUDA's rules, case by case: sm_XY on X.Z with Z >= Y; sm_XYa only on X.Y; PTX on >= X.Y. */
static const arch_case arch_cases[] = {
    {{90, AP_ARCH_SASS_SPECIFIC}, 9, 0, 1},
    {{90, AP_ARCH_SASS_SPECIFIC}, 10, 0, 0},
    {{90, AP_ARCH_SASS_SPECIFIC}, 8, 9, 0},
    {{100, AP_ARCH_SASS_SPECIFIC}, 10, 3, 0},
    {{100, AP_ARCH_SASS_SPECIFIC}, 10, 0, 1},
    {{80, AP_ARCH_SASS}, 8, 6, 1},
    {{80, AP_ARCH_SASS}, 8, 0, 1},
    {{80, AP_ARCH_SASS}, 9, 0, 0},
    {{86, AP_ARCH_SASS}, 8, 0, 0},
    {{80, AP_ARCH_SASS}, 7, 5, 0},
    {{90, AP_ARCH_SASS}, 9, 0, 1},
    {{90, AP_ARCH_SASS}, 10, 0, 0},
    {{80, AP_ARCH_PTX}, 9, 0, 1},
    {{80, AP_ARCH_PTX}, 7, 5, 0},
    {{80, AP_ARCH_PTX}, 8, 0, 1},
    {{86, AP_ARCH_PTX}, 8, 0, 0},
    {{90, AP_ARCH_PTX}, 12, 0, 1},
    {{90, AP_ARCH_PTX}, 8, 9, 0},
};

static void test_arch_runs_on_table(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof arch_cases / sizeof arch_cases[0]; i++) {
        const arch_case *c = &arch_cases[i];
        int runs = ap_arch_runs_on(c->target, c->major, c->minor);
        if (runs != c->runs)
            print_error("case %zu: target %d kind %d on %d.%d: got %d, expected %d\n", i,
                        (int)c->target.sm, (int)c->target.kind, (int)c->major, (int)c->minor, runs,
                        c->runs);
        assert_int_equal(runs, c->runs);
    }
}

static void test_arch_runs_on_nonsense(void **state) {
    (void)state;
    assert_false(ap_arch_runs_on((ap_arch_target){90, AP_ARCH_PTX}, 0, 0)); /* the CPU */
    assert_false(ap_arch_runs_on((ap_arch_target){0, AP_ARCH_PTX}, 9, 0));
    assert_false(ap_arch_runs_on((ap_arch_target){90, (ap_arch_kind)7}, 9, 0));
}

static void test_arch_pick_order(void **state) {
    (void)state;
    /* Index:                      0: PTX 80     1: sm_80      2: sm_86     3: sm_90a     4: sm_90      5: PTX 90 */
    const ap_arch_target t[] = {{80, AP_ARCH_PTX},           {80, AP_ARCH_SASS}, {86, AP_ARCH_SASS},
                                {90, AP_ARCH_SASS_SPECIFIC}, {90, AP_ARCH_SASS}, {90, AP_ARCH_PTX}};
    assert_int_equal(ap_arch_pick(t, 6, 8, 6), 2); /* exact SASS over older same-major sm_80 */
    assert_int_equal(ap_arch_pick(t, 6, 8, 9), 2); /* newest same-major SASS that runs */
    assert_int_equal(ap_arch_pick(t, 6, 8, 0), 1); /* exact SASS over PTX of the same arch */
    assert_int_equal(ap_arch_pick(t, 6, 9, 0), 3); /* the 'a' variant on its exact arch */
    assert_int_equal(ap_arch_pick(t, 5, 9, 0), 3);
    assert_int_equal(ap_arch_pick(t, 3, 9, 0), 0);  /* only PTX 80 runs on 9.0 among 0..2 */
    assert_int_equal(ap_arch_pick(t, 6, 10, 0), 5); /* newest PTX when no SASS runs */
    assert_int_equal(ap_arch_pick(t, 6, 7, 5), -1);
    assert_int_equal(ap_arch_pick(t + 3, 2, 9, 0), 0); /* sm_90a before sm_90 */
    assert_int_equal(ap_arch_pick(t + 4, 1, 9, 0), 0);
    assert_int_equal(ap_arch_pick(NULL, 0, 9, 0), -1);
}

/* This machine has no GPU: the query must say so and describe the CPU. On a GPU machine it
 * reads the real device instead. Either way, an absurd ordinal is no device. */
static void test_device_query(void **state) {
    (void)state;
    ap_device d;
    memset(&d, 0x5a, sizeof d);
    ap_status status = ap_device_query(0, &d);
    assert_int_equal(d.struct_size, sizeof d);
    if (status == AP_OK) {
        assert_int_equal(d.ordinal, 0);
        assert_true(d.cc_major >= 3);
        assert_true(d.sm_count > 0);
        assert_string_equal(d.unusable_reason, "");
    } else {
        assert_int_equal(status, AP_ERR_NO_DEVICE);
        assert_int_equal(d.ordinal, -1);
        assert_int_equal(d.cc_major, 0);
        assert_string_equal(d.name, "cpu");
        assert_true(strlen(d.unusable_reason) > 10);
        assert_true(strncmp(d.unusable_reason, "no CUDA driver: ", 16) == 0 ||
                    strncmp(d.unusable_reason, "CUDA driver found but cuInit failed (", 37) == 0 ||
                    strncmp(d.unusable_reason, "no CUDA device 0", 16) == 0);
        assert_string_equal(ap_last_error(), d.unusable_reason);
    }
    TC_ASSERT_FAILS(ap_device_query(4096, &d), AP_ERR_NO_DEVICE, "");
    assert_int_equal(d.ordinal, -1);
    assert_true(d.unusable_reason[0] != '\0');
    TC_ASSERT_FAILS(ap_device_query(-1, &d), AP_ERR_NO_DEVICE, "");
    TC_ASSERT_FAILS(ap_device_query(0, NULL), AP_ERR_INVALID_ARGUMENT, "out is NULL");
}

static void test_device_cpu(void **state) {
    (void)state;
    ap_device d;
    ap_device_cpu(&d, "no GPU here");
    assert_int_equal(d.struct_size, sizeof d);
    assert_int_equal(d.ordinal, -1);
    assert_string_equal(d.name, "cpu");
    assert_string_equal(d.unusable_reason, "no GPU here");
    ap_device_cpu(&d, NULL);
    assert_string_equal(d.unusable_reason, "");
    ap_device_cpu(NULL, "ignored"); /* no crash */
}

static void test_status_names(void **state) {
    (void)state;
    /* Every status has its own name, spelled as its enum constant. */
    const char *expected[] = {"AP_OK",
                              "AP_ERR_INVALID_ARGUMENT",
                              "AP_ERR_SHAPE_MISMATCH",
                              "AP_ERR_UNSUPPORTED",
                              "AP_ERR_ABI_MISMATCH",
                              "AP_ERR_LOAD",
                              "AP_ERR_MISSING_SYMBOL",
                              "AP_ERR_NOT_FOUND",
                              "AP_ERR_OUT_OF_MEMORY",
                              "AP_ERR_CONFIG",
                              "AP_ERR_NO_DEVICE",
                              "AP_ERR_CUDA",
                              "AP_ERR_REFUSED",
                              "AP_ERR_DUPLICATE",
                              "AP_ERR_INTERNAL"};
    for (int s = 0; s <= AP_ERR_INTERNAL; s++)
        assert_string_equal(ap_status_name((ap_status)s), expected[s]);
    assert_non_null(ap_status_name((ap_status)99));
    assert_string_not_equal(ap_status_name((ap_status)99), "AP_OK");
}

static void test_dtype_round_trip(void **state) {
    (void)state;
    for (int d = 0; d < AP_DTYPE_COUNT; d++) {
        ap_dtype parsed = (ap_dtype)-1;
        TC_ASSERT_OK(ap_dtype_parse(ap_dtype_str((ap_dtype)d), &parsed));
        assert_int_equal(parsed, d);
    }
    const size_t bits[AP_DTYPE_COUNT] = {0, 32, 16, 16, 8, 8, 4};
    for (int d = 0; d < AP_DTYPE_COUNT; d++)
        assert_int_equal(ap_dtype_size_bits((ap_dtype)d), bits[d]);
    ap_dtype parsed;
    TC_ASSERT_FAILS(ap_dtype_parse("int4", &parsed), AP_ERR_INVALID_ARGUMENT, "int4");
    assert_string_equal(ap_attn_kind_name(AP_ATTN_MHA), "mha");
    assert_string_equal(ap_attn_kind_name(AP_ATTN_MLA), "mla");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arch_runs_on_table), cmocka_unit_test(test_arch_runs_on_nonsense),
        cmocka_unit_test(test_arch_pick_order),    cmocka_unit_test(test_device_query),
        cmocka_unit_test(test_device_cpu),         cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_dtype_round_trip),
    };
    return cmocka_run_group_tests_name("core.arch", tests, NULL, NULL);
}
