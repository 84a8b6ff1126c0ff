/* test_expect.h: the failure counter and EXPECT of the host tests written without CMocka (the
 * backends' validate and plan tests), the plugin they open, and the validate() verdict they all
 * check. */
#ifndef AP_TEST_EXPECT_H
#define AP_TEST_EXPECT_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "plugin_api.h"

static int failures;

/* Counts a failure and says where and why, then goes on: one run reports every broken case. */
#define EXPECT(cond, ...) \
    do { \
        if (!(cond)) { \
            failures++; \
            fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__); \
            fprintf(stderr, "\n"); \
        } \
    } while (0)

/* Opens the plugin file at `path` and negotiates at this header's ABI: the descriptor named
 * `name`, with *so (for dlclose) and *negotiate (for further offers) set, or NULL after saying
 * why. */
static inline const ap_descriptor *ap_test_open_plugin(const char *path, const char *name,
                                                       void **so,
                                                       ap_plugin_negotiate_fn *negotiate) {
    *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (*so == NULL) {
        printf("dlopen %s: %s\n", path, dlerror());
        return NULL;
    }
    *negotiate = (ap_plugin_negotiate_fn)dlsym(*so, AP_PLUGIN_ENTRY);
    EXPECT(*negotiate != NULL, "entry symbol");
    if (*negotiate == NULL) return NULL;
    ap_negotiate_offer offer = {sizeof offer, AP_ABI_VERSION_MAJOR, AP_ABI_VERSION_MINOR};
    ap_negotiate_reply reply = {.struct_size = sizeof reply};
    char text[256] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    EXPECT((*negotiate)(&offer, &reply, &msg) == AP_OK, "negotiate: %s", text);
    if (reply.descriptor == NULL) return NULL;
    EXPECT(strcmp(reply.descriptor->name, name) == 0, "name");
    return reply.descriptor;
}

/* An H100 as the core describes it: compute capability 9.0, 132 SMs, 227 KB of shared memory a
 * block may opt into. */
static inline ap_device ap_test_h100(void) {
    ap_device d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.ordinal = 0;
    d.cc_major = 9;
    d.sm_count = 132;
    d.smem_per_block_optin = 232448;
    snprintf(d.name, sizeof d.name, "NVIDIA H100 80GB HBM3");
    return d;
}

/* A backend's validate() must refuse with a line containing `reason`, or accept (no line) when
 * reason is NULL. */
static inline void ap_test_expect_verdict(const ap_vtable *vt, const char *what, const ap_model *m,
                                          const ap_options *o, const ap_device *d,
                                          const char *reason) {
    char text[1024] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    ap_status st = vt->validate(m, o, d, &msg);
    if (reason == NULL)
        EXPECT(st == AP_OK && text[0] == '\0', "%s accepted, got %d '%s'", what, (int)st, text);
    else
        EXPECT(st == AP_ERR_REFUSED && strstr(text, reason) != NULL,
               "%s refused with '%s', got %d '%s'", what, reason, (int)st, text);
}

#endif /* AP_TEST_EXPECT_H */
