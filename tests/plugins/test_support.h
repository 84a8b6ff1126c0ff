/* test_support.h: fixture folders, registries over them and record lookups for the plugin tests. */
#ifndef AP_TEST_SUPPORT_H
#define AP_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "attnplug.h"
#include "tests/common/test_model.h"

/* A folder the build passes through the environment (tests/plugins/meson.build). */
static inline const char *test_dir(const char *variable) {
    const char *dir = getenv(variable);
    if (dir == NULL || dir[0] == '\0') fail_msg("%s is not set: run through meson test", variable);
    return dir;
}

/* "dir/name" in a static buffer of one of four slots (enough for one assertion's operands). */
static inline const char *test_path(const char *dir, const char *name) {
    static char slots[4][4096];
    static int next;
    char *slot = slots[next++ % 4];
    snprintf(slot, sizeof slots[0], "%s/%s", dir, name);
    return slot;
}

/* A registry over exactly these folders: no environment, install or build-tree folders. */
static inline ap_registry *test_registry(const char *const *dirs, size_t count, uint32_t flags) {
    ap_registry_options options = {sizeof options, dirs, count, flags};
    ap_registry *registry = NULL;
    assert_int_equal(ap_registry_create(&options, &registry), AP_OK);
    assert_non_null(registry);
    return registry;
}

static inline ap_registry *test_registry_scanned(const char *const *dirs, size_t count) {
    ap_registry *registry = test_registry(dirs, count, AP_REGISTRY_NO_DEFAULT_PATHS);
    assert_int_equal(ap_registry_scan(registry), AP_OK);
    return registry;
}

/* The record of the file at `path`, failing the test when there is none. */
static inline ap_file_record test_record(const ap_registry *registry, const char *path) {
    ap_file_record record;
    for (size_t i = 0; i < ap_registry_file_count(registry); i++) {
        assert_int_equal(ap_registry_file(registry, i, &record), AP_OK);
        if (strcmp(record.path, path) == 0) return record;
    }
    fail_msg("no record for [%s]", path);
    return record;
}

static inline int test_has_record(const ap_registry *registry, const char *path) {
    ap_file_record record;
    for (size_t i = 0; i < ap_registry_file_count(registry); i++) {
        assert_int_equal(ap_registry_file(registry, i, &record), AP_OK);
        if (strcmp(record.path, path) == 0) return 1;
    }
    return 0;
}

/* A small GQA model every fixture plugin accepts: bf16, page 16, one layer. */
static inline ap_model test_fixture_model(void) {
    ap_model model = ap_test_model("fixture-model", 8, 2, 64, 64, AP_DTYPE_BF16, AP_DTYPE_BF16);
    model.num_layers = 1;
    return model;
}

/* Entries named like plugins that no loader can open, and what the scan must say of each. */
static const struct {
    const char *name;
    const char *reason;
} test_odd_entries[] = {
    {"dangling.so", "a dangling symbolic link (its target does not exist)"},
    {"fifo.so", "a FIFO, not a regular file"},
    {"folder.so", "a folder, not a plugin file"},
    {"loop.so", "a symbolic link loop"},
};
#define TEST_ODD_COUNT (sizeof test_odd_entries / sizeof test_odd_entries[0])

/* A fresh folder holding the entries above; test_odd_dir_remove deletes it. */
static inline char *test_odd_dir_make(void) {
    char *dir = strdup("/tmp/ap-test-odd-XXXXXX");
    if (dir == NULL || mkdtemp(dir) == NULL) fail_msg("cannot make a temporary folder");
    char path[4096], target[4096];
    snprintf(path, sizeof path, "%s/dangling.so", dir);
    snprintf(target, sizeof target, "%s/no_such_target.so", dir);
    if (symlink(target, path) != 0) fail_msg("symlink [%s]", path);
    snprintf(path, sizeof path, "%s/fifo.so", dir);
    if (mkfifo(path, 0600) != 0) fail_msg("mkfifo [%s]", path);
    snprintf(path, sizeof path, "%s/folder.so", dir);
    if (mkdir(path, 0700) != 0) fail_msg("mkdir [%s]", path);
    snprintf(path, sizeof path, "%s/loop.so", dir);
    if (symlink("loop.so", path) != 0) fail_msg("symlink [%s]", path);
    return dir;
}

static inline void test_odd_dir_remove(char *dir) {
    char path[4096];
    for (size_t i = 0; i < TEST_ODD_COUNT; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, test_odd_entries[i].name);
        if (unlink(path) != 0) rmdir(path);
    }
    rmdir(dir);
    free(dir);
}

#define assert_contains(haystack, needle) \
    do { \
        const char *ap_haystack_ = (haystack), *ap_needle_ = (needle); \
        if (ap_haystack_ == NULL || strstr(ap_haystack_, ap_needle_) == NULL) \
            fail_msg("expected \"%s\" to contain \"%s\"", ap_haystack_ ? ap_haystack_ : "(null)", \
                     ap_needle_); \
    } while (0)

#endif /* AP_TEST_SUPPORT_H */
