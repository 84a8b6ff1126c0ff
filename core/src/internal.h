/* internal.h: the core's private structures and helpers, shared by the files of core/src. */
#ifndef ATTNPLUG_INTERNAL_H
#define ATTNPLUG_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

/* The library builds with -fvisibility=hidden; the host API must stay exported. Every core file
 * includes attnplug.h through this header, so its declarations (and thus the definitions) get
 * default visibility here, while the helpers below stay internal. */
#pragma GCC visibility push(default)
#include "attnplug.h"
#pragma GCC visibility pop

/* ---- errors (error.c) ----------------------------------------------------------------------
 * Set this thread's last error and return `status`, so failing paths read
 *     return ap_error_set(AP_ERR_INVALID_ARGUMENT, "model.num_kv_heads is %d", n); */
ap_status ap_error_set(ap_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void ap_error_clear(void);

/* ---- logging (log.c) -----------------------------------------------------------------------
 * AP_DEBUG=load,select,config,instance or all. Messages go to stderr, one line each. */
typedef enum ap_log_category {
    AP_LOG_LOAD = 1u << 0,
    AP_LOG_SELECT = 1u << 1,
    AP_LOG_CONFIG = 1u << 2,
    AP_LOG_INSTANCE = 1u << 3
} ap_log_category;
int ap_log_enabled(ap_log_category category);
void ap_log(ap_log_category category, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- names (names.c) ------------------------------------------------------------------------
 * Whether `name` has the form every backend name takes, [a-z0-9_]+: plugins declare it, configs
 * write it. */
int ap_backend_name_valid(const char *name);

/* ---- the registry (registry.c) -------------------------------------------------------------- */

/* One loaded backend. Never freed or dlclose'd before the registry is destroyed. */
typedef struct ap_plugin {
    char *path;                    /* the file it came from */
    void *handle;                  /* dlopen handle */
    const ap_descriptor *desc;     /* from the plugin's negotiation reply */
    uint32_t abi_major, abi_minor; /* what the plugin serves */
} ap_plugin;

/* What became of one file. */
typedef struct ap_file_entry {
    char *path;
    ap_status status;
    char *message; /* "" when loaded */
    char *backend; /* NULL when refused before the name was known */
} ap_file_entry;

struct ap_registry {
    pthread_mutex_t lock; /* guards everything below */
    char **dirs;          /* host folders, then ap_registry_add_dir folders */
    size_t num_dirs;
    uint32_t flags;
    ap_file_entry *files;
    size_t num_files, cap_files;
    ap_plugin **plugins; /* sorted by backend name */
    size_t num_plugins, cap_plugins;
    atomic_int live_instances; /* open ap_instance objects: no unload while > 0 */
};

/* The plugin serving `name`, or NULL. Takes the lock. */
ap_plugin *ap_registry_find_plugin(ap_registry *registry, const char *name);

/* Split of the registry across registry.c, discover.c and load.c. Callers hold registry->lock.
 * load_locked opens, negotiates, validates and records one file (a path already recorded
 * answers with its recorded status); lookup_locked is the binary search of `plugins`. */
ap_status ap_registry_load_locked(ap_registry *registry, const char *path);
ap_plugin *ap_registry_lookup_locked(const ap_registry *registry, const char *name);

/* ---- instances (instance.c) ----------------------------------------------------------------- */

/* Which page arrays a planned batch gave: only an embedding batch on a skip-KV backend may give
 * none, and then it has no cache to read or write. */
typedef enum ap_batch_pages {
    AP_BATCH_PAGES_NONE, /* every page array (device and host) NULL */
    AP_BATCH_PAGES_SOME, /* some, not all the backend reads */
    AP_BATCH_PAGES_ALL   /* the device arrays, and the host mirrors when the backend reads them */
} ap_batch_pages;

struct ap_instance {
    ap_registry *registry;
    ap_plugin *plugin;
    ap_backend *backend;
    ap_model model; /* options applied; name owned below */
    char *model_name;
    ap_device device;
    ap_hook_append_kv_v1 append_kv; /* resolved once at open; NULL when absent */
    ap_hook_pack_prefix_chunk_kv_v1 pack_prefix_chunk_kv;
    ap_hook_cuda_graph_v1 cuda_graph;
    ap_hook_merge_state_v1 merge_state;
    char message[1024]; /* the plugin writes its error here */
    /* What the last successful init_metadata planned, for the forward checks (check.c). */
    int32_t batch_planned; /* 0 until a batch was planned (or after a failed plan) */
    ap_forward_mode batch_mode;
    int32_t batch_num_tokens;
    int32_t batch_max_page; /* largest page index in the host mirrors; -1 unknown */
    ap_batch_pages batch_pages;
    int32_t batch_num_kv_tokens; /* rows of the ragged K/V source (ABI 1.1); -1: none */
};

/* ---- selection (select.c) ------------------------------------------------------------------- */

/* Options every field unset: what a backend sees when the host passes none. */
extern const ap_options ap_options_default;

/* ---- argument checks before a backend is called (check.c) ------------------------------------
 * Each returns AP_OK, or a status with one line naming the argument, the expected and the
 * actual value in `msg`. They read host memory only: host mirrors, and tensors on kDLCPU. */
typedef struct ap_batch_facts {
    int32_t max_page;      /* largest page index in the host mirrors; -1 unknown */
    ap_batch_pages pages;  /* which page arrays the batch gave */
    int32_t num_kv_tokens; /* rows of the ragged K/V source; -1 when the batch has none */
} ap_batch_facts;
ap_status ap_check_batch(const ap_instance *instance, const ap_batch *batch, ap_batch_facts *facts,
                         ap_msgbuf *msg);
ap_status ap_check_forward(const ap_instance *instance, ap_forward_mode mode, const ap_layer *layer,
                           const ap_forward_args *args, ap_msgbuf *msg);
ap_status ap_check_append_kv(const ap_instance *instance, const ap_layer *layer,
                             const ap_append_kv_args *args, ap_msgbuf *msg);
ap_status ap_check_pack_kv(const ap_instance *instance, const ap_pack_kv_args *args,
                           ap_msgbuf *msg);
ap_status ap_check_merge_state(const ap_instance *instance, const ap_merge_state_args *args,
                               ap_msgbuf *msg);

/* A fresh message buffer over `text`. */
static inline ap_msgbuf ap_msgbuf_over(char *text, size_t capacity) {
    ap_msgbuf msg = {sizeof(ap_msgbuf), text, capacity, 0};
    if (capacity > 0) text[0] = '\0';
    return msg;
}

#endif /* ATTNPLUG_INTERNAL_H */
