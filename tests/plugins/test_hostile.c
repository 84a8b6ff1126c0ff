/* test_hostile.c: plugins that lie or say hostile things: every word kept is escaped and capped. */
#include "test_support.h"

/* No byte a terminal acts on: no C0 control (optionally but '\n'), no DEL. */
static void assert_printable(const char *text, int newlines_allowed) {
    for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; p++) {
        if ((*p < 0x20 && !(newlines_allowed && *p == '\n')) || *p == 0x7f)
            fail_msg("byte 0x%02x at %zu of \"%s\"", *p, (size_t)(p - (const unsigned char *)text),
                     text);
    }
}

static ap_registry *hostile_registry(void) {
    const char *dir = test_dir("AP_TEST_HOSTILE_DIR");
    return test_registry_scanned(&dir, 1);
}

static ap_device hostile_cpu(void) {
    ap_device cpu;
    ap_device_cpu(&cpu, "no GPU in this test");
    return cpu;
}

static ap_model hostile_model(int32_t page_size) {
    ap_model model = test_fixture_model();
    model.page_size = page_size;
    return model;
}

/* Descriptors with hostile text are refused at load, the text shown escaped in the record. */
static void test_hostile_descriptors(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_HOSTILE_DIR");
    ap_registry *registry = hostile_registry();
    ap_file_record name = test_record(registry, test_path(dir, "ctrl_name.so"));
    assert_int_equal(name.status, AP_ERR_ABI_MISMATCH);
    assert_contains(name.message, "backend name 'evil\\n\\x1b[31mname\\x07' is not of the form");
    ap_file_record description = test_record(registry, test_path(dir, "ctrl_description.so"));
    assert_int_equal(description.status, AP_ERR_ABI_MISMATCH);
    assert_contains(description.message, "has a description holding control bytes or invalid "
                                         "UTF-8 ('fine\\r\\x1b[2Jforged line\\n')");
    ap_file_record long_name = test_record(registry, test_path(dir, "long_name.so"));
    assert_int_equal(long_name.status, AP_ERR_ABI_MISMATCH);
    assert_contains(long_name.message, "is 10240 bytes long, more than the 64 allowed");
    assert_true(strlen(long_name.message) < 512);
    for (size_t i = 0; i < ap_registry_file_count(registry); i++) {
        ap_file_record record;
        assert_int_equal(ap_registry_file(registry, i, &record), AP_OK);
        assert_printable(record.message, 0);
    }
    /* The three that behave at load are loaded; the hostile names are not. */
    assert_int_equal(ap_registry_backend_count(registry), 3);
    assert_non_null(ap_registry_find(registry, "create_null"));
    assert_non_null(ap_registry_find(registry, "create_odd_status"));
    assert_non_null(ap_registry_find(registry, "ctrl_messages"));
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* create() saying AP_OK without an instance, or a status that is none: AP_ERR_INTERNAL. */
static void test_create_lies(void **state) {
    (void)state;
    ap_registry *registry = hostile_registry();
    ap_device cpu = hostile_cpu();
    ap_model model = hostile_model(16);
    ap_instance *instance = (ap_instance *)(uintptr_t)1;
    assert_int_equal(ap_instance_open(registry, "create_null", &model, NULL, &cpu, &instance),
                     AP_ERR_INTERNAL);
    assert_null(instance);
    assert_string_equal(ap_last_error(),
                        "backend 'create_null': create returned AP_OK but no instance (NULL)");
    assert_int_equal(ap_instance_open(registry, "create_odd_status", &model, NULL, &cpu, &instance),
                     AP_ERR_INTERNAL);
    assert_null(instance);
    assert_string_equal(ap_last_error(),
                        "backend 'create_odd_status': create returned status 12345, which is no "
                        "ap_status: fixture 'create_odd_status' answers a status no core knows");
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* validate() and create() messages with ESC, BEL, CR and newlines reach the verdict and the
 * last error escaped: one reason per line the plugin added, nothing a terminal acts on. */
static void test_hostile_messages(void **state) {
    (void)state;
    ap_registry *registry = hostile_registry();
    ap_device cpu = hostile_cpu();
    ap_model model = hostile_model(8);
    ap_verdict verdict;
    assert_int_equal(ap_registry_check(registry, "ctrl_messages", &model, NULL, &cpu, &verdict),
                     AP_ERR_REFUSED);
    assert_string_equal(verdict.reasons, "page size 8: bad\n"
                                         "\\x1b[31mforged: all good\\x1b[0m\\x07\\r\\x1b[2J");
    assert_printable(verdict.reasons, 1);
    assert_printable(ap_last_error(), 0);
    assert_contains(ap_last_error(), "page size 8: bad; \\x1b[31mforged");

    model = hostile_model(16);
    ap_instance *instance = NULL;
    assert_int_equal(ap_instance_open(registry, "ctrl_messages", &model, NULL, &cpu, &instance),
                     AP_ERR_REFUSED);
    assert_string_equal(ap_last_error(),
                        "backend 'ctrl_messages': create failed: create: bad; "
                        "\\x1b[31mforged: all good\\x1b[0m\\x07\\r\\x1b[2J; second line");
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* The escape itself: what is kept, what is escaped, and the cap. */
static void test_text_escape(void **state) {
    (void)state;
    char out[32];
    assert_int_equal(ap_text_escape("plain text", out, sizeof out), 0);
    assert_string_equal(out, "plain text");
    /* Well-formed UTF-8 stays; C1 controls (U+009B, CSI), lone and overlong bytes do not. */
    assert_int_equal(ap_text_escape("caf\xc3\xa9 \xe2\x86\x92 ok", out, sizeof out), 0);
    assert_string_equal(out, "caf\xc3\xa9 \xe2\x86\x92 ok");
    assert_int_equal(ap_text_escape("a\xc2\x9b"
                                    "b\xff\xc0\xafz",
                                    out, sizeof out),
                     1);
    assert_string_equal(out, "a\\xc2\\x9bb\\xff\\xc0\\xafz");
    assert_int_equal(ap_text_escape("\t\x7f\x01", out, sizeof out), 1);
    assert_string_equal(out, "\\t\\x7f\\x01");
    /* Cut: 40 characters into 32 bytes: 28 kept, then "...". Exactly 31 fit without a mark. */
    const char *forty = "0123456789012345678901234567890123456789";
    assert_int_equal(ap_text_escape(forty, out, sizeof out), 1);
    assert_string_equal(out, "0123456789012345678901234567...");
    assert_int_equal(ap_text_escape("0123456789012345678901234567890", out, sizeof out), 0);
    assert_string_equal(out, "0123456789012345678901234567890");
    /* An escape is never split by the cut. */
    char small[8];
    assert_int_equal(ap_text_escape("ab\x1b\x1b\x1b", small, sizeof small), 1);
    assert_string_equal(small, "ab...");
    char tiny[2];
    assert_int_equal(ap_text_escape("abc", tiny, sizeof tiny), 1);
    assert_string_equal(tiny, ".");
    assert_int_equal(ap_text_escape(NULL, out, sizeof out), 0);
    assert_string_equal(out, "");
    assert_int_equal(ap_text_escape("x", NULL, 4), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_descriptors),
        cmocka_unit_test(test_create_lies),
        cmocka_unit_test(test_hostile_messages),
        cmocka_unit_test(test_text_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
