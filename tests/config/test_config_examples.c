/* test_config_examples.c: every shipped example config parses; models.yaml routes each model. */
#include "config_test.h"

static int example_count;
static char **example_paths;

static int test_is_models_yaml(const char *path) {
    const char *slash = strrchr(path, '/');
    return strcmp(slash != NULL ? slash + 1 : path, "models.yaml") == 0;
}

static void test_every_example_parses(void **state) {
    (void)state;
    assert_true(example_count > 0);
    for (int i = 0; i < example_count; i++) {
        ap_config *config = NULL;
        ap_status status = ap_config_load(example_paths[i], &config);
        if (status != AP_OK) fail_msg("%s: %s", example_paths[i], ap_last_error());
        assert_int_equal(ap_config_version(config), 1);
        assert_true(ap_config_rule_count(config) > 0);
        ap_config_destroy(config);
    }
}

/* The rule `name` lands on, failing when none does. */
static const ap_config_rule *test_rule_for(const ap_config *config, const char *name) {
    const ap_config_rule *rule = ap_config_match(config, name);
    if (rule == NULL) fail_msg("no rule for '%s': %s", name, ap_last_error());
    return rule;
}

/* What the example engine relies on: the three example models and a default, each with the
 * backends and options the design gives them. */
static void test_models_yaml_routes(void **state) {
    (void)state;
    const char *path = NULL;
    for (int i = 0; i < example_count; i++)
        if (test_is_models_yaml(example_paths[i])) path = example_paths[i];
    if (path == NULL) fail_msg("models.yaml is not among the example configs given");
    ap_config *config = NULL;
    if (ap_config_load(path, &config) != AP_OK) fail_msg("%s", ap_last_error());
    assert_int_equal(ap_config_rule_count(config), 4);
    assert_int_equal(ap_config_plugin_path_count(config), 0);

    const char *llamas[] = {"meta-llama/Llama-3-8B", "meta-llama/Llama-3-8B-Instruct",
                            "meta-llama/Meta-Llama-3.1-8B"};
    for (size_t i = 0; i < 3; i++) {
        const ap_config_rule *rule = test_rule_for(config, llamas[i]);
        assert_ptr_equal(rule, ap_config_rule_at(config, 0));
        assert_string_equal(test_backends(rule), "trtllm_mha,flashinfer_like,cpu_ref");
        assert_int_equal(rule->explicit_single, 0);
        assert_int_equal(rule->options.page_size, 16);
        assert_int_equal(rule->options.kv_dtype, AP_DTYPE_BF16);
        assert_int_equal(rule->options.cuda_graphs, 0);
    }

    const ap_config_rule *rule = test_rule_for(config, "deepseek-ai/DeepSeek-V3");
    assert_ptr_equal(rule, ap_config_rule_at(config, 1));
    assert_string_equal(test_backends(rule), "trtllm_mla,cpu_ref");
    assert_int_equal(rule->options.page_size, 64);
    assert_int_equal(rule->options.kv_dtype, AP_DTYPE_FP8_E4M3);

    rule = test_rule_for(config, "Qwen/Qwen3-Embedding-8B");
    assert_ptr_equal(rule, ap_config_rule_at(config, 2));
    assert_string_equal(test_backends(rule), "fa_varlen,cpu_ref");
    assert_int_equal(rule->options.prefix_cache, 0);
    assert_int_equal(rule->options.chunked_prefill, 0);
    assert_int_equal(rule->options.kv_dtype, AP_DTYPE_NONE);

    /* Neither a 70B Llama nor an unknown model takes a special rule. */
    const char *others[] = {"meta-llama/Llama-3-70B", "mistralai/Mistral-7B-v0.1", "Qwen/Qwen3-8B"};
    for (size_t i = 0; i < 3; i++) {
        rule = test_rule_for(config, others[i]);
        assert_ptr_equal(rule, ap_config_rule_at(config, 3));
        assert_string_equal(rule->pattern, "*");
        assert_string_equal(test_backends(rule), "flashinfer_like,cpu_ref");
        assert_int_equal(rule->options.page_size, 16);
    }
    ap_config_destroy(config);
}

int main(int argc, char **argv) {
    example_count = argc - 1;
    example_paths = argv + 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_example_parses),
        cmocka_unit_test(test_models_yaml_routes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
