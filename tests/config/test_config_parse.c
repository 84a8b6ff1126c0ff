/* test_config_parse.c: good configs read into exact rules, first-match lookup, loading files. */
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_test.h"

/* The format's own example (the one config.c and the README show). */
static const char *const spec_example = "version: 1\n"
                                        "plugin_path: [plugins, /opt/vendor/attnplug]\n"
                                        "rules:\n"
                                        "  - match: \"meta-llama/Llama-3*\"\n"
                                        "    backends: [trtllm_mha, flashinfer_like, cpu_ref]\n"
                                        "    options:\n"
                                        "      page_size: 16\n"
                                        "      kv_dtype: bf16\n"
                                        "      prefix_cache: true\n"
                                        "      chunked_prefill: true\n"
                                        "      cuda_graphs: false\n"
                                        "      backend_options:\n"
                                        "        flashinfer_like: {split_kv: auto, num_ctas: 4}\n"
                                        "  - match: \"*\"\n"
                                        "    backend: cpu_ref\n";

static void test_spec_example(void **state) {
    (void)state;
    ap_config *config = test_parse(spec_example);
    assert_int_equal(ap_config_version(config), 1);
    assert_int_equal(ap_config_plugin_path_count(config), 2);
    /* A parsed string has no folder: entries stay as written. */
    assert_string_equal(ap_config_plugin_path(config, 0), "plugins");
    assert_string_equal(ap_config_plugin_path(config, 1), "/opt/vendor/attnplug");
    assert_null(ap_config_plugin_path(config, 2));
    assert_int_equal(ap_config_rule_count(config), 2);

    const ap_config_rule *llama = ap_config_rule_at(config, 0);
    assert_non_null(llama);
    assert_string_equal(llama->pattern, "meta-llama/Llama-3*");
    assert_string_equal(test_backends(llama), "trtllm_mha,flashinfer_like,cpu_ref");
    assert_int_equal(llama->num_backends, 3);
    assert_int_equal(llama->explicit_single, 0);
    assert_int_equal(llama->line, 4);
    assert_int_equal(llama->options.struct_size, sizeof(ap_options));
    assert_int_equal(llama->options.page_size, 16);
    assert_int_equal(llama->options.kv_dtype, AP_DTYPE_BF16);
    assert_int_equal(llama->options.prefix_cache, 1);
    assert_int_equal(llama->options.chunked_prefill, 1);
    assert_int_equal(llama->options.cuda_graphs, 0);
    assert_int_equal(llama->options.num_extra, 2);
    assert_string_equal(llama->options.extra[0].key, "flashinfer_like.split_kv");
    assert_string_equal(llama->options.extra[0].value, "auto");
    assert_string_equal(llama->options.extra[1].key, "flashinfer_like.num_ctas");
    assert_string_equal(llama->options.extra[1].value, "4");

    const ap_config_rule *fallback = ap_config_rule_at(config, 1);
    assert_non_null(fallback);
    assert_string_equal(fallback->pattern, "*");
    assert_string_equal(test_backends(fallback), "cpu_ref");
    assert_int_equal(fallback->explicit_single, 1);
    assert_int_equal(fallback->line, 14);
    /* No options: everything unset, so the model's own values stand. */
    assert_int_equal(fallback->options.struct_size, sizeof(ap_options));
    assert_int_equal(fallback->options.page_size, 0);
    assert_int_equal(fallback->options.kv_dtype, AP_DTYPE_NONE);
    assert_int_equal(fallback->options.prefix_cache, AP_OPTION_UNSET);
    assert_int_equal(fallback->options.chunked_prefill, AP_OPTION_UNSET);
    assert_int_equal(fallback->options.cuda_graphs, AP_OPTION_UNSET);
    assert_int_equal(fallback->options.num_extra, 0);
    assert_null(fallback->options.extra);
    assert_null(ap_config_rule_at(config, 2));
    ap_config_destroy(config);
}

/* Every value spelling the format allows, in block and flow style. */
static void test_option_values(void **state) {
    (void)state;
    ap_config *config = test_parse(
        "version: 1\n"
        "rules:\n"
        "  - match: \"a*\"\n"
        "    backends: [flashinfer_like, trtllm_mha]\n"
        "    options: {kv_dtype: fp16, prefix_cache: no, chunked_prefill: off, cuda_graphs: yes,\n"
        "              backend_options: {trtllm_mha: {x: \"1\"},\n"
        "                                flashinfer_like: {y: two, z: 3.5}}}\n"
        "  - match: 'b*'\n"
        "    backends:\n"
        "      - cpu_ref\n"
        "    options:\n"
        "      kv_dtype: fp8_e4m3\n"
        "      prefix_cache: on\n"
        "  - match: c\n"
        "    backend: \"cpu_ref\"\n"
        "    options: {kv_dtype: fp8_e5m2, cuda_graphs: true}\n"
        "  - match: d?\n"
        "    backend: cpu_ref\n"
        "    options: {kv_dtype: nvfp4, page_size: 1, chunked_prefill: false}\n");
    assert_int_equal(ap_config_rule_count(config), 4);
    assert_int_equal(ap_config_plugin_path_count(config), 0);

    const ap_config_rule *rule = ap_config_rule_at(config, 0);
    assert_string_equal(rule->pattern, "a*");
    assert_string_equal(test_backends(rule), "flashinfer_like,trtllm_mha");
    assert_int_equal(rule->options.page_size, 0);
    assert_int_equal(rule->options.kv_dtype, AP_DTYPE_F16);
    assert_int_equal(rule->options.prefix_cache, 0);
    assert_int_equal(rule->options.chunked_prefill, 0);
    assert_int_equal(rule->options.cuda_graphs, 1);
    /* Extras in file order, across backends; values verbatim. */
    assert_int_equal(rule->options.num_extra, 3);
    assert_string_equal(rule->options.extra[0].key, "trtllm_mha.x");
    assert_string_equal(rule->options.extra[0].value, "1");
    assert_string_equal(rule->options.extra[1].key, "flashinfer_like.y");
    assert_string_equal(rule->options.extra[1].value, "two");
    assert_string_equal(rule->options.extra[2].key, "flashinfer_like.z");
    assert_string_equal(rule->options.extra[2].value, "3.5");

    rule = ap_config_rule_at(config, 1);
    assert_string_equal(rule->pattern, "b*");
    assert_int_equal(rule->line, 8);
    assert_string_equal(test_backends(rule), "cpu_ref");
    assert_int_equal(rule->explicit_single, 0);
    assert_int_equal(rule->options.kv_dtype, AP_DTYPE_FP8_E4M3);
    assert_int_equal(rule->options.prefix_cache, 1);
    assert_int_equal(rule->options.chunked_prefill, AP_OPTION_UNSET);
    assert_int_equal(rule->options.cuda_graphs, AP_OPTION_UNSET);

    rule = ap_config_rule_at(config, 2);
    assert_string_equal(rule->pattern, "c");
    assert_int_equal(rule->explicit_single, 1);
    assert_string_equal(test_backends(rule), "cpu_ref");
    assert_int_equal(rule->options.kv_dtype, AP_DTYPE_FP8_E5M2);
    assert_int_equal(rule->options.cuda_graphs, 1);

    rule = ap_config_rule_at(config, 3);
    assert_string_equal(rule->pattern, "d?");
    assert_int_equal(rule->line, 17);
    assert_int_equal(rule->options.kv_dtype, AP_DTYPE_NVFP4);
    assert_int_equal(rule->options.page_size, 1);
    assert_int_equal(rule->options.chunked_prefill, 0);
    ap_config_destroy(config);
}

static const char *const match_config = "version: 1\n"
                                        "rules:\n"
                                        "  - match: \"meta-llama/Llama-3*8B*\"\n"
                                        "    backends: [trtllm_mha, cpu_ref]\n"
                                        "  - match: \"meta-llama/*\"\n"
                                        "    backends: [flashinfer_like]\n"
                                        "  - match: \"deepseek-ai/DeepSeek-V[23]*\"\n"
                                        "    backend: trtllm_mla\n"
                                        "  - match: \"*Embedding*\"\n"
                                        "    backend: fa_varlen\n";

/* The pattern of the rule `name` matches, or "(none)". */
static const char *test_match(const ap_config *config, const char *name) {
    const ap_config_rule *rule = ap_config_match(config, name);
    return rule != NULL ? rule->pattern : "(none)";
}

static void test_match_first_wins(void **state) {
    (void)state;
    ap_config *config = test_parse(match_config);
    /* Both of the first two rules fit: the earlier one wins. */
    assert_string_equal(test_match(config, "meta-llama/Llama-3-8B-Instruct"),
                        "meta-llama/Llama-3*8B*");
    assert_string_equal(test_match(config, "meta-llama/Llama-3-8B"), "meta-llama/Llama-3*8B*");
    assert_string_equal(test_match(config, "meta-llama/Llama-3-70B"), "meta-llama/*");
    assert_string_equal(test_match(config, "deepseek-ai/DeepSeek-V3"),
                        "deepseek-ai/DeepSeek-V[23]*");
    assert_string_equal(test_match(config, "deepseek-ai/DeepSeek-V2-Lite"),
                        "deepseek-ai/DeepSeek-V[23]*");
    /* '*' crosses the '/' of "org/model". */
    assert_string_equal(test_match(config, "Qwen/Qwen3-Embedding-8B"), "*Embedding*");
    /* Globs are case-sensitive, as model names are. */
    assert_null(ap_config_match(config, "Meta-Llama/Llama-3-8B"));
    assert_string_equal(ap_last_error(), "no rule in t.yaml matches model 'Meta-Llama/Llama-3-8B'");
    assert_null(ap_config_match(config, "deepseek-ai/DeepSeek-V4"));
    assert_string_equal(ap_last_error(),
                        "no rule in t.yaml matches model 'deepseek-ai/DeepSeek-V4'");
    assert_null(ap_config_match(config, NULL));
    assert_null(ap_config_match(NULL, "x"));
    ap_config_destroy(config);
}

static void test_match_default_rule(void **state) {
    (void)state;
    ap_config *config = test_parse("version: 1\n"
                                   "rules:\n"
                                   "  - match: \"*Llama*\"\n"
                                   "    backends: [flashinfer_like]\n"
                                   "  - match: \"*\"\n"
                                   "    backends: [flashinfer_like, cpu_ref]\n"
                                   "  - match: \"never*\"\n"
                                   "    backend: cpu_ref\n");
    assert_string_equal(test_match(config, "meta-llama/Llama-3-8B"), "*Llama*");
    assert_string_equal(test_match(config, "mistralai/Mistral-7B"), "*");
    assert_string_equal(test_match(config, ""), "*");
    /* A rule after the catch-all can never be reached. */
    assert_string_equal(test_match(config, "never-seen"), "*");
    const ap_config_rule *rule = ap_config_match(config, "x");
    assert_ptr_equal(rule, ap_config_rule_at(config, 1));
    ap_config_destroy(config);
}

static void test_null_arguments(void **state) {
    (void)state;
    ap_config *config = NULL;
    assert_int_equal(ap_config_parse("version: 1", 10, "x", NULL), AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_config_parse(NULL, 5, "x", &config), AP_ERR_INVALID_ARGUMENT);
    assert_null(config);
    assert_int_equal(ap_config_load(NULL, &config), AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(ap_config_load("x.yaml", NULL), AP_ERR_INVALID_ARGUMENT);
    /* No source name: messages say <string>. */
    assert_int_equal(ap_config_parse(NULL, 0, NULL, &config), AP_ERR_CONFIG);
    assert_string_equal(ap_last_error(), "<string>:1:1: empty config");
    assert_int_equal(ap_config_version(NULL), 0);
    assert_int_equal(ap_config_rule_count(NULL), 0);
    assert_int_equal(ap_config_plugin_path_count(NULL), 0);
    assert_null(ap_config_plugin_path(NULL, 0));
    assert_null(ap_config_rule_at(NULL, 0));
    ap_config_destroy(NULL);
}

/* The text given by length, not up to a NUL: a caller may hand a slice of a larger buffer. */
static void test_parse_uses_length(void **state) {
    (void)state;
    const char *text = "version: 1\nrules: [{match: a, backend: cpu_ref}]\nthis is: not read";
    ap_config *config = NULL;
    size_t length = (size_t)(strstr(text, "this") - text);
    assert_int_equal(ap_config_parse(text, length, "slice", &config), AP_OK);
    assert_int_equal(ap_config_rule_count(config), 1);
    ap_config_destroy(config);
}

/* ---- files ------------------------------------------------------------------------------------ */

typedef struct test_dir {
    char path[PATH_MAX];
    char real[PATH_MAX];
} test_dir;

static void test_dir_make(test_dir *dir) {
    const char *base = getenv("TMPDIR");
    snprintf(dir->path, sizeof dir->path, "%s/ap-config-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(dir->path));
    assert_non_null(realpath(dir->path, dir->real));
}

static const char *test_write(const test_dir *dir, const char *name, const char *text) {
    static char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir->path, name);
    FILE *file = fopen(path, "w");
    assert_non_null(file);
    assert_int_equal(fwrite(text, 1, strlen(text), file), strlen(text));
    assert_int_equal(fclose(file), 0);
    return path;
}

static void test_remove(const test_dir *dir, const char *name) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir->path, name);
    assert_int_equal(unlink(path), 0);
}

static void test_load_resolves_plugin_path(void **state) {
    (void)state;
    test_dir dir;
    test_dir_make(&dir);
    const char *path = test_write(&dir, "models.yaml",
                                  "version: 1\n"
                                  "plugin_path: [plugins, ../shared/attnplug, /opt/x]\n"
                                  "rules: [{match: \"*\", backend: cpu_ref}]\n");
    ap_config *config = NULL;
    assert_int_equal(ap_config_load(path, &config), AP_OK);
    char expected[PATH_MAX + 64];
    assert_int_equal(ap_config_plugin_path_count(config), 3);
    snprintf(expected, sizeof expected, "%s/plugins", dir.real);
    assert_string_equal(ap_config_plugin_path(config, 0), expected);
    snprintf(expected, sizeof expected, "%s/../shared/attnplug", dir.real);
    assert_string_equal(ap_config_plugin_path(config, 1), expected);
    assert_string_equal(ap_config_plugin_path(config, 2), "/opt/x");
    ap_config_destroy(config);
    test_remove(&dir, "models.yaml");
    assert_int_equal(rmdir(dir.path), 0);
}

/* A path without a folder is relative to the working directory: so is its plugin_path. */
static void test_load_relative_path(void **state) {
    (void)state;
    test_dir dir;
    test_dir_make(&dir);
    test_write(&dir, "here.yaml",
               "version: 1\nplugin_path: [p]\nrules: [{match: \"*\", backend: cpu_ref}]\n");
    char previous[PATH_MAX];
    assert_non_null(getcwd(previous, sizeof previous));
    assert_int_equal(chdir(dir.path), 0);
    ap_config *config = NULL;
    ap_status status = ap_config_load("here.yaml", &config);
    assert_int_equal(chdir(previous), 0);
    assert_int_equal(status, AP_OK);
    char expected[PATH_MAX + 8];
    snprintf(expected, sizeof expected, "%s/p", dir.real);
    assert_string_equal(ap_config_plugin_path(config, 0), expected);
    ap_config_destroy(config);
    test_remove(&dir, "here.yaml");
    assert_int_equal(rmdir(dir.path), 0);
}

static void test_load_errors_name_the_path(void **state) {
    (void)state;
    test_dir dir;
    test_dir_make(&dir);
    char expected[PATH_MAX + 128];
    ap_config *config = NULL;

    const char *path = test_write(&dir, "bad.yaml",
                                  "version: 1\n"
                                  "rules:\n"
                                  "  - matches: \"*\"\n");
    assert_int_equal(ap_config_load(path, &config), AP_ERR_CONFIG);
    assert_null(config);
    snprintf(expected, sizeof expected, "%s:3:5: unknown key 'matches'", path);
    assert_starts_with(ap_last_error(), expected);

    path = test_write(&dir, "empty.yaml", "");
    assert_int_equal(ap_config_load(path, &config), AP_ERR_CONFIG);
    snprintf(expected, sizeof expected, "%s:1:1: empty config", path);
    assert_string_equal(ap_last_error(), expected);

    snprintf(expected, sizeof expected, "%s/missing.yaml", dir.path);
    assert_int_equal(ap_config_load(expected, &config), AP_ERR_NOT_FOUND);
    assert_null(config);
    assert_contains(ap_last_error(), expected);
    assert_contains(ap_last_error(), strerror(ENOENT));

    /* A folder opens but cannot be read. */
    assert_int_equal(ap_config_load(dir.path, &config), AP_ERR_CONFIG);
    assert_null(config);
    assert_contains(ap_last_error(), dir.path);
    assert_contains(ap_last_error(), strerror(EISDIR));

    test_remove(&dir, "bad.yaml");
    test_remove(&dir, "empty.yaml");
    assert_int_equal(rmdir(dir.path), 0);
}

/* A file larger than any read buffer step parses whole. */
static void test_load_large_file(void **state) {
    (void)state;
    test_dir dir;
    test_dir_make(&dir);
    size_t rules = 2000, capacity = 64 + rules * 64, used = 0;
    char *text = malloc(capacity);
    assert_non_null(text);
    used += (size_t)snprintf(text, capacity, "version: 1\nrules:\n");
    for (size_t i = 0; i < rules; i++)
        used += (size_t)snprintf(text + used, capacity - used,
                                 "  - {match: \"model-%zu\", backend: cpu_ref}\n", i);
    const char *path = test_write(&dir, "large.yaml", text);
    free(text);
    ap_config *config = NULL;
    assert_int_equal(ap_config_load(path, &config), AP_OK);
    assert_int_equal(ap_config_rule_count(config), rules);
    assert_string_equal(test_match(config, "model-1999"), "model-1999");
    assert_int_equal(ap_config_rule_at(config, 1999)->line, 2002);
    ap_config_destroy(config);
    test_remove(&dir, "large.yaml");
    assert_int_equal(rmdir(dir.path), 0);
}

/* The size limit is 16 MiB inclusive: a file of exactly 16,777,216 bytes loads, one byte more
 * is refused with the limit named. */
static void test_load_size_limit(void **state) {
    (void)state;
    const size_t limit = 16u << 20;
    test_dir dir;
    test_dir_make(&dir);
    char *text = malloc(limit + 2);
    assert_non_null(text);
    size_t used =
        (size_t)snprintf(text, limit, "version: 1\nrules: [{match: \"*\", backend: a}]\n");
    /* Comment lines of 64 bytes fill the rest, the last one cut to land on the exact size. */
    while (used < limit) {
        size_t line = limit - used < 64 ? limit - used : 64;
        memset(text + used, '#', line - 1);
        text[used + line - 1] = '\n';
        used += line;
    }
    text[limit] = '\0';
    const char *path = test_write(&dir, "limit.yaml", text);
    ap_config *config = NULL;
    if (ap_config_load(path, &config) != AP_OK) fail_msg("%s", ap_last_error());
    assert_int_equal(ap_config_rule_count(config), 1);
    ap_config_destroy(config);
    test_remove(&dir, "limit.yaml");

    text[limit] = '\n';
    text[limit + 1] = '\0';
    path = test_write(&dir, "over.yaml", text);
    free(text);
    config = NULL;
    assert_int_equal(ap_config_load(path, &config), AP_ERR_CONFIG);
    assert_null(config);
    assert_contains(ap_last_error(), "is larger than 16777216 bytes");
    test_remove(&dir, "over.yaml");
    assert_int_equal(rmdir(dir.path), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_example),
        cmocka_unit_test(test_option_values),
        cmocka_unit_test(test_match_first_wins),
        cmocka_unit_test(test_match_default_rule),
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_parse_uses_length),
        cmocka_unit_test(test_load_resolves_plugin_path),
        cmocka_unit_test(test_load_relative_path),
        cmocka_unit_test(test_load_errors_name_the_path),
        cmocka_unit_test(test_load_large_file),
        cmocka_unit_test(test_load_size_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
