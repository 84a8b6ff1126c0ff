/* test_discover.c: search order, the path variables, AP_BACKENDS_DISABLE and the build tree. */
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_support.h"

#define BROKEN_FILES 13 /* the .so files of the broken folder */

static void env_clear(void) {
    unsetenv("AP_PLUGIN_PATH");
    unsetenv("AP_ADD_PLUGIN_PATH");
    unsetenv("AP_BACKENDS_DISABLE");
}

static int env_reset(void **state) {
    (void)state;
    env_clear();
    return 0;
}

static int starts_with(const char *text, const char *prefix) {
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

/* Host folders come before added ones: the first folder's "good" wins. */
static void test_host_dirs_before_added(void **state) {
    (void)state;
    const char *broken = test_dir("AP_TEST_BROKEN_DIR"), *second = test_dir("AP_TEST_SECOND_DIR");
    ap_registry *registry = test_registry(&second, 1, AP_REGISTRY_NO_DEFAULT_PATHS);
    assert_int_equal(ap_registry_add_dir(registry, broken), AP_OK);
    assert_int_equal(ap_registry_scan(registry), AP_OK);
    assert_string_equal(ap_registry_backend_path(registry, "good"), test_path(second, "shadow.so"));
    ap_file_record loser = test_record(registry, test_path(broken, "good.so"));
    assert_int_equal(loser.status, AP_ERR_DUPLICATE);
    assert_contains(loser.message, test_path(second, "shadow.so"));
    /* Records follow the search order: the second folder's two files come first. */
    ap_file_record first;
    assert_int_equal(ap_registry_file(registry, 0, &first), AP_OK);
    assert_string_equal(first.path, test_path(second, "alpha.so"));
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* One folder under several spellings is searched once. */
static void test_same_folder_twice(void **state) {
    (void)state;
    const char *broken = test_dir("AP_TEST_BROKEN_DIR");
    char slash[4096], dotdot[4096];
    snprintf(slash, sizeof slash, "%s/", broken);
    snprintf(dotdot, sizeof dotdot, "%s/../broken", broken);
    const char *dirs[] = {broken, slash, dotdot};
    ap_registry *registry = test_registry_scanned(dirs, 3);
    assert_int_equal(ap_registry_file_count(registry), BROKEN_FILES);
    for (size_t i = 0; i < BROKEN_FILES; i++) {
        ap_file_record record;
        assert_int_equal(ap_registry_file(registry, i, &record), AP_OK);
        assert_true(starts_with(record.path, broken));
        /* Only the fixture made to clash does: no file clashed with itself. */
        if (record.status == AP_ERR_DUPLICATE)
            assert_string_equal(record.path, test_path(broken, "dup_b.so"));
    }
    assert_int_equal(ap_registry_backend_count(registry), 3);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* AP_PLUGIN_PATH replaces everything after the host folders: AP_ADD_PLUGIN_PATH, the install
 * folder and the build tree are not searched. */
static void test_plugin_path_replaces(void **state) {
    (void)state;
    const char *broken = test_dir("AP_TEST_BROKEN_DIR"), *second = test_dir("AP_TEST_SECOND_DIR");
    char list[8192];
    snprintf(list, sizeof list, "%s::%s", test_path(broken, "no_such_folder"), second);
    setenv("AP_PLUGIN_PATH", list, 1);
    setenv("AP_ADD_PLUGIN_PATH", broken, 1);
    ap_registry *registry = test_registry(NULL, 0, 0);
    assert_int_equal(ap_registry_scan(registry), AP_OK);
    assert_int_equal(ap_registry_file_count(registry), 2);
    ap_file_record record;
    assert_int_equal(ap_registry_file(registry, 0, &record), AP_OK);
    assert_string_equal(record.path, test_path(second, "alpha.so"));
    assert_int_equal(ap_registry_file(registry, 1, &record), AP_OK);
    assert_string_equal(record.path, test_path(second, "shadow.so"));
    assert_int_equal(record.status, AP_OK);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);

    /* Its folders keep their order: "second" before "broken" makes shadow.so the "good". */
    snprintf(list, sizeof list, "%s:%s", second, broken);
    setenv("AP_PLUGIN_PATH", list, 1);
    registry = test_registry(NULL, 0, 0);
    assert_int_equal(ap_registry_scan(registry), AP_OK);
    assert_int_equal(ap_registry_file_count(registry), 2 + BROKEN_FILES);
    assert_string_equal(ap_registry_backend_path(registry, "good"), test_path(second, "shadow.so"));
    assert_int_equal(ap_registry_destroy(registry), AP_OK);

    /* AP_REGISTRY_NO_DEFAULT_PATHS ignores the environment altogether. */
    registry = test_registry(NULL, 0, AP_REGISTRY_NO_DEFAULT_PATHS);
    assert_int_equal(ap_registry_scan(registry), AP_OK);
    assert_int_equal(ap_registry_file_count(registry), 0);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

static char *path_join(const char *dir, const char *name) {
    char *path;
    assert_true(asprintf(&path, "%s/%s", dir, name) > 0);
    return path;
}

static int is_kind(const char *path, int want_dir) {
    struct stat info;
    return stat(path, &info) == 0 && (want_dir ? S_ISDIR(info.st_mode) : S_ISREG(info.st_mode));
}

/* The .so files of every direct subfolder of <build>/backends and of the third-party example:
 * what the registry must find when the core runs from the build tree. Listed independently. */
static size_t build_tree_plugins(const char *root, char **paths, size_t capacity) {
    char *folders[64];
    size_t num_folders = 0, count = 0;
    char *backends = path_join(root, "backends");
    DIR *top = opendir(backends);
    struct dirent *entry;
    while (top != NULL && (entry = readdir(top)) != NULL && num_folders < 63) {
        if (entry->d_name[0] == '.') continue;
        char *folder = path_join(backends, entry->d_name);
        if (is_kind(folder, 1))
            folders[num_folders++] = folder;
        else
            free(folder);
    }
    if (top != NULL) closedir(top);
    free(backends);
    folders[num_folders++] = path_join(root, "examples/third_party_plugin");
    for (size_t f = 0; f < num_folders; f++) {
        DIR *dir = opendir(folders[f]);
        while (dir != NULL && (entry = readdir(dir)) != NULL && count < capacity) {
            size_t len = strlen(entry->d_name);
            if (len <= 3 || strcmp(entry->d_name + len - 3, ".so") != 0) continue;
            char *path = path_join(folders[f], entry->d_name);
            if (is_kind(path, 0))
                paths[count++] = path;
            else
                free(path);
        }
        if (dir != NULL) closedir(dir);
        free(folders[f]);
    }
    return count;
}

/* AP_ADD_PLUGIN_PATH adds to the defaults; the core runs from the build tree here, so the build
 * tree's plugins are found too, after the host and added folders. An empty AP_PLUGIN_PATH
 * counts as unset. */
static void test_add_plugin_path_and_build_tree(void **state) {
    (void)state;
    const char *broken = test_dir("AP_TEST_BROKEN_DIR"), *second = test_dir("AP_TEST_SECOND_DIR");
    const char *root = test_dir("AP_TEST_BUILD_ROOT"), *install = test_dir("AP_TEST_INSTALL_DIR");
    setenv("AP_PLUGIN_PATH", "", 1);
    setenv("AP_ADD_PLUGIN_PATH", second, 1);
    ap_registry *registry = test_registry(&broken, 1, 0);
    assert_int_equal(ap_registry_scan(registry), AP_OK);

    char *real_root = realpath(root, NULL);
    assert_non_null(real_root);
    char backends[4096], example[4096];
    snprintf(backends, sizeof backends, "%s/backends/", real_root);
    snprintf(example, sizeof example, "%s/examples/third_party_plugin/", real_root);
    free(real_root);
    size_t count = ap_registry_file_count(registry);
    assert_true(count >= BROKEN_FILES + 2);
    for (size_t i = 0; i < count; i++) {
        ap_file_record record;
        assert_int_equal(ap_registry_file(registry, i, &record), AP_OK);
        const char *expected_dir = i < BROKEN_FILES ? broken : i < BROKEN_FILES + 2 ? second : NULL;
        if (expected_dir != NULL) {
            assert_true(starts_with(record.path, expected_dir));
        } else if (!starts_with(record.path, install)) {
            if (!starts_with(record.path, backends) && !starts_with(record.path, example))
                fail_msg("record [%s] comes from no folder of the search path", record.path);
        }
    }
    char *paths[256];
    size_t num_paths = build_tree_plugins(root, paths, 256);
    if (getenv("AP_TEST_EXPECT_BUILD_PLUGIN") != NULL) assert_true(num_paths > 0);
    for (size_t i = 0; i < num_paths; i++) {
        /* The registry spells the folder as realpath() gives it; the build root may not be. */
        char *real = realpath(paths[i], NULL);
        assert_non_null(real);
        if (!test_has_record(registry, real) && !test_has_record(registry, paths[i]))
            fail_msg("build-tree plugin [%s] was not found", paths[i]);
        free(real);
        free(paths[i]);
    }
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

static void file_copy(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buffer[65536];
    size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, in)) > 0)
        assert_int_equal(fwrite(buffer, 1, n, out), n);
    assert_int_equal(fclose(in), 0);
    assert_int_equal(fclose(out), 0);
}

/* A copy of the core outside the build tree does not search the build tree. */
static void test_core_outside_build_tree(void **state) {
    (void)state;
    const char *library = test_dir("AP_TEST_CORE_LIBRARY");
    const char *root = test_dir("AP_TEST_BUILD_ROOT");
    char folder[] = "/tmp/attnplug_core_copy_XXXXXX";
    assert_non_null(mkdtemp(folder));
    char copy[4096];
    snprintf(copy, sizeof copy, "%s/libattnplug_copy.so", folder);
    file_copy(library, copy);

    void *core = dlopen(copy, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(core);
    ap_status (*create)(const ap_registry_options *, ap_registry **);
    ap_status (*scan)(ap_registry *);
    size_t (*file_count)(const ap_registry *);
    ap_status (*file)(const ap_registry *, size_t, ap_file_record *);
    ap_status (*destroy)(ap_registry *);
    *(void **)&create = dlsym(core, "ap_registry_create");
    *(void **)&scan = dlsym(core, "ap_registry_scan");
    *(void **)&file_count = dlsym(core, "ap_registry_file_count");
    *(void **)&file = dlsym(core, "ap_registry_file");
    *(void **)&destroy = dlsym(core, "ap_registry_destroy");
    assert_true(create && scan && file_count && file && destroy);

    ap_registry *registry = NULL;
    assert_int_equal(create(NULL, &registry), AP_OK);
    assert_int_equal(scan(registry), AP_OK);
    char backends[4096];
    snprintf(backends, sizeof backends, "%s/backends/", root);
    char *real_root = realpath(root, NULL);
    for (size_t i = 0; i < file_count(registry); i++) {
        ap_file_record record;
        assert_int_equal(file(registry, i, &record), AP_OK);
        assert_false(starts_with(record.path, backends));
        assert_false(real_root != NULL && starts_with(record.path, real_root));
    }
    free(real_root);
    assert_int_equal(destroy(registry), AP_OK);
    dlclose(core);
    unlink(copy);
    rmdir(folder);
}

/* AP_BACKENDS_DISABLE: comma-separated globs; a match is refused, named, and its name is free. */
static void test_backends_disable(void **state) {
    (void)state;
    const char *broken = test_dir("AP_TEST_BROKEN_DIR"), *second = test_dir("AP_TEST_SECOND_DIR");
    setenv("AP_BACKENDS_DISABLE", "no_such,[cd]*", 1);
    ap_registry *registry = test_registry_scanned(&broken, 1);
    static const char *const disabled[] = {"create_fails.so", "dup_a.so", "dup_b.so"};
    for (size_t i = 0; i < 3; i++) {
        ap_file_record record = test_record(registry, test_path(broken, disabled[i]));
        assert_int_equal(record.status, AP_ERR_REFUSED);
        assert_contains(record.message, "disabled by AP_BACKENDS_DISABLE (pattern '[cd]*')");
        assert_contains(record.message, test_path(broken, disabled[i]));
        assert_non_null(record.backend);
    }
    assert_int_equal(ap_registry_backend_count(registry), 1);
    assert_string_equal(ap_registry_backend(registry, 0)->name, "good");
    assert_int_equal(ap_registry_destroy(registry), AP_OK);

    /* A disabled name is refused in every folder that serves it. */
    setenv("AP_BACKENDS_DISABLE", "go?d", 1);
    const char *dirs[] = {broken, second};
    registry = test_registry_scanned(dirs, 2);
    assert_int_equal(test_record(registry, test_path(broken, "good.so")).status, AP_ERR_REFUSED);
    assert_int_equal(test_record(registry, test_path(second, "shadow.so")).status, AP_ERR_REFUSED);
    assert_null(ap_registry_find(registry, "good"));
    assert_non_null(ap_registry_find(registry, "alpha"));
    assert_int_equal(ap_registry_destroy(registry), AP_OK);

    /* Spaces around items are not part of the globs. */
    setenv("AP_BACKENDS_DISABLE", "alpha , dup ", 1);
    registry = test_registry_scanned(dirs, 2);
    assert_int_equal(test_record(registry, test_path(second, "alpha.so")).status, AP_ERR_REFUSED);
    assert_int_equal(test_record(registry, test_path(broken, "dup_a.so")).status, AP_ERR_REFUSED);
    assert_int_equal(ap_registry_backend_count(registry), 2);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);

    /* An empty value and empty items disable nothing. */
    setenv("AP_BACKENDS_DISABLE", ",,", 1);
    registry = test_registry_scanned(dirs, 2);
    assert_int_equal(ap_registry_backend_count(registry), 4);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

/* Entries named like plugins that are not files (a link loop, a dangling link, a FIFO, a
 * folder) are not opened, and each is recorded with its reason instead of vanishing. */
static void test_odd_entries_recorded(void **state) {
    (void)state;
    char *dir = test_odd_dir_make();
    const char *dirs[] = {dir};
    ap_registry *registry = test_registry_scanned(dirs, 1);
    assert_int_equal(ap_registry_file_count(registry), TEST_ODD_COUNT);
    assert_int_equal(ap_registry_backend_count(registry), 0);
    for (size_t i = 0; i < TEST_ODD_COUNT; i++) {
        const char *path = test_path(dir, test_odd_entries[i].name);
        ap_file_record record = test_record(registry, path);
        assert_int_equal(record.status, AP_ERR_LOAD);
        assert_null(record.backend);
        char expected[4200];
        snprintf(expected, sizeof expected, "skipped [%s]: %s", path, test_odd_entries[i].reason);
        assert_string_equal(record.message, expected);
    }
    /* A second scan records nothing twice. */
    assert_int_equal(ap_registry_scan(registry), AP_OK);
    assert_int_equal(ap_registry_file_count(registry), TEST_ODD_COUNT);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
    /* Handed over by path, a FIFO is refused at once (opening it to read would wait for a
     * writer forever), and so is a folder. */
    registry = test_registry(NULL, 0, AP_REGISTRY_NO_DEFAULT_PATHS);
    assert_int_equal(ap_registry_load_file(registry, test_path(dir, "fifo.so")), AP_ERR_LOAD);
    assert_contains(ap_last_error(), "not a regular file");
    assert_int_equal(ap_registry_load_file(registry, test_path(dir, "folder.so")), AP_ERR_LOAD);
    assert_contains(ap_last_error(), "not a regular file");
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
    test_odd_dir_remove(dir);
}

int main(void) {
    env_clear();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_host_dirs_before_added, env_reset),
        cmocka_unit_test_teardown(test_odd_entries_recorded, env_reset),
        cmocka_unit_test_teardown(test_same_folder_twice, env_reset),
        cmocka_unit_test_teardown(test_plugin_path_replaces, env_reset),
        cmocka_unit_test_teardown(test_add_plugin_path_and_build_tree, env_reset),
        cmocka_unit_test_teardown(test_core_outside_build_tree, env_reset),
        cmocka_unit_test_teardown(test_backends_disable, env_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
