/* fixture_plugin.c: one tiny CPU backend, built many times over with a defect chosen by macros. */
#include <stdlib.h>
#include <string.h>

#include "plugin_api.h"

/* Defaults make the good plugin; each fixture's c_args override one thing. Hostile text is
 * spelled here: escapes do not survive the trip through a build file's command line. */
#ifdef FIXTURE_CTRL_NAME
#define FIXTURE_NAME "evil\n\033[31mname\a"
#endif
#ifdef FIXTURE_CTRL_DESCRIPTION
#define FIXTURE_DESCRIPTION "fine\r\033[2Jforged line\n"
#endif
#ifndef FIXTURE_NAME
#define FIXTURE_NAME "good"
#endif
#ifndef FIXTURE_ABI_MAJOR
#define FIXTURE_ABI_MAJOR AP_ABI_VERSION_MAJOR
#endif
#ifndef FIXTURE_ABI_MINOR
#define FIXTURE_ABI_MINOR AP_ABI_VERSION_MINOR
#endif
#ifndef FIXTURE_DESCRIPTION
#define FIXTURE_DESCRIPTION "test fixture " FIXTURE_NAME
#endif
/* Text no terminal should receive raw: a forged line, a colour change, a bell, a clear screen. */
#define FIXTURE_HOSTILE_TEXT "bad\n\033[31mforged: all good\033[0m\a\r\033[2J"
#ifndef FIXTURE_VTABLE_SIZE
#define FIXTURE_VTABLE_SIZE sizeof(ap_vtable)
#endif
/* No export: the entry stays hidden, the mistake of a plugin built without AP_PLUGIN_EXPORT. */
#ifdef FIXTURE_NO_ENTRY
#define FIXTURE_ENTRY_VISIBILITY __attribute__((visibility("hidden")))
#else
#define FIXTURE_ENTRY_VISIBILITY AP_PLUGIN_EXPORT
#endif

#ifdef FIXTURE_NEEDS_STUB
int ap_stub_answer(void); /* from a library whose file the loader cannot find */
#endif

struct ap_backend {
    int32_t page_size;
    int32_t num_kv_heads;
    int32_t head_dim;
};

static ap_status fixture_validate(const ap_model *model, const ap_options *options,
                                  const ap_device *device, ap_msgbuf *reasons) {
    (void)model, (void)options, (void)device, (void)reasons;
#ifdef FIXTURE_CTRL_MESSAGES
    /* Refuses page size 8 only, so the same plugin can also reach create. */
    if (model->page_size == 8) {
        ap_msgbuf_add(reasons, "page size 8: " FIXTURE_HOSTILE_TEXT);
        return AP_ERR_UNSUPPORTED;
    }
#endif
    return AP_OK;
}

static ap_status fixture_create(const ap_model *model, const ap_options *options,
                                const ap_device *device, ap_backend **out, ap_msgbuf *msg) {
    (void)options, (void)device;
#if defined(FIXTURE_CREATE_FAILS)
    (void)model;
    *out = NULL;
    ap_msgbuf_add(msg, "fixture '%s' fails create on purpose", FIXTURE_NAME);
    return AP_ERR_OUT_OF_MEMORY;
#elif defined(FIXTURE_CREATE_NULL)
    (void)model, (void)msg;
    *out = NULL;
    return AP_OK;
#elif defined(FIXTURE_CREATE_STATUS)
    (void)model;
    *out = NULL;
    ap_msgbuf_add(msg, "fixture '%s' answers a status no core knows", FIXTURE_NAME);
    return (ap_status)FIXTURE_CREATE_STATUS;
#elif defined(FIXTURE_CTRL_MESSAGES)
    (void)model;
    *out = NULL;
    ap_msgbuf_add(msg, "create: " FIXTURE_HOSTILE_TEXT);
    ap_msgbuf_add(msg, "second line");
    return AP_ERR_REFUSED;
#else
    ap_backend *backend = malloc(sizeof *backend);
    if (backend == NULL) {
        ap_msgbuf_add(msg, "out of memory");
        return AP_ERR_OUT_OF_MEMORY;
    }
    backend->page_size = model->page_size;
    backend->num_kv_heads = model->num_kv_heads;
    backend->head_dim = model->head_dim_qk;
    *out = backend;
    return AP_OK;
#endif
}

static void fixture_destroy(ap_backend *backend) {
    free(backend);
}

static ap_status fixture_get_kv_spec(ap_backend *backend, ap_kv_spec *out, ap_msgbuf *msg) {
    (void)msg;
    /* bf16/f16 elements: two bytes each, page_size tokens of every KV head. */
    size_t bytes =
        (size_t)backend->page_size * (size_t)backend->num_kv_heads * (size_t)backend->head_dim * 2;
    *out = (ap_kv_spec){sizeof *out, bytes, bytes, 0, 16};
    return AP_OK;
}

static ap_status fixture_init_metadata(ap_backend *backend, const ap_batch *batch, void *stream,
                                       ap_msgbuf *msg) {
    (void)backend, (void)batch, (void)stream, (void)msg;
    return AP_OK;
}

static ap_status fixture_forward(ap_backend *backend, const ap_layer *layer,
                                 const ap_forward_args *args, void *stream, ap_msgbuf *msg) {
    (void)backend, (void)layer, (void)args, (void)stream;
    ap_msgbuf_add(msg, "fixture '%s' computes nothing", FIXTURE_NAME);
    return AP_ERR_UNSUPPORTED;
}

static void *fixture_get_hook(ap_backend *backend, const char *name) {
    (void)backend, (void)name;
    return NULL;
}

static const ap_caps fixture_caps = {
    .struct_size = sizeof(ap_caps),
    .device_kinds = AP_DEVICE_KIND_CPU,
    .attn_kinds = AP_ATTN_BIT(AP_ATTN_MHA),
    .q_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16),
    .kv_dtypes = AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16),
    .phases = AP_PHASE_EXTEND | AP_PHASE_DECODE,
    .cuda_graph = AP_GRAPH_NONE,
};

static const ap_vtable fixture_vtable = {
    .struct_size = FIXTURE_VTABLE_SIZE,
    .validate = fixture_validate,
    .create = fixture_create,
    .destroy = fixture_destroy,
    .get_kv_spec = fixture_get_kv_spec,
    .init_metadata = fixture_init_metadata,
    .forward_extend = fixture_forward,
#ifdef FIXTURE_NULL_DECODE
    .forward_decode = NULL,
#else
    .forward_decode = fixture_forward,
#endif
    .get_hook = fixture_get_hook,
};

static const ap_descriptor fixture_descriptor = {
    .struct_size = sizeof(ap_descriptor),
    .name = FIXTURE_NAME,
    .version = "0.0.1",
    .description = FIXTURE_DESCRIPTION,
    .caps = &fixture_caps,
    .vtable = &fixture_vtable,
};

FIXTURE_ENTRY_VISIBILITY ap_status ap_plugin_negotiate(const ap_negotiate_offer *offer,
                                                       ap_negotiate_reply *reply, ap_msgbuf *msg);

FIXTURE_ENTRY_VISIBILITY ap_status ap_plugin_negotiate(const ap_negotiate_offer *offer,
                                                       ap_negotiate_reply *reply, ap_msgbuf *msg) {
    (void)offer;
#ifdef FIXTURE_NEEDS_STUB
    if (ap_stub_answer() != 42) return AP_ERR_INTERNAL;
#endif
    reply->struct_size = sizeof *reply;
    reply->plugin_abi_major = FIXTURE_ABI_MAJOR;
    reply->plugin_abi_minor = FIXTURE_ABI_MINOR;
#ifdef FIXTURE_NEGOTIATE_FAILS
    (void)fixture_descriptor;
    reply->descriptor = NULL;
    ap_msgbuf_add(msg, "fixture refuses every core on purpose");
    return AP_ERR_ABI_MISMATCH;
#else
    (void)msg;
    reply->descriptor = &fixture_descriptor;
#ifdef FIXTURE_LONG_NAME
    /* The same descriptor under a 10 KB name, of valid characters. */
    static char long_name[10 * 1024 + 1];
    static ap_descriptor long_descriptor;
    memset(long_name, 'a', sizeof long_name - 1);
    long_descriptor = fixture_descriptor;
    long_descriptor.name = long_name;
    reply->descriptor = &long_descriptor;
#endif
    return AP_OK;
#endif
}
