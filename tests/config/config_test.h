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

#endif /* AP_CONFIG_TEST_H */
