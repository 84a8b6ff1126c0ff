/* test_log.c: AP_DEBUG=load explains every file taken or refused; other categories stay quiet. */
#include <unistd.h>

#include "test_support.h"

/* The expected messages below spell the versions out; revisit them when the ABI moves. */
_Static_assert(AP_ABI_VERSION_MAJOR == 1 && AP_ABI_VERSION_MINOR == 1, "update expected versions");

/* Run a scan of two folders with stderr captured; return what it said. */
static char *scan_capturing_stderr(const char *dir, const char *missing) {
    FILE *capture = tmpfile();
    assert_non_null(capture);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(capture), STDERR_FILENO) >= 0);
    const char *dirs[] = {dir, missing};
    ap_registry *registry = test_registry(dirs, 2, AP_REGISTRY_NO_DEFAULT_PATHS);
    ap_status status = ap_registry_scan(registry);
    ap_registry_destroy(registry);
    fflush(stderr);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    assert_int_equal(status, AP_OK);

    long size = ftell(capture);
    assert_true(size >= 0);
    char *text = calloc(1, (size_t)size + 1);
    assert_non_null(text);
    rewind(capture);
    assert_int_equal(fread(text, 1, (size_t)size, capture), (size_t)size);
    fclose(capture);
    return text;
}

static void test_load_category(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_BROKEN_DIR");
    const char *missing = test_path(dir, "no_such_folder");
    char *text = scan_capturing_stderr(dir, missing);
    char line[8192];
    snprintf(line, sizeof line, "attnplug[load]: skipping folder [%s]: No such file or directory\n",
             missing);
    assert_contains(text, line);
    snprintf(line, sizeof line, "attnplug[load]: loaded backend 'good' 0.0.1 (ABI 1.1) from [%s]\n",
             test_path(dir, "good.so"));
    assert_contains(text, line);
    snprintf(line, sizeof line,
             "attnplug[load]: refused [%s]: AP_ERR_MISSING_SYMBOL: no entry point "
             "[ap_plugin_negotiate] in shared library [%s]\n",
             test_path(dir, "no_entry.so"), test_path(dir, "no_entry.so"));
    assert_contains(text, line);
    /* One line per file of the folder, taken or refused. */
    static const char *const files[] = {
        "bad_name.so",    "create_fails.so",    "dup_a.so",       "dup_b.so",    "good.so",
        "missing_dep.so", "negotiate_fails.so", "newer_minor.so", "no_entry.so", "not_elf.so",
        "null_decode.so", "small_vtable.so",    "wrong_major.so"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(line, sizeof line, "[%s]", test_path(dir, files[i]));
        assert_contains(text, line);
    }
    free(text);
}

/* Entries the scan skips are explained too, one line each with the reason. */
static void test_load_category_skips(void **state) {
    (void)state;
    char *dir = test_odd_dir_make();
    char *text = scan_capturing_stderr(dir, test_dir("AP_TEST_SECOND_DIR"));
    char line[8192];
    for (size_t i = 0; i < TEST_ODD_COUNT; i++) {
        snprintf(line, sizeof line, "attnplug[load]: skipped [%s]: %s\n",
                 test_path(dir, test_odd_entries[i].name), test_odd_entries[i].reason);
        assert_contains(text, line);
    }
    free(text);
    test_odd_dir_remove(dir);
}

static void test_quiet_without_load(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_BROKEN_DIR");
    char *text = scan_capturing_stderr(dir, test_path(dir, "no_such_folder"));
    assert_string_equal(text, "");
    free(text);
}

/* The same program runs twice (tests/plugins/meson.build): with AP_DEBUG='instance, load ,select'
 * it must explain the scan, with AP_DEBUG=select,config,instance it must say nothing. */
int main(int argc, char **argv) {
    int expect_load = argc > 1 && strcmp(argv[1], "load") == 0;
    const struct CMUnitTest loud[] = {cmocka_unit_test(test_load_category),
                                      cmocka_unit_test(test_load_category_skips)};
    const struct CMUnitTest quiet[] = {cmocka_unit_test(test_quiet_without_load)};
    return expect_load ? cmocka_run_group_tests(loud, NULL, NULL)
                       : cmocka_run_group_tests(quiet, NULL, NULL);
}
