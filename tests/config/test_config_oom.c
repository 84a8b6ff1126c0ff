/* test_config_oom.c: every allocation of parse, load and open made to fail in turn: a clean
 * AP_ERR_OUT_OF_MEMORY each time, and nothing left allocated (the error paths free everything).
 *
 * The test replaces malloc (glibc supports this: its own functions such as strdup, realpath and
 * fopen then allocate through it too), so it is built only without sanitizers, which need the
 * allocator for themselves; the sanitizer build checks the same paths' success side. */
#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include "config_test.h"

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t count, size_t size);
void *__libc_realloc(void *pointer, size_t size);
void __libc_free(void *pointer);

/* The project builds with hidden visibility; the replacements must be seen by the libraries. */
#define TEST_EXPORT __attribute__((visibility("default")))

static long fail_at = -1; /* the index of the allocation to fail; -1: none */
static long allocations;  /* allocations attempted since test_arm */
static long live;         /* blocks allocated and not yet freed */

/* Whether this allocation fails; like glibc's, a failing one sets errno. */
static int test_fail_now(void) {
    if (fail_at < 0 || allocations++ != fail_at) return 0;
    errno = ENOMEM;
    return 1;
}

TEST_EXPORT void *malloc(size_t size) {
    if (test_fail_now()) return NULL;
    void *pointer = __libc_malloc(size);
    if (pointer != NULL) live++;
    return pointer;
}

TEST_EXPORT void *calloc(size_t count, size_t size) {
    if (test_fail_now()) return NULL;
    void *pointer = __libc_calloc(count, size);
    if (pointer != NULL) live++;
    return pointer;
}

TEST_EXPORT void *realloc(void *pointer, size_t size) {
    if (test_fail_now()) return NULL;
    void *moved = __libc_realloc(pointer, size);
    if (pointer == NULL && moved != NULL) live++;
    if (pointer != NULL && size == 0 && moved == NULL) live--;
    return moved;
}

TEST_EXPORT void free(void *pointer) {
    if (pointer != NULL) live--;
    __libc_free(pointer);
}

static void test_arm(long index) {
    allocations = 0;
    fail_at = index;
}

/* Run `attempt` failing allocation 0, 1, 2, ... until it runs through without a failure. Each
 * run must end in AP_ERR_OUT_OF_MEMORY (or a status `attempt` accepts) with every block freed. */
typedef ap_status (*test_attempt)(void *context);

/* `from_file`: fopen and realpath report ENOMEM through errno, which the loader passes on as
 * AP_ERR_CONFIG; a realpath that fails falls back to the folder as written (AP_OK). */
static void test_every_failure(test_attempt attempt, void *context, const char *what,
                               int from_file) {
    long index = 0;
    for (;; index++) {
        long before = live;
        test_arm(index);
        ap_status status = attempt(context);
        int reached = allocations > index;
        test_arm(-1);
        if (live != before)
            fail_msg("%s: failing allocation %ld left %ld block(s) behind (status %d: %s)", what,
                     index, live - before, (int)status, ap_last_error());
        if (!reached) {
            if (status != AP_OK) fail_msg("%s: %s", what, ap_last_error());
            break;
        }
        if (status == AP_ERR_OUT_OF_MEMORY) continue;
        if (from_file && status == AP_ERR_CONFIG &&
            strstr(ap_last_error(), strerror(ENOMEM)) != NULL)
            continue;
        if (from_file && status == AP_OK) continue;
        fail_msg("%s: failing allocation %ld gave status %d: %s", what, index, (int)status,
                 ap_last_error());
    }
    assert_true(index > 10); /* the attempts really allocate: the test is not vacuous */
}

static const char *const full_config = "version: 1\n"
                                       "plugin_path: [plugins, /opt/x]\n"
                                       "rules:\n"
                                       "  - match: \"meta-llama/Llama-3*\"\n"
                                       "    backends: [trtllm_mha, flashinfer_like, cpu_ref]\n"
                                       "    options:\n"
                                       "      page_size: 16\n"
                                       "      kv_dtype: bf16\n"
                                       "      prefix_cache: true\n"
                                       "      backend_options:\n"
                                       "        flashinfer_like: {split_kv: auto, ctas: 4}\n"
                                       "        cpu_ref: {threads: 2}\n"
                                       "  - match: \"*\"\n"
                                       "    backend: cpu_ref\n";

static ap_status test_parse_attempt(void *context) {
    const char *text = context;
    ap_config *config = NULL;
    ap_status status = ap_config_parse(text, strlen(text), TEST_SOURCE, &config);
    if (status == AP_OK && ap_config_rule_count(config) == 0) status = AP_ERR_INTERNAL;
    if (status != AP_OK && config != NULL) status = AP_ERR_INTERNAL;
    ap_config_destroy(config);
    return status;
}

static void test_parse_out_of_memory(void **state) {
    (void)state;
    test_every_failure(test_parse_attempt, (void *)full_config, "parse", 0);
}

/* The error paths after a problem is found free as much as the good path. */
static void test_parse_error_out_of_memory(void **state) {
    (void)state;
    const char *bad = "version: 1\n"
                      "rules:\n"
                      "  - match: \"a\"\n"
                      "    backends: [cpu_ref, trtllm_mha]\n"
                      "    options: {backend_options: {cpu_ref: {x: 1}}}\n"
                      "  - match: \"b\"\n"
                      "    backends: [cpu_ref]\n"
                      "    options: {page_size: 0}\n";
    long index = 0;
    for (;; index++) {
        long before = live;
        test_arm(index);
        ap_config *config = NULL;
        ap_status status = ap_config_parse(bad, strlen(bad), TEST_SOURCE, &config);
        int reached = allocations > index;
        test_arm(-1);
        assert_null(config);
        if (live != before) fail_msg("failing allocation %ld leaked", index);
        if (!reached) {
            assert_int_equal(status, AP_ERR_CONFIG);
            assert_starts_with(ap_last_error(), "t.yaml:8:26: page_size must be a positive");
            break;
        }
        if (status != AP_ERR_OUT_OF_MEMORY && status != AP_ERR_CONFIG)
            fail_msg("failing allocation %ld: status %d", index, (int)status);
    }
    assert_true(index > 10);
}

static ap_status test_load_attempt(void *context) {
    ap_config *config = NULL;
    ap_status status = ap_config_load(context, &config);
    ap_config_destroy(config);
    return status;
}

static void test_load_out_of_memory(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    char dir[PATH_MAX], path[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/ap-config-oom-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/c.yaml", dir);
    FILE *file = fopen(path, "w");
    assert_non_null(file);
    fputs(full_config, file);
    assert_int_equal(fclose(file), 0);
    test_every_failure(test_load_attempt, path, "load", 1);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

typedef struct test_open_context {
    ap_config *config;
    ap_registry *registry;
    ap_model model;
    ap_device device;
} test_open_context;

static ap_status test_open_attempt(void *context) {
    test_open_context *open = context;
    ap_instance *instance = NULL;
    ap_selection *selection = NULL;
    ap_status status = ap_config_open(open->config, open->registry, &open->model, &open->device,
                                      &instance, &selection);
    if (status == AP_OK && strcmp(ap_instance_backend(instance), "cpu_ref") != 0)
        status = AP_ERR_INTERNAL;
    ap_instance_close(instance);
    ap_selection_destroy(selection);
    return status;
}

/* The walk skips trtllm_mha (not loaded) and opens cpu_ref, the path every host takes. */
static void test_open_out_of_memory(void **state) {
    (void)state;
    test_open_context open = {.registry = test_registry_make(),
                              .model = test_model("meta-llama/Llama-3-8B")};
    assert_non_null(ap_registry_find(open.registry, "cpu_ref"));
    ap_device_cpu(&open.device, "test");
    const char *text = "version: 1\n"
                       "rules:\n"
                       "  - match: \"*\"\n"
                       "    backends: [trtllm_mha, cpu_ref]\n"
                       "    options: {page_size: 32}\n";
    assert_int_equal(ap_config_parse(text, strlen(text), TEST_SOURCE, &open.config), AP_OK);
    test_every_failure(test_open_attempt, &open, "open", 0);
    ap_config_destroy(open.config);
    assert_int_equal(ap_registry_destroy(open.registry), AP_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_out_of_memory),
        cmocka_unit_test(test_parse_error_out_of_memory),
        cmocka_unit_test(test_load_out_of_memory),
        cmocka_unit_test(test_open_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
