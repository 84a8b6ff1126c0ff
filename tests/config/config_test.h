/* config_test.h: assertions shared by the config tests: parse or fail, error prefix and text. */
#ifndef AP_CONFIG_TEST_H
#define AP_CONFIG_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "attnplug.h"
#include "tests/common/test_model.h"

/* The source name every parsed test config carries in its messages. */
#define TEST_SOURCE "t.yaml"

#define assert_contains(haystack, needle) \
    do { \
        const char *test_haystack_ = (haystack), *test_needle_ = (needle); \
        if (test_haystack_ == NULL || strstr(test_haystack_, test_needle_) == NULL) \
            fail_msg("expected \"%s\"\n  to contain \"%s\"", \
                     test_haystack_ ? test_haystack_ : "(null)", test_needle_); \
    } while (0)

#define assert_starts_with(text, prefix) \
    do { \
        const char *test_text_ = (text), *test_prefix_ = (prefix); \
        if (test_text_ == NULL || strncmp(test_text_, test_prefix_, strlen(test_prefix_)) != 0) \
            fail_msg("expected \"%s\"\n  to start with \"%s\"", \
                     test_text_ ? test_text_ : "(null)", test_prefix_); \
    } while (0)

/* Parse `text`, failing the test with the config's own message when it does not parse. */
static inline ap_config *test_parse(const char *text) {
    ap_config *config = NULL;
    ap_status status = ap_config_parse(text, strlen(text), TEST_SOURCE, &config);
    if (status != AP_OK) fail_msg("parse failed (%d): %s", (int)status, ap_last_error());
    assert_non_null(config);
    return config;
}

/* Parse `text`, expecting AP_ERR_CONFIG whose message starts "t.yaml:LINE:COLUMN: " and holds
 * `needle`. */
static inline void test_parse_fails_at(const char *text, int line, int column, const char *needle) {
    ap_config *config = (ap_config *)(uintptr_t)1;
    ap_status status = ap_config_parse(text, strlen(text), TEST_SOURCE, &config);
    if (status != AP_ERR_CONFIG)
        fail_msg("expected AP_ERR_CONFIG, got %d (%s) for:\n%s", (int)status, ap_last_error(),
                 text);
    assert_null(config);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s:%d:%d: ", TEST_SOURCE, line, column);
    assert_starts_with(ap_last_error(), prefix);
    assert_contains(ap_last_error(), needle);
}

/* The rule's backends as "a,b,c", for comparing whole lists at once. */
static inline const char *test_backends(const ap_config_rule *rule) {
    static char text[512];
    size_t used = 0;
    text[0] = '\0';
    for (size_t i = 0; i < rule->num_backends; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%s", i ? "," : "",
                                 rule->backends[i]);
    return text;
}

static inline const char *test_env(const char *name) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') fail_msg("%s is not set: run through meson test", name);
    return value;
}

/* A registry of cpu_ref alone, from the build folder meson test names. */
static inline ap_registry *test_registry_make(void) {
    const char *dirs[] = {test_env("AP_TEST_CPU_REF_DIR")};
    ap_registry_options options = {sizeof options, dirs, 1, AP_REGISTRY_NO_DEFAULT_PATHS};
    ap_registry *made = NULL;
    assert_int_equal(ap_registry_create(&options, &made), AP_OK);
    assert_int_equal(ap_registry_scan(made), AP_OK);
    return made;
}

/* A small GQA model every backend here accepts: bf16, page 16. */
static inline ap_model test_model(const char *name) {
    ap_model m = ap_test_model(name, 4, 2, 64, 64, AP_DTYPE_BF16, AP_DTYPE_BF16);
    m.max_kv_len = 256;
    return m;
}

#endif /* AP_CONFIG_TEST_H */
