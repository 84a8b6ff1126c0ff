/* test_config_errors.c: every kind of bad config gives AP_ERR_CONFIG at its exact line:column. */
#include "config_test.h"

/* The lines every rule-level case starts from. */
#define HEAD "version: 1\nrules:\n"
#define RULE_OPEN HEAD "  - match: \"*\"\n" /* the rule's map starts at 3:5 */
#define RULE_WITH_OPTIONS RULE_OPEN "    backend: cpu_ref\n    options:\n" /* entries: 6:7 */

static void test_malformed_yaml(void **state) {
    (void)state;
    /* Unclosed flow list: libyaml notices at the end of input and names where it started. */
    test_parse_fails_at(RULE_OPEN "    backends: [cpu_ref, flashinfer_like\n", 5, 1,
                        "malformed YAML: did not find expected ',' or ']' (while parsing a flow "
                        "sequence at 4:15)");
    /* A tab may not indent. */
    test_parse_fails_at(HEAD "\t- match: \"*\"\n", 3, 1,
                        "malformed YAML: found character that cannot start any token");
    /* Unbalanced quote. */
    test_parse_fails_at(HEAD "  - match: \"abc\n", 4, 1,
                        "malformed YAML: found unexpected end of stream (while scanning a quoted "
                        "scalar at 3:12)");
    /* Invalid UTF-8: the reader knows only a byte offset; it is placed at line and column. */
    test_parse_fails_at("version: 1\nrules: \xff\n", 2, 8,
                        "malformed YAML: invalid leading UTF-8 octet");
}

static void test_empty(void **state) {
    (void)state;
    test_parse_fails_at("", 1, 1, "empty config");
    test_parse_fails_at("# only a comment\n\n", 1, 1, "empty config");
    test_parse_fails_at("---\n", 1, 1, "empty config");
    test_parse_fails_at("~\n", 1, 1,
                        "expected a mapping with version, plugin_path and rules at "
                        "the top, got the value '~'");
}

static void test_wrong_types(void **state) {
    (void)state;
    test_parse_fails_at("- version\n- 1\n", 1, 1,
                        "expected a mapping with version, plugin_path and rules at the top, got a "
                        "list");
    test_parse_fails_at(HEAD "  match: \"*\"\n", 3, 3, "expected a list of rules, got a mapping");
    test_parse_fails_at(HEAD "  - [cpu_ref]\n", 3, 5,
                        "expected a rule (a mapping with match and backend or backends), got a "
                        "list");
    test_parse_fails_at(RULE_OPEN "    backends: {cpu_ref: 1}\n", 4, 15,
                        "expected a list of backend names, got a mapping");
    test_parse_fails_at(RULE_OPEN "    backends: cpu_ref\n", 4, 15,
                        "expected a list of backend names, got the value 'cpu_ref' (write "
                        "[cpu_ref], or 'backend: cpu_ref' for one explicit backend)");
    test_parse_fails_at(RULE_OPEN "    backend: [cpu_ref]\n", 4, 14,
                        "expected one backend name, got a list");
    test_parse_fails_at(RULE_OPEN "    backend: {name: cpu_ref}\n", 4, 14,
                        "expected a backend name, got a mapping");
    test_parse_fails_at(RULE_OPEN "    backends: [[cpu_ref]]\n", 4, 16,
                        "expected a backend name, got a list");
    test_parse_fails_at(RULE_OPEN "    backend: cpu_ref\n    options: [page_size]\n", 5, 14,
                        "expected a mapping of options, got a list");
    test_parse_fails_at(HEAD "  - match: [a]\n    backend: cpu_ref\n", 3, 12,
                        "expected a model-name glob, got a list");
    test_parse_fails_at(HEAD "  - match:\n    backend: cpu_ref\n", 3, 11,
                        "expected a model-name glob, got nothing");
    test_parse_fails_at("version: 1\nplugin_path: plugins\n", 2, 14,
                        "expected a list of folders, got the value 'plugins'");
    test_parse_fails_at("version: 1\nplugin_path: [\"\"]\n", 2, 15,
                        "expected a folder, got the quoted string ''");
    test_parse_fails_at(RULE_WITH_OPTIONS "      backend_options: [cpu_ref]\n", 6, 24,
                        "expected a mapping of backend names, got a list");
    test_parse_fails_at(RULE_WITH_OPTIONS "      backend_options: {cpu_ref: fast}\n", 6, 34,
                        "expected a mapping of option keys, got the value 'fast'");
    test_parse_fails_at(RULE_WITH_OPTIONS "      backend_options:\n        cpu_ref: {mode: [a]}\n",
                        7, 25, "option 'cpu_ref.mode' needs a value, got a list");
    /* In flow style libyaml places a missing value at the token that ends it (the '}'). */
    test_parse_fails_at(RULE_WITH_OPTIONS "      backend_options:\n        cpu_ref: {mode: }\n", 7,
                        25, "option 'cpu_ref.mode' needs a value, got nothing");
    test_parse_fails_at(RULE_OPEN "    ? [a, b]\n    : c\n", 4, 7,
                        "expected a key name, got a list");
}

static void test_unknown_keys(void **state) {
    (void)state;
    test_parse_fails_at("version: 1\nrule:\n  - match: \"*\"\n", 2, 1,
                        "unknown key 'rule' (known: version, plugin_path, rules); did you mean "
                        "'rules'?");
    test_parse_fails_at("version: 1\nbackends: [cpu_ref]\n", 2, 1,
                        "unknown key 'backends' (known: version, plugin_path, rules)");
    test_parse_fails_at(RULE_OPEN "    backend: cpu_ref\n    option: {page_size: 16}\n", 5, 5,
                        "unknown key 'option' (known: match, backend, backends, options); did "
                        "you mean 'options'?");
    test_parse_fails_at(RULE_WITH_OPTIONS "      pagesize: 16\n", 6, 7,
                        "unknown key 'pagesize' (known: page_size, kv_dtype, prefix_cache, "
                        "chunked_prefill, cuda_graphs, backend_options); did you mean "
                        "'page_size'?");
    test_parse_fails_at(RULE_WITH_OPTIONS "      page_size: 16\n      graphs: on\n", 7, 7,
                        "unknown key 'graphs'");
}

static void test_backend_and_backends(void **state) {
    (void)state;
    test_parse_fails_at(RULE_OPEN "    backend: cpu_ref\n    backends: [cpu_ref]\n", 5, 5,
                        "a rule takes 'backend' (one explicit backend) or 'backends' (a "
                        "preference list), not both");
    test_parse_fails_at(RULE_OPEN "    backends: [cpu_ref]\n    backend: cpu_ref\n", 5, 5,
                        "not both");
    test_parse_fails_at(RULE_OPEN "    options: {page_size: 16}\n", 3, 5,
                        "rule has neither 'backend' nor 'backends'");
    test_parse_fails_at(RULE_OPEN "    backends: []\n", 4, 15, "empty list of backends");
    test_parse_fails_at(HEAD "  - backend: cpu_ref\n", 3, 5,
                        "rule has no 'match' (a model-name glob)");
    test_parse_fails_at(HEAD "  - match: \"\"\n    backend: cpu_ref\n", 3, 12,
                        "expected a model-name glob, got the quoted string ''");
}

static void test_backend_names(void **state) {
    (void)state;
    test_parse_fails_at(RULE_OPEN "    backends: [cpu_ref, Flash-Infer]\n", 4, 25,
                        "backend name 'Flash-Infer' may hold only a-z, 0-9 and '_'");
    test_parse_fails_at(RULE_OPEN "    backend: \"cpu ref\"\n", 4, 14,
                        "backend name 'cpu ref' may hold only a-z, 0-9 and '_'");
    test_parse_fails_at(RULE_OPEN "    backend: \"cpu\\0ref\"\n", 4, 14,
                        "expected a backend name, got a string holding a NUL character");
    test_parse_fails_at(RULE_OPEN "    backends: [cpu_ref, cpu_ref]\n", 4, 25,
                        "backend 'cpu_ref' listed twice (first at 4:16)");
    test_parse_fails_at(RULE_WITH_OPTIONS "      backend_options:\n        trtllm_mha: {x: 1}\n", 7,
                        9, "backend_options for 'trtllm_mha', which this rule does not list");
}

/* page_size's value sits at 6:18, kv_dtype's at 6:17, prefix_cache's at 6:21. */
static void test_bad_values(void **state) {
    (void)state;
    /* A missing value is placed right after the colon, at 6:17, where it should have been. */
    static const struct {
        const char *value, *got;
        int column;
    } pages[] = {
        {"0", "got '0'", 18},
        {"-16", "got '-16'", 18},
        {"16.5", "got '16.5'", 18},
        {"sixteen", "got 'sixteen'", 18},
        {"0x10", "got '0x10'", 18},
        {"016", "got '016'", 18},
        {"+0", "got '+0'", 18},
        {"2147483648", "got '2147483648'", 18},
        {"\"16\"", "got the quoted string '16'", 18},
        {"[16]", "got a list", 18},
        {"", "got nothing", 17},
    };
    char text[256];
    for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++) {
        snprintf(text, sizeof text, RULE_WITH_OPTIONS "      page_size: %s\n", pages[i].value);
        char needle[96];
        snprintf(needle, sizeof needle, "page_size must be a positive integer, %s", pages[i].got);
        test_parse_fails_at(text, 6, pages[i].column, needle);
    }
    test_parse_fails_at(RULE_WITH_OPTIONS "      kv_dtype: bf32\n", 6, 17,
                        "unknown kv_dtype 'bf32' (known: bf16, f16, fp8_e4m3, fp8_e5m2, nvfp4)");
    /* A real dtype, but no KV-cache type. */
    test_parse_fails_at(RULE_WITH_OPTIONS "      kv_dtype: f32\n", 6, 17, "unknown kv_dtype 'f32'");
    test_parse_fails_at(RULE_WITH_OPTIONS "      kv_dtype: none\n", 6, 17,
                        "unknown kv_dtype 'none'");
    test_parse_fails_at(RULE_WITH_OPTIONS "      kv_dtype: [bf16]\n", 6, 17,
                        "expected a KV-cache dtype name, got a list");
    test_parse_fails_at(RULE_WITH_OPTIONS "      prefix_cache: maybe\n", 6, 21,
                        "prefix_cache must be true or false (or yes/no, on/off), got the value "
                        "'maybe'");
    test_parse_fails_at(RULE_WITH_OPTIONS "      prefix_cache: 1\n", 6, 21,
                        "prefix_cache must be true or false (or yes/no, on/off), got the value "
                        "'1'");
    test_parse_fails_at(RULE_WITH_OPTIONS "      cuda_graphs: \"true\"\n", 6, 20,
                        "cuda_graphs must be true or false (or yes/no, on/off), got the quoted "
                        "string 'true'");
    test_parse_fails_at(RULE_WITH_OPTIONS "      chunked_prefill: True\n", 6, 24,
                        "chunked_prefill must be true or false");
}

static void test_duplicate_keys(void **state) {
    (void)state;
    test_parse_fails_at(RULE_WITH_OPTIONS "      page_size: 16\n"
                                          "      kv_dtype: bf16\n"
                                          "      page_size: 32\n",
                        8, 7, "duplicate key 'page_size' (first at 6:7)");
    test_parse_fails_at("version: 1\nrules: []\nversion: 1\n", 3, 1,
                        "duplicate key 'version' (first at 1:1)");
    test_parse_fails_at(RULE_OPEN "    match: \"x\"\n    backend: cpu_ref\n", 4, 5,
                        "duplicate key 'match' (first at 3:5)");
    test_parse_fails_at(RULE_WITH_OPTIONS "      backend_options:\n"
                                          "        cpu_ref: {a: 1, a: 2}\n",
                        7, 25, "duplicate key 'a' (first at 7:19)");
}

static void test_version(void **state) {
    (void)state;
    test_parse_fails_at("version: 2\nrules: [{match: \"*\", backend: cpu_ref}]\n", 1, 10,
                        "unsupported config version 2 (this attnplug reads version 1)");
    /* The version is checked before the rest, whose keys a newer format may have changed. */
    test_parse_fails_at("rules: [{match: \"*\", backend: cpu_ref, new_key: 1}]\nversion: 3\n", 2,
                        10, "unsupported config version 3");
    test_parse_fails_at("version: 0\nrules: []\n", 1, 10, "unsupported config version 0");
    test_parse_fails_at("version: \"1\"\nrules: []\n", 1, 10,
                        "version must be an integer, got the quoted string '1'");
    test_parse_fails_at("version: 1.0\nrules: []\n", 1, 10,
                        "version must be an integer, got '1.0'");
    test_parse_fails_at("rules:\n  - match: \"*\"\n    backend: cpu_ref\n", 1, 1,
                        "missing 'version' (this attnplug reads version 1)");
}

static void test_rules_missing(void **state) {
    (void)state;
    test_parse_fails_at("version: 1\nplugin_path: []\n", 1, 1, "missing 'rules' (a list of rules)");
    test_parse_fails_at("version: 1\nrules: []\n", 2, 8,
                        "empty list of rules: no model would ever match");
    test_parse_fails_at("version: 1\nrules:\n", 2, 7, "expected a list of rules, got nothing");
}

static void test_yaml_features_refused(void **state) {
    (void)state;
    test_parse_fails_at(HEAD "  - match: &m \"x*\"\n    backend: cpu_ref\n", 3, 12,
                        "YAML anchors (&m) are not supported; write the value out");
    test_parse_fails_at(RULE_OPEN "    backends: *list\n", 4, 15,
                        "YAML aliases (*list) are not supported");
    test_parse_fails_at(RULE_OPEN "    backend: !!str cpu_ref\n", 4, 14,
                        "YAML tags (tag:yaml.org,2002:str) are not supported");
    /* An unquoted leading '*' starts an alias in YAML: the message says to quote the glob. */
    test_parse_fails_at(HEAD "  - match: *\n    backend: cpu_ref\n", 3, 12,
                        "a glob starting with '*' must be quoted");
    test_parse_fails_at(HEAD "  - match: *Llama*\n    backend: cpu_ref\n", 3, 12,
                        "a glob starting with '*' must be quoted");
    test_parse_fails_at("version: 1\nrules: [{match: \"*\", backend: cpu_ref}]\n---\nversion: 1\n",
                        3, 1, "a second YAML document; a config holds exactly one");
}

static void test_nesting_bounded(void **state) {
    (void)state;
    char text[256];
    int used = snprintf(text, sizeof text, "plugin_path: ");
    for (int i = 0; i < 40; i++) text[used++] = '[';
    for (int i = 0; i < 40; i++) text[used++] = ']';
    text[used] = '\0';
    /* The root map is level 1 and plugin_path's list level 2 at column 14: level 33 is at 45. */
    test_parse_fails_at(text, 1, 45, "nesting deeper than 32 levels");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_yaml),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_backend_and_backends),
        cmocka_unit_test(test_backend_names),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_rules_missing),
        cmocka_unit_test(test_yaml_features_refused),
        cmocka_unit_test(test_nesting_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
