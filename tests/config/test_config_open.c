/* test_config_open.c: opening a model through its rule, against cpu_ref and fixture plugins. */
#include <limits.h>

#include "config_test.h"

/* One registry for the group: cpu_ref's build folder, and from the fixture folder exactly the
 * two files these tests walk (good, create_fails). Backends sorted: cpu_ref, create_fails, good. */
#define LOADED "cpu_ref, create_fails, good"

static ap_registry *registry;
static ap_device cpu;

static void test_load_fixture(ap_registry *target, const char *file) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", test_env("AP_TEST_FIXTURE_DIR"), file);
    if (ap_registry_load_file(target, path) != AP_OK) fail_msg("%s: %s", path, ap_last_error());
}

static int group_setup(void **state) {
    (void)state;
    registry = test_registry_make();
    test_load_fixture(registry, "create_fails.so");
    test_load_fixture(registry, "good.so");
    ap_device_cpu(&cpu, "no GPU in this test");
    return ap_registry_backend_count(registry) == 3 ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    return ap_registry_destroy(registry) == AP_OK ? 0 : -1;
}

/* Open `model_name` through `text`; the caller checks the status and frees what came back. */
typedef struct test_open_result {
    ap_status status;
    ap_instance *instance;
    ap_selection *selection;
    char message[4096];
} test_open_result;

static test_open_result test_open(const char *text, const char *model_name) {
    ap_config *config = test_parse(text);
    ap_model model = test_model(model_name);
    test_open_result result = {.instance = (ap_instance *)(uintptr_t)1,
                               .selection = (ap_selection *)(uintptr_t)1};
    result.status =
        ap_config_open(config, registry, &model, &cpu, &result.instance, &result.selection);
    snprintf(result.message, sizeof result.message, "%s", ap_last_error());
    ap_config_destroy(config);
    if (result.status != AP_OK) assert_null(result.instance);
    return result;
}

static void test_open_free(test_open_result *result) {
    ap_instance_close(result->instance);
    ap_selection_destroy(result->selection);
}

static void test_verdict_is(const ap_selection *selection, size_t index, const char *backend,
                            ap_status status) {
    const ap_verdict *verdict = ap_selection_verdict(selection, index);
    assert_non_null(verdict);
    assert_string_equal(verdict->backend, backend);
    if (verdict->status != status)
        fail_msg("verdict on %s: status %d, expected %d (%s)", backend, (int)verdict->status,
                 (int)status, verdict->reasons);
}

/* A list naming a backend not built here skips it with its reason; options reach the model. */
static void test_list_skips_unknown(void **state) {
    (void)state;
    test_open_result result = test_open("version: 1\n"
                                        "rules:\n"
                                        "  - match: \"llama*\"\n"
                                        "    backends: [trtllm_mha, cpu_ref]\n"
                                        "    options: {page_size: 32, kv_dtype: fp16}\n",
                                        "llama-test");
    if (result.status != AP_OK) fail_msg("%s", result.message);
    assert_string_equal(ap_instance_backend(result.instance), "cpu_ref");
    const ap_model *applied = ap_instance_model(result.instance);
    assert_int_equal(applied->page_size, 32);
    assert_int_equal(applied->kv_dtype, AP_DTYPE_F16);
    assert_string_equal(applied->name, "llama-test");
    assert_int_equal(ap_selection_count(result.selection), 2);
    test_verdict_is(result.selection, 0, "trtllm_mha", AP_ERR_NOT_FOUND);
    assert_contains(ap_selection_verdict(result.selection, 0)->reasons, "trtllm_mha");
    test_verdict_is(result.selection, 1, "cpu_ref", AP_OK);
    assert_string_equal(ap_selection_chosen(result.selection), "cpu_ref");
    test_open_free(&result);
}

/* `backend:` names one backend; it serves with the model's own page size and dtype. */
static void test_single_opens(void **state) {
    (void)state;
    test_open_result result = test_open("version: 1\n"
                                        "rules:\n"
                                        "  - match: \"*\"\n"
                                        "    backend: cpu_ref\n",
                                        "any/model");
    if (result.status != AP_OK) fail_msg("%s", result.message);
    assert_string_equal(ap_instance_backend(result.instance), "cpu_ref");
    assert_int_equal(ap_instance_model(result.instance)->page_size, 16);
    assert_int_equal(ap_instance_model(result.instance)->kv_dtype, AP_DTYPE_BF16);
    assert_int_equal(ap_selection_count(result.selection), 1);
    test_verdict_is(result.selection, 0, "cpu_ref", AP_OK);
    test_open_free(&result);
}

static void test_single_unknown_is_an_error(void **state) {
    (void)state;
    test_open_result result = test_open("version: 1\n"
                                        "rules:\n"
                                        "  - match: \"*\"\n"
                                        "    backend: trtllm_mha\n",
                                        "m");
    assert_int_equal(result.status, AP_ERR_CONFIG);
    assert_string_equal(result.message,
                        "t.yaml:4:14: unknown backend 'trtllm_mha' (loaded: " LOADED ")");
    /* The walk still comes back, with the verdict on the one name. */
    assert_int_equal(ap_selection_count(result.selection), 1);
    test_verdict_is(result.selection, 0, "trtllm_mha", AP_ERR_NOT_FOUND);
    assert_null(ap_selection_chosen(result.selection));
    test_open_free(&result);
}

static void test_list_all_unknown_is_an_error(void **state) {
    (void)state;
    test_open_result result = test_open("version: 1\n"
                                        "rules:\n"
                                        "  - match: \"*\"\n"
                                        "    backends: [trtllm_mha,\n"
                                        "               fa_varlen]\n",
                                        "m");
    assert_int_equal(result.status, AP_ERR_CONFIG);
    assert_string_equal(result.message, "t.yaml:4:15: none of the backends [trtllm_mha, "
                                        "fa_varlen] is loaded (loaded: " LOADED ")");
    assert_int_equal(ap_selection_count(result.selection), 2);
    test_verdict_is(result.selection, 0, "trtllm_mha", AP_ERR_NOT_FOUND);
    test_verdict_is(result.selection, 1, "fa_varlen", AP_ERR_NOT_FOUND);
    test_open_free(&result);
}

/* cpu_ref takes no backend option, so one refuses it: for `backend:` that is a hard error. */
static void test_single_refused_is_an_error(void **state) {
    (void)state;
    test_open_result result = test_open("version: 1\n"
                                        "rules:\n"
                                        "  - match: \"m*\"\n"
                                        "    backend: cpu_ref\n"
                                        "    options: {backend_options: {cpu_ref: {threads: 4}}}\n",
                                        "m1");
    assert_int_equal(result.status, AP_ERR_REFUSED);
    assert_starts_with(result.message, "t.yaml:4:14: rule 'm*' for model 'm1': ");
    assert_contains(result.message, "cpu_ref: unknown option 'cpu_ref.threads'");
    assert_int_equal(ap_selection_count(result.selection), 1);
    test_verdict_is(result.selection, 0, "cpu_ref", AP_ERR_REFUSED);
    test_open_free(&result);
}

static void test_list_all_refused(void **state) {
    (void)state;
    test_open_result result = test_open("version: 1\n"
                                        "rules:\n"
                                        "  - match: \"m*\"\n"
                                        "    backends: [trtllm_mha, cpu_ref]\n"
                                        "    options: {backend_options: {cpu_ref: {threads: 4}}}\n",
                                        "m1");
    assert_int_equal(result.status, AP_ERR_REFUSED);
    assert_starts_with(result.message, "t.yaml:4:15: rule 'm*' for model 'm1': ");
    assert_contains(result.message, "trtllm_mha");
    assert_contains(result.message, "cpu_ref.threads");
    assert_int_equal(ap_selection_count(result.selection), 2);
    test_verdict_is(result.selection, 0, "trtllm_mha", AP_ERR_NOT_FOUND);
    test_verdict_is(result.selection, 1, "cpu_ref", AP_ERR_REFUSED);
    test_open_free(&result);
}

/* A candidate that passes every check but fails create: the walk goes on to the next one. */
static void test_create_failure_walks_on(void **state) {
    (void)state;
    test_open_result result = test_open("version: 1\n"
                                        "rules:\n"
                                        "  - match: \"*\"\n"
                                        "    backends: [create_fails, good, cpu_ref]\n",
                                        "m");
    if (result.status != AP_OK) fail_msg("%s", result.message);
    assert_string_equal(ap_instance_backend(result.instance), "good");
    assert_string_equal(ap_selection_chosen(result.selection), "good");
    /* The walk keeps the one that failed to open, with create's status and message. */
    assert_int_equal(ap_selection_count(result.selection), 2);
    test_verdict_is(result.selection, 0, "create_fails", AP_ERR_OUT_OF_MEMORY);
    assert_string_equal(ap_selection_verdict(result.selection, 0)->reasons,
                        "passed the checks, but backend 'create_fails': create failed: fixture "
                        "'create_fails' fails create on purpose");
    test_verdict_is(result.selection, 1, "good", AP_OK);
    test_open_free(&result);
}

/* create() answering AP_OK without an instance, or a status that is none, is a failure to
 * open like any other: in the walk with its reason, and the walk goes on. */
static void test_create_lies_in_walk(void **state) {
    (void)state;
    ap_registry *own = test_registry_make();
    char path[PATH_MAX];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", test_env("AP_TEST_HOSTILE_DIR"),
                 i == 0 ? "create_null.so" : "create_odd_status.so");
        assert_int_equal(ap_registry_load_file(own, path), AP_OK);
    }
    ap_config *config = test_parse("version: 1\nrules:\n  - match: \"*\"\n"
                                   "    backends: [create_null, trtllm_mha, create_odd_status, "
                                   "cpu_ref]\n");
    ap_model model = test_model("m");
    ap_instance *instance = NULL;
    ap_selection *walk = NULL;
    if (ap_config_open(config, own, &model, &cpu, &instance, &walk) != AP_OK)
        fail_msg("%s", ap_last_error());
    assert_string_equal(ap_instance_backend(instance), "cpu_ref");
    assert_int_equal(ap_selection_count(walk), 4);
    test_verdict_is(walk, 0, "create_null", AP_ERR_INTERNAL);
    assert_string_equal(ap_selection_verdict(walk, 0)->reasons,
                        "passed the checks, but backend 'create_null': create returned AP_OK but "
                        "no instance (NULL)");
    test_verdict_is(walk, 1, "trtllm_mha", AP_ERR_NOT_FOUND);
    test_verdict_is(walk, 2, "create_odd_status", AP_ERR_INTERNAL);
    assert_contains(ap_selection_verdict(walk, 2)->reasons, "returned status 12345");
    test_verdict_is(walk, 3, "cpu_ref", AP_OK);
    assert_string_equal(ap_selection_chosen(walk), "cpu_ref");
    ap_instance_close(instance);
    ap_selection_destroy(walk);
    ap_config_destroy(config);
    assert_int_equal(ap_registry_destroy(own), AP_OK);
}

static void test_create_failure_single(void **state) {
    (void)state;
    test_open_result result = test_open("version: 1\n"
                                        "rules:\n"
                                        "  - match: \"*\"\n"
                                        "    backend: create_fails\n",
                                        "m");
    assert_int_equal(result.status, AP_ERR_OUT_OF_MEMORY);
    assert_starts_with(result.message, "t.yaml:4:14: rule '*' for model 'm': ");
    assert_contains(result.message, "fixture 'create_fails' fails create on purpose");
    /* Not "usable, chosen": the walk says it failed to open. */
    assert_int_equal(ap_selection_count(result.selection), 1);
    test_verdict_is(result.selection, 0, "create_fails", AP_ERR_OUT_OF_MEMORY);
    assert_null(ap_selection_chosen(result.selection));
    test_open_free(&result);

    /* A list whose only candidates fail create says so, with each reason. */
    result = test_open("version: 1\n"
                       "rules:\n"
                       "  - match: \"*\"\n"
                       "    backends: [trtllm_mha, create_fails]\n",
                       "m");
    assert_int_equal(result.status, AP_ERR_OUT_OF_MEMORY);
    assert_starts_with(result.message,
                       "t.yaml:4:15: rule '*' for model 'm': every backend that passed the "
                       "checks failed to open: ");
    assert_contains(result.message, "fixture 'create_fails' fails create on purpose");
    assert_contains(result.message, "the others cannot serve: ");
    assert_contains(result.message, "no plugin provides backend 'trtllm_mha'");
    assert_int_equal(ap_selection_count(result.selection), 2);
    test_verdict_is(result.selection, 0, "trtllm_mha", AP_ERR_NOT_FOUND);
    test_verdict_is(result.selection, 1, "create_fails", AP_ERR_OUT_OF_MEMORY);
    assert_contains(ap_selection_verdict(result.selection, 1)->reasons, "passed the checks, but ");
    assert_null(ap_selection_chosen(result.selection));
    test_open_free(&result);
}

static void test_no_rule(void **state) {
    (void)state;
    test_open_result result = test_open("version: 1\n"
                                        "rules:\n"
                                        "  - match: \"llama*\"\n"
                                        "    backend: cpu_ref\n",
                                        "qwen");
    assert_int_equal(result.status, AP_ERR_NOT_FOUND);
    assert_string_equal(result.message, "no rule in t.yaml matches model 'qwen'");
    assert_null(result.selection);
}

static void test_open_arguments(void **state) {
    (void)state;
    ap_config *config = test_parse("version: 1\nrules: [{match: \"*\", backend: cpu_ref}]\n");
    ap_model model = test_model("m");
    ap_instance *instance = NULL;
    ap_selection *selection = NULL;
    assert_int_equal(ap_config_open(NULL, registry, &model, &cpu, &instance, &selection),
                     AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_config_open(config, NULL, &model, &cpu, &instance, &selection),
                     AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_config_open(config, registry, NULL, &cpu, &instance, &selection),
                     AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_config_open(config, registry, &model, NULL, &instance, &selection),
                     AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_config_open(config, registry, &model, &cpu, NULL, &selection),
                     AP_ERR_INVALID_ARGUMENT);
    model.name = NULL;
    assert_int_equal(ap_config_open(config, registry, &model, &cpu, &instance, &selection),
                     AP_ERR_INVALID_ARGUMENT);
    assert_null(instance);
    assert_null(selection);
    /* No selection wanted: still opens. */
    model.name = "m";
    assert_int_equal(ap_config_open(config, registry, &model, &cpu, &instance, NULL), AP_OK);
    assert_string_equal(ap_instance_backend(instance), "cpu_ref");
    ap_instance_close(instance);
    ap_config_destroy(config);
}

/* A backend disabled by AP_BACKENDS_DISABLE is known, not absent: the walk says it is disabled
 * and by which pattern; as the only backend allowed it is a refusal, not an unknown name. */
static void test_disabled_backend(void **state) {
    (void)state;
    assert_int_equal(setenv("AP_BACKENDS_DISABLE", "nothing,go?d", 1), 0);
    ap_registry *own = test_registry_make();
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/good.so", test_env("AP_TEST_FIXTURE_DIR"));
    ap_status loaded = ap_registry_load_file(own, path);
    assert_int_equal(unsetenv("AP_BACKENDS_DISABLE"), 0);
    assert_int_equal(loaded, AP_ERR_REFUSED);
    char disabled[PATH_MAX + 128];
    snprintf(disabled, sizeof disabled,
             "disabled by AP_BACKENDS_DISABLE (pattern 'go?d'): backend 'good' in [%s]", path);

    ap_config *config = test_parse("version: 1\nrules:\n  - match: \"*\"\n    backend: good\n");
    ap_model model = test_model("m");
    ap_instance *instance = NULL;
    ap_selection *walk = NULL;
    assert_int_equal(ap_config_open(config, own, &model, &cpu, &instance, &walk), AP_ERR_REFUSED);
    assert_contains(ap_last_error(), disabled);
    test_verdict_is(walk, 0, "good", AP_ERR_REFUSED);
    assert_string_equal(ap_selection_verdict(walk, 0)->reasons, disabled);
    ap_selection_destroy(walk);
    ap_config_destroy(config);

    /* In a list (even one whose other names are all unknown) it is walked past with the reason. */
    config = test_parse("version: 1\nrules:\n  - match: \"*\"\n"
                        "    backends: [good, trtllm_mha, cpu_ref]\n");
    assert_int_equal(ap_config_open(config, own, &model, &cpu, &instance, &walk), AP_OK);
    test_verdict_is(walk, 0, "good", AP_ERR_REFUSED);
    assert_string_equal(ap_selection_verdict(walk, 0)->reasons, disabled);
    test_verdict_is(walk, 1, "trtllm_mha", AP_ERR_NOT_FOUND);
    test_verdict_is(walk, 2, "cpu_ref", AP_OK);
    ap_instance_close(instance);
    ap_selection_destroy(walk);
    ap_config_destroy(config);
    config = test_parse("version: 1\nrules:\n  - match: \"*\"\n    backends: [good, trtllm_mha]\n");
    assert_int_equal(ap_config_open(config, own, &model, &cpu, &instance, &walk), AP_ERR_REFUSED);
    test_verdict_is(walk, 0, "good", AP_ERR_REFUSED);
    ap_selection_destroy(walk);
    ap_config_destroy(config);
    assert_int_equal(ap_registry_destroy(own), AP_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_skips_unknown),
        cmocka_unit_test(test_single_opens),
        cmocka_unit_test(test_single_unknown_is_an_error),
        cmocka_unit_test(test_list_all_unknown_is_an_error),
        cmocka_unit_test(test_single_refused_is_an_error),
        cmocka_unit_test(test_list_all_refused),
        cmocka_unit_test(test_create_failure_walks_on),
        cmocka_unit_test(test_create_failure_single),
        cmocka_unit_test(test_no_rule),
        cmocka_unit_test(test_open_arguments),
        cmocka_unit_test(test_create_lies_in_walk),
        cmocka_unit_test(test_disabled_backend),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
