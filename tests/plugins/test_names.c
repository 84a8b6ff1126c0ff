/* test_names.c: names of statuses, dtypes and attention kinds, dtype parsing, the ABI version. */
#include "test_support.h"

static void test_status_names(void **state) {
    (void)state;
    /* Written out by hand: the table in names.c must agree with plugin_api.h's numbering. */
    static const struct {
        ap_status status;
        int value;
        const char *name;
    } expected[] = {
        {AP_OK, 0, "AP_OK"},
        {AP_ERR_INVALID_ARGUMENT, 1, "AP_ERR_INVALID_ARGUMENT"},
        {AP_ERR_SHAPE_MISMATCH, 2, "AP_ERR_SHAPE_MISMATCH"},
        {AP_ERR_UNSUPPORTED, 3, "AP_ERR_UNSUPPORTED"},
        {AP_ERR_ABI_MISMATCH, 4, "AP_ERR_ABI_MISMATCH"},
        {AP_ERR_LOAD, 5, "AP_ERR_LOAD"},
        {AP_ERR_MISSING_SYMBOL, 6, "AP_ERR_MISSING_SYMBOL"},
        {AP_ERR_NOT_FOUND, 7, "AP_ERR_NOT_FOUND"},
        {AP_ERR_OUT_OF_MEMORY, 8, "AP_ERR_OUT_OF_MEMORY"},
        {AP_ERR_CONFIG, 9, "AP_ERR_CONFIG"},
        {AP_ERR_NO_DEVICE, 10, "AP_ERR_NO_DEVICE"},
        {AP_ERR_CUDA, 11, "AP_ERR_CUDA"},
        {AP_ERR_REFUSED, 12, "AP_ERR_REFUSED"},
        {AP_ERR_DUPLICATE, 13, "AP_ERR_DUPLICATE"},
        {AP_ERR_INTERNAL, 14, "AP_ERR_INTERNAL"},
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        assert_int_equal((int)expected[i].status, expected[i].value);
        assert_string_equal(ap_status_name(expected[i].status), expected[i].name);
    }
    assert_string_equal(ap_status_name((ap_status)15), "AP_ERR_UNKNOWN");
    assert_string_equal(ap_status_name((ap_status)-1), "AP_ERR_UNKNOWN");
}

static void test_dtype_names_and_sizes(void **state) {
    (void)state;
    static const struct {
        ap_dtype dtype;
        const char *name;
        size_t bits;
    } expected[] = {
        {AP_DTYPE_NONE, "none", 0},         {AP_DTYPE_F32, "f32", 32},
        {AP_DTYPE_BF16, "bf16", 16},        {AP_DTYPE_F16, "f16", 16},
        {AP_DTYPE_FP8_E4M3, "fp8_e4m3", 8}, {AP_DTYPE_FP8_E5M2, "fp8_e5m2", 8},
        {AP_DTYPE_NVFP4, "nvfp4", 4},
    };
    assert_int_equal(sizeof expected / sizeof expected[0], AP_DTYPE_COUNT);
    for (size_t i = 0; i < AP_DTYPE_COUNT; i++) {
        assert_string_equal(ap_dtype_str(expected[i].dtype), expected[i].name);
        assert_int_equal(ap_dtype_size_bits(expected[i].dtype), expected[i].bits);
        ap_dtype parsed = (ap_dtype)99;
        assert_int_equal(ap_dtype_parse(expected[i].name, &parsed), AP_OK);
        assert_int_equal(parsed, expected[i].dtype);
    }
    assert_string_equal(ap_dtype_str((ap_dtype)AP_DTYPE_COUNT), "unknown");
    assert_string_equal(ap_dtype_str((ap_dtype)-1), "unknown");
    assert_int_equal(ap_dtype_size_bits((ap_dtype)AP_DTYPE_COUNT), 0);
}

static void test_dtype_aliases(void **state) {
    (void)state;
    static const struct {
        const char *name;
        ap_dtype dtype;
    } aliases[] = {
        {"fp8", AP_DTYPE_FP8_E4M3},      {"float16", AP_DTYPE_F16},   {"fp16", AP_DTYPE_F16},
        {"half", AP_DTYPE_F16},          {"bfloat16", AP_DTYPE_BF16}, {"BF16", AP_DTYPE_BF16},
        {"FP8_E5M2", AP_DTYPE_FP8_E5M2},
    };
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        ap_dtype parsed = AP_DTYPE_NONE;
        assert_int_equal(ap_dtype_parse(aliases[i].name, &parsed), AP_OK);
        assert_int_equal(parsed, aliases[i].dtype);
    }
}

static void test_dtype_parse_rejects(void **state) {
    (void)state;
    static const char *const bad[] = {"", "fp9", "bf", "bf16 ", "fp8_e4m3x", "nvfp"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ap_dtype parsed = AP_DTYPE_BF16;
        assert_int_equal(ap_dtype_parse(bad[i], &parsed), AP_ERR_INVALID_ARGUMENT);
        assert_int_equal(parsed, AP_DTYPE_BF16); /* untouched on failure */
        char quoted[64];
        snprintf(quoted, sizeof quoted, "unknown dtype '%s'", bad[i]);
        assert_contains(ap_last_error(), quoted);
        assert_contains(ap_last_error(), "fp8_e4m3"); /* lists what it knows */
    }
    ap_dtype parsed;
    assert_int_equal(ap_dtype_parse(NULL, &parsed), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "NULL name");
    assert_int_equal(ap_dtype_parse("bf16", NULL), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "NULL out");
}

static void test_attn_kind_and_abi(void **state) {
    (void)state;
    assert_string_equal(ap_attn_kind_name(AP_ATTN_MHA), "mha");
    assert_string_equal(ap_attn_kind_name(AP_ATTN_MLA), "mla");
    assert_string_equal(ap_attn_kind_name((ap_attn_kind)2), "unknown");
    uint32_t major = 99, minor = 99;
    ap_core_abi_version(&major, &minor);
    assert_int_equal(major, AP_ABI_VERSION_MAJOR);
    assert_int_equal(minor, AP_ABI_VERSION_MINOR);
    ap_core_abi_version(NULL, NULL); /* harmless */
}

/* A long message is cut at the buffer, never written past it, and stays a C string. */
static void test_long_error_truncates(void **state) {
    (void)state;
    static char name[8192];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    ap_dtype parsed;
    assert_int_equal(ap_dtype_parse(name, &parsed), AP_ERR_INVALID_ARGUMENT);
    size_t length = strlen(ap_last_error());
    assert_true(length > 1000);
    assert_true(length < sizeof name);
    assert_true(strncmp(ap_last_error(), "unknown dtype 'xxxx", 19) == 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_names),      cmocka_unit_test(test_dtype_names_and_sizes),
        cmocka_unit_test(test_dtype_aliases),     cmocka_unit_test(test_dtype_parse_rejects),
        cmocka_unit_test(test_attn_kind_and_abi), cmocka_unit_test(test_long_error_truncates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
