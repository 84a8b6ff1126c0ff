/* test_load.c: every broken fixture is refused with the right status and reason; good ones load. */
#include <dlfcn.h>

#include "test_support.h"

/* The expected messages below spell the versions out; revisit them when the ABI moves. */
_Static_assert(AP_ABI_VERSION_MAJOR == 1 && AP_ABI_VERSION_MINOR == 1, "update expected versions");

/* What must become of each file of the broken folder, in sorted file-name order. The causes are
 * substrings the message must hold besides the file's own path. */
typedef struct expected_record {
    const char *file;
    ap_status status;
    const char *backend; /* NULL: refused before the name was trusted */
    const char *causes[3];
} expected_record;

static const expected_record broken_expected[] = {
    {"bad_name.so", AP_ERR_ABI_MISMATCH, NULL, {"'Bad-Name'", "[a-z0-9_]+"}},
    {"create_fails.so", AP_OK, "create_fails", {NULL}},
    {"dup_a.so", AP_OK, "dup", {NULL}},
    {"dup_b.so", AP_ERR_DUPLICATE, "dup", {"backend 'dup'", "already provided by", "/dup_a.so]"}},
    {"good.so", AP_OK, "good", {NULL}},
    {"missing_dep.so", AP_ERR_LOAD, NULL, {"libap_absent_dep.so.1", "cannot open"}},
    {"negotiate_fails.so",
     AP_ERR_ABI_MISMATCH,
     NULL,
     {"refused the ABI negotiation", "core offers 1.1", "fixture refuses every core on purpose"}},
    {"newer_minor.so",
     AP_ERR_ABI_MISMATCH,
     NULL,
     {"serves ABI 1.2", "core offers 1.1", "minor version is newer"}},
    {"no_entry.so", AP_ERR_MISSING_SYMBOL, NULL, {"no entry point [ap_plugin_negotiate]"}},
    {"not_elf.so", AP_ERR_LOAD, NULL, {"not an ELF file"}},
    {"null_decode.so", AP_ERR_MISSING_SYMBOL, NULL, {"required entry 'forward_decode' is NULL"}},
    {"small_vtable.so",
     AP_ERR_MISSING_SYMBOL,
     NULL,
     {"vtable struct_size", "too small", "'forward_decode'"}},
    {"wrong_major.so",
     AP_ERR_ABI_MISMATCH,
     NULL,
     {"serves ABI 2.1", "core offers 1.1", "major versions differ"}},
};
#define BROKEN_COUNT (sizeof broken_expected / sizeof broken_expected[0])

static void check_record(const ap_file_record *record, const char *dir,
                         const expected_record *expected) {
    const char *path = test_path(dir, expected->file);
    assert_string_equal(record->path, path);
    if (record->status != expected->status)
        fail_msg("[%s]: status %s, expected %s (%s)", path, ap_status_name(record->status),
                 ap_status_name(expected->status), record->message);
    if (expected->backend == NULL)
        assert_null(record->backend);
    else
        assert_string_equal(record->backend, expected->backend);
    if (expected->status == AP_OK) {
        assert_string_equal(record->message, "");
        return;
    }
    /* Every refusal names the file, between brackets, and the cause. */
    char bracketed[4200];
    snprintf(bracketed, sizeof bracketed, "[%s]", path);
    assert_contains(record->message, bracketed);
    for (size_t i = 0; i < 3 && expected->causes[i] != NULL; i++)
        assert_contains(record->message, expected->causes[i]);
}

static void test_broken_folder_records(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_BROKEN_DIR");
    ap_registry *registry = test_registry_scanned(&dir, 1);
    /* versioned.so.1 does not end in ".so": it is not a record at all. */
    assert_int_equal(ap_registry_file_count(registry), BROKEN_COUNT);
    for (size_t i = 0; i < BROKEN_COUNT; i++) {
        ap_file_record record;
        assert_int_equal(ap_registry_file(registry, i, &record), AP_OK);
        check_record(&record, dir, &broken_expected[i]);
    }
    assert_false(test_has_record(registry, test_path(dir, "versioned.so.1")));
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

static void test_good_backends_load_sorted(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_BROKEN_DIR");
    ap_registry *registry = test_registry_scanned(&dir, 1);
    static const char *const names[] = {"create_fails", "dup", "good"};
    assert_int_equal(ap_registry_backend_count(registry), 3);
    for (size_t i = 0; i < 3; i++)
        assert_string_equal(ap_registry_backend(registry, i)->name, names[i]);
    assert_null(ap_registry_backend(registry, 3));
    assert_contains(ap_last_error(), "out of range");

    const ap_descriptor *good = ap_registry_find(registry, "good");
    assert_non_null(good);
    assert_string_equal(good->version, "0.0.1");
    assert_string_equal(good->description, "test fixture good");
    assert_int_equal(good->caps->device_kinds, AP_DEVICE_KIND_CPU);
    assert_string_equal(ap_registry_backend_path(registry, "good"), test_path(dir, "good.so"));
    assert_string_equal(ap_registry_backend_path(registry, "dup"), test_path(dir, "dup_a.so"));

    /* The loaded plugin's code runs: the process carried on past every broken file. */
    ap_model model = {
        .struct_size = sizeof model, .num_kv_heads = 4, .head_dim_qk = 64, .page_size = 16};
    ap_backend *backend = NULL;
    char text[128];
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    assert_int_equal(good->vtable->create(&model, NULL, NULL, &backend, &msg), AP_OK);
    ap_kv_spec spec;
    assert_int_equal(good->vtable->get_kv_spec(backend, &spec, &msg), AP_OK);
    assert_int_equal(spec.k_bytes_per_page, 16 * 4 * 64 * 2);
    good->vtable->destroy(backend);

    static const char *const refused[] = {"no_entry",    "wrong_major", "null_decode", "Bad-Name",
                                          "missing_dep", "versioned",   "small_vtable"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        assert_null(ap_registry_find(registry, refused[i]));
        char expected[128];
        snprintf(expected, sizeof expected, "no backend named '%s'", refused[i]);
        assert_contains(ap_last_error(), expected);
    }
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* Scanning again loads nothing new and changes no record. */
static void test_scan_twice(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_BROKEN_DIR");
    ap_registry *registry = test_registry_scanned(&dir, 1);
    const ap_descriptor *good = ap_registry_find(registry, "good");
    assert_int_equal(ap_registry_scan(registry), AP_OK);
    assert_int_equal(ap_registry_file_count(registry), BROKEN_COUNT);
    assert_int_equal(ap_registry_backend_count(registry), 3);
    for (size_t i = 0; i < BROKEN_COUNT; i++) {
        ap_file_record record;
        assert_int_equal(ap_registry_file(registry, i, &record), AP_OK);
        check_record(&record, dir, &broken_expected[i]);
    }
    /* Descriptors stay where they were: hosts may hold them until destroy. */
    assert_ptr_equal(ap_registry_find(registry, "good"), good);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* One file by path: its status comes back with the reason in the last error. */
static void test_load_file(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_BROKEN_DIR");
    ap_registry *registry = test_registry(NULL, 0, AP_REGISTRY_NO_DEFAULT_PATHS);
    const char *no_entry = test_path(dir, "no_entry.so");
    assert_int_equal(ap_registry_load_file(registry, no_entry), AP_ERR_MISSING_SYMBOL);
    char expected[4200];
    snprintf(expected, sizeof expected,
             "no entry point [ap_plugin_negotiate] in shared library [%s]", no_entry);
    assert_string_equal(ap_last_error(), expected);

    /* Asking again answers from the record, with the same reason. */
    assert_int_equal(ap_registry_load_file(registry, no_entry), AP_ERR_MISSING_SYMBOL);
    assert_string_equal(ap_last_error(), expected);

    assert_int_equal(ap_registry_load_file(registry, test_path(dir, "good.so")), AP_OK);
    assert_string_equal(ap_last_error(), "");
    assert_int_equal(ap_registry_load_file(registry, test_path(dir, "good.so")), AP_OK);

    /* A name that does not end in ".so" loads when named explicitly. */
    assert_int_equal(ap_registry_load_file(registry, test_path(dir, "versioned.so.1")), AP_OK);

    const char *absent = test_path(dir, "absent_file.so");
    assert_int_equal(ap_registry_load_file(registry, absent), AP_ERR_LOAD);
    assert_contains(ap_last_error(), absent);
    assert_contains(ap_last_error(), "No such file");

    assert_int_equal(ap_registry_file_count(registry), 4);
    assert_int_equal(ap_registry_backend_count(registry), 2);
    assert_string_equal(ap_registry_backend(registry, 0)->name, "good");
    assert_string_equal(ap_registry_backend(registry, 1)->name, "versioned");
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* Two folders: the second's backends join the sorted list, a name taken first stays taken. */
static void test_two_folders(void **state) {
    (void)state;
    const char *dirs[] = {test_dir("AP_TEST_BROKEN_DIR"), test_dir("AP_TEST_SECOND_DIR")};
    ap_registry *registry = test_registry_scanned(dirs, 2);
    static const char *const names[] = {"alpha", "create_fails", "dup", "good"};
    assert_int_equal(ap_registry_backend_count(registry), 4);
    for (size_t i = 0; i < 4; i++)
        assert_string_equal(ap_registry_backend(registry, i)->name, names[i]);
    assert_int_equal(ap_registry_file_count(registry), BROKEN_COUNT + 2);
    ap_file_record shadow = test_record(registry, test_path(dirs[1], "shadow.so"));
    assert_int_equal(shadow.status, AP_ERR_DUPLICATE);
    assert_string_equal(shadow.backend, "good");
    char first[4200];
    snprintf(first, sizeof first, "already provided by [%s]", test_path(dirs[0], "good.so"));
    assert_contains(shadow.message, first);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

static void test_null_arguments(void **state) {
    (void)state;
    ap_registry *registry = test_registry(NULL, 0, AP_REGISTRY_NO_DEFAULT_PATHS);
    ap_file_record record;

    assert_int_equal(ap_registry_create(NULL, NULL), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "out is NULL");
    ap_registry *other = (ap_registry *)&record; /* must be overwritten with NULL on failure */
    ap_registry_options small = {4, NULL, 0, 0};
    assert_int_equal(ap_registry_create(&small, &other), AP_ERR_INVALID_ARGUMENT);
    assert_null(other);
    assert_contains(ap_last_error(), "struct_size 4");
    ap_registry_options no_dirs = {sizeof no_dirs, NULL, 2, 0};
    assert_int_equal(ap_registry_create(&no_dirs, &other), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "search_dirs is NULL");
    const char *holes[] = {"a", NULL};
    ap_registry_options with_hole = {sizeof with_hole, holes, 2, 0};
    assert_int_equal(ap_registry_create(&with_hole, &other), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "search_dirs[1] is NULL");

    assert_int_equal(ap_registry_add_dir(NULL, "x"), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "registry is NULL");
    assert_int_equal(ap_registry_add_dir(registry, NULL), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "dir is NULL");
    assert_int_equal(ap_registry_add_dir(registry, ""), AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_registry_scan(NULL), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "ap_registry_scan");
    assert_int_equal(ap_registry_load_file(NULL, "x.so"), AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_registry_load_file(registry, NULL), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "path is NULL");
    assert_int_equal(ap_registry_destroy(NULL), AP_ERR_INVALID_ARGUMENT);

    assert_int_equal(ap_registry_file_count(NULL), 0);
    assert_contains(ap_last_error(), "registry is NULL");
    assert_int_equal(ap_registry_file(NULL, 0, &record), AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_registry_file(registry, 0, NULL), AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_registry_file(registry, 0, &record), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "out of range");
    assert_int_equal(ap_registry_backend_count(NULL), 0);
    assert_null(ap_registry_backend(NULL, 0));
    assert_null(ap_registry_find(NULL, "good"));
    assert_contains(ap_last_error(), "registry is NULL");
    assert_null(ap_registry_find(registry, NULL));
    assert_contains(ap_last_error(), "name is NULL");
    assert_null(ap_registry_backend_path(registry, NULL));
    assert_null(ap_registry_backend_path(NULL, "good"));
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* An empty registry and an empty scan are fine; a folder that does not exist is skipped. */
static void test_missing_folder(void **state) {
    (void)state;
    const char *dirs[] = {test_path(test_dir("AP_TEST_BROKEN_DIR"), "no_such_folder"),
                          test_dir("AP_TEST_SECOND_DIR")};
    ap_registry *registry = test_registry_scanned(dirs, 2);
    assert_int_equal(ap_registry_file_count(registry), 2);
    assert_int_equal(ap_registry_backend_count(registry), 2);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);

    ap_registry *empty = NULL;
    assert_int_equal(ap_registry_create(NULL, &empty), AP_OK);
    assert_int_equal(ap_registry_backend_count(empty), 0);
    assert_int_equal(ap_registry_destroy(empty), AP_OK);
}

/* Whether the process has `path` mapped, without mapping it. */
static int is_mapped(const char *path) {
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) return 0;
    dlclose(handle); /* drop the reference RTLD_NOLOAD just took */
    return 1;
}

/* Refused files are unmapped at once; loaded ones stay until the registry goes. */
static void test_unmapping(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_BROKEN_DIR");
    ap_registry *registry = test_registry_scanned(&dir, 1);
    for (size_t i = 0; i < BROKEN_COUNT; i++) {
        const char *path = test_path(dir, broken_expected[i].file);
        if (is_mapped(path) != (broken_expected[i].status == AP_OK))
            fail_msg("[%s] is %smapped after the scan", path, is_mapped(path) ? "" : "not ");
    }
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
    for (size_t i = 0; i < BROKEN_COUNT; i++)
        if (is_mapped(test_path(dir, broken_expected[i].file)))
            fail_msg("[%s] is still mapped after destroy", test_path(dir, broken_expected[i].file));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_broken_folder_records),
        cmocka_unit_test(test_good_backends_load_sorted),
        cmocka_unit_test(test_scan_twice),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_two_folders),
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_missing_folder),
        cmocka_unit_test(test_unmapping),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
