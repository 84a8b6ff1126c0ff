/* load.c: open one plugin file, negotiate its ABI, validate its descriptor, record the outcome. */
#include <dlfcn.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Sizes a struct must reach to hold every field ABI 1.0 defines. Later minors append fields;
 * these minima stay, so a 1.0 plugin keeps loading in a 1.x core. */
#define AP_DESCRIPTOR_MIN_SIZE (offsetof(ap_descriptor, vtable) + sizeof(const ap_vtable *))
#define AP_CAPS_MIN_SIZE (offsetof(ap_caps, needs_host_mirrors) + sizeof(int32_t))

#define AP_LOAD_MESSAGE_CAPACITY 8192 /* room for two long paths (a duplicate) */

/* The required vtable entries, in struct order, so a too-small vtable names the first it lacks. */
#define AP_REQUIRED_ENTRY(field) \
    { #field, offsetof(ap_vtable, field) }
static const struct {
    const char *name;
    size_t offset;
} ap_required_entries[] = {
    AP_REQUIRED_ENTRY(validate),       AP_REQUIRED_ENTRY(create),
    AP_REQUIRED_ENTRY(destroy),        AP_REQUIRED_ENTRY(get_kv_spec),
    AP_REQUIRED_ENTRY(init_metadata),  AP_REQUIRED_ENTRY(forward_extend),
    AP_REQUIRED_ENTRY(forward_decode), AP_REQUIRED_ENTRY(get_hook),
};
#define AP_NUM_REQUIRED_ENTRIES (sizeof ap_required_entries / sizeof ap_required_entries[0])

/* The outcome of one attempt, before it is recorded. */
typedef struct ap_load_result {
    ap_status status;
    char message[AP_LOAD_MESSAGE_CAPACITY];
    void *handle;
    ap_negotiate_reply reply;
} ap_load_result;

static ap_status ap_load_fail(ap_load_result *result, ap_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ap_status ap_load_fail(ap_load_result *result, ap_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(result->message, sizeof result->message, fmt, args);
    va_end(args);
    result->status = status;
    return status;
}

/* Negotiation is the first call into the plugin: nothing else is trusted before it agrees. */
static ap_status ap_load_negotiate(const char *path, ap_plugin_negotiate_fn negotiate,
                                   ap_load_result *result) {
    ap_negotiate_offer offer = {sizeof offer, AP_ABI_VERSION_MAJOR, AP_ABI_VERSION_MINOR};
    ap_negotiate_reply *reply = &result->reply;
    memset(reply, 0, sizeof *reply);
    reply->struct_size = sizeof *reply;
    char text[512];
    ap_msgbuf msg = ap_msgbuf_over(text, sizeof text);

    ap_status status = negotiate(&offer, reply, &msg);
    text[sizeof text - 1] = '\0'; /* whatever the plugin wrote; the record escapes the rest */
    if (status != AP_OK)
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s] refused the ABI negotiation (core offers %u.%u, plugin "
                            "answered %u.%u, %s): %s",
                            path, offer.core_abi_major, offer.core_abi_minor,
                            reply->plugin_abi_major, reply->plugin_abi_minor,
                            ap_status_name(status), text[0] != '\0' ? text : "no reason given");
    if (!AP_HAS_FIELD(reply, ap_negotiate_reply, descriptor))
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s] answered the negotiation with a reply of %zu bytes, "
                            "too small for ABI %u.%u",
                            path, reply->struct_size, offer.core_abi_major, offer.core_abi_minor);
    if (reply->plugin_abi_major != offer.core_abi_major ||
        reply->plugin_abi_minor > offer.core_abi_minor)
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s] serves ABI %u.%u but the core offers %u.%u (%s)", path,
                            reply->plugin_abi_major, reply->plugin_abi_minor, offer.core_abi_major,
                            offer.core_abi_minor,
                            reply->plugin_abi_major != offer.core_abi_major
                                ? "major versions differ"
                                : "the plugin's minor version is newer than the core's");
    return AP_OK;
}

static ap_status ap_load_check_vtable(const char *path, const ap_vtable *vtable,
                                      ap_load_result *result) {
    if (vtable == NULL)
        return ap_load_fail(result, AP_ERR_MISSING_SYMBOL,
                            "plugin [%s]: descriptor has no vtable (NULL)", path);
    for (size_t i = 0; i < AP_NUM_REQUIRED_ENTRIES; i++) {
        size_t end = ap_required_entries[i].offset + sizeof(void (*)(void));
        if (vtable->struct_size < end)
            return ap_load_fail(result, AP_ERR_MISSING_SYMBOL,
                                "plugin [%s]: vtable struct_size %zu is too small: required "
                                "entry '%s' lies past its end (needs %zu bytes)",
                                path, vtable->struct_size, ap_required_entries[i].name, end);
        void (*entry)(void);
        memcpy(&entry, (const char *)vtable + ap_required_entries[i].offset, sizeof entry);
        if (entry == NULL)
            return ap_load_fail(result, AP_ERR_MISSING_SYMBOL,
                                "required entry '%s' is NULL in [%s]", ap_required_entries[i].name,
                                path);
    }
    return AP_OK;
}

/* Descriptor strings reach hosts as they are (ap_registry_backend), so the core vouches for
 * them: printable (no control bytes, well-formed UTF-8) and at most `max` bytes. */
static ap_status ap_load_check_text(const char *path, const char *name, const char *field,
                                    const char *text, size_t max, ap_load_result *result) {
    char shown[AP_TEXT_LINE_MAX];
    size_t length = strnlen(text, max + 1);
    int escaped = ap_text_escape(text, shown, sizeof shown);
    if (length > max)
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s]: backend '%s' has a %s longer than %zu bytes ('%s')", path,
                            name, field, max, shown);
    if (escaped)
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s]: backend '%s' has a %s holding control bytes or invalid "
                            "UTF-8 ('%s')",
                            path, name, field, shown);
    return AP_OK;
}

static ap_status ap_load_check_descriptor(const char *path, const ap_descriptor *desc,
                                          ap_load_result *result) {
    if (desc == NULL)
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s] negotiated but returned no descriptor (NULL)", path);
    if (desc->struct_size < AP_DESCRIPTOR_MIN_SIZE)
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s]: descriptor struct_size %zu is smaller than the %zu "
                            "bytes ABI %u.0 requires",
                            path, desc->struct_size, AP_DESCRIPTOR_MIN_SIZE, AP_ABI_VERSION_MAJOR);
    if (desc->name == NULL || !ap_backend_name_valid(desc->name))
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s]: backend name '%.*s' is not of the form [a-z0-9_]+", path,
                            AP_TEXT_LINE_MAX, desc->name == NULL ? "(NULL)" : desc->name);
    if (strlen(desc->name) > AP_BACKEND_NAME_MAX)
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s]: backend name '%.32s...' is %zu bytes long, more than "
                            "the %d allowed",
                            path, desc->name, strlen(desc->name), AP_BACKEND_NAME_MAX);
    if (desc->version == NULL || desc->description == NULL)
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH, "plugin [%s]: backend '%s' has a NULL %s",
                            path, desc->name, desc->version == NULL ? "version" : "description");
    if (ap_load_check_text(path, desc->name, "version", desc->version, AP_VERSION_MAX, result) !=
            AP_OK ||
        ap_load_check_text(path, desc->name, "description", desc->description, AP_DESCRIPTION_MAX,
                           result) != AP_OK)
        return result->status;
    if (desc->caps == NULL)
        return ap_load_fail(result, AP_ERR_MISSING_SYMBOL,
                            "plugin [%s]: backend '%s' has no capabilities (caps is NULL)", path,
                            desc->name);
    if (desc->caps->struct_size < AP_CAPS_MIN_SIZE)
        return ap_load_fail(result, AP_ERR_ABI_MISMATCH,
                            "plugin [%s]: caps struct_size %zu is smaller than the %zu bytes ABI "
                            "%u.0 requires",
                            path, desc->caps->struct_size, AP_CAPS_MIN_SIZE, AP_ABI_VERSION_MAJOR);
    return ap_load_check_vtable(path, desc->vtable, result);
}

/* Whether AP_BACKENDS_DISABLE (comma-separated fnmatch globs) names this backend; the glob
 * that matched goes into `pattern`. */
static int ap_backend_disabled(const char *name, char *pattern, size_t size) {
    const char *value = secure_getenv("AP_BACKENDS_DISABLE");
    if (value == NULL) return 0;
    const char *p = value;
    while (*p != '\0') {
        const char *item = p + strspn(p, " ");
        size_t len = strcspn(item, ",");
        while (len > 0 && item[len - 1] == ' ') len--;
        /* Backend names are short; a longer glob could match none and is skipped. */
        char glob[256];
        if (len > 0 && len < sizeof glob) {
            memcpy(glob, item, len);
            glob[len] = '\0';
            if (fnmatch(glob, name, 0) == 0) {
                snprintf(pattern, size, "%s", glob);
                return 1;
            }
        }
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
    return 0;
}

static const ap_plugin *ap_plugin_lookup(const ap_registry *registry, const char *name,
                                         size_t *position) {
    size_t low = 0, high = registry->num_plugins;
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        int order = strcmp(registry->plugins[mid]->desc->name, name);
        if (order == 0) {
            *position = mid;
            return registry->plugins[mid];
        }
        if (order < 0)
            low = mid + 1;
        else
            high = mid;
    }
    *position = low;
    return NULL;
}

ap_plugin *ap_registry_lookup_locked(const ap_registry *registry, const char *name) {
    size_t position;
    return (ap_plugin *)ap_plugin_lookup(registry, name, &position);
}

/* Open, negotiate, validate. On AP_OK the handle in `result` stays open for the caller. */
static ap_status ap_load_attempt(const ap_registry *registry, const char *path,
                                 ap_load_result *result) {
    result->status = AP_OK;
    result->message[0] = '\0';
    /* A name without '/' would send dlopen to the library search path, not this folder. */
    char local[4096];
    const char *open_path = path;
    if (strchr(path, '/') == NULL &&
        (size_t)snprintf(local, sizeof local, "./%s", path) < sizeof local)
        open_path = local;
    /* dlopen maps a truncated file without complaint and the process dies of SIGBUS later. */
    char why[256];
    if (ap_elf_check(open_path, why, sizeof why) != AP_OK)
        return ap_load_fail(result, AP_ERR_LOAD, "cannot open plugin [%s]: %s", path, why);
    dlerror();
    result->handle = dlopen(open_path, RTLD_NOW | RTLD_LOCAL);
    if (result->handle == NULL) {
        const char *why = dlerror();
        return ap_load_fail(result, AP_ERR_LOAD, "cannot open plugin [%s]: %s", path,
                            why != NULL ? why : "unknown dlopen error");
    }
    void *symbol = dlsym(result->handle, AP_PLUGIN_ENTRY);
    if (symbol == NULL)
        return ap_load_fail(result, AP_ERR_MISSING_SYMBOL,
                            "no entry point [%s] in shared library [%s]", AP_PLUGIN_ENTRY, path);
    ap_plugin_negotiate_fn negotiate;
    memcpy(&negotiate, &symbol,
           sizeof negotiate); /* object-to-function pointer, POSIX-sanctioned */
    if (ap_load_negotiate(path, negotiate, result) != AP_OK) return result->status;
    const ap_descriptor *desc = result->reply.descriptor;
    if (ap_load_check_descriptor(path, desc, result) != AP_OK) return result->status;

    char pattern[256];
    if (ap_backend_disabled(desc->name, pattern, sizeof pattern))
        return ap_load_fail(result, AP_ERR_REFUSED,
                            "disabled by AP_BACKENDS_DISABLE (pattern '%s'): backend '%s' in [%s]",
                            pattern, desc->name, path);
    size_t position;
    const ap_plugin *taken = ap_plugin_lookup(registry, desc->name, &position);
    if (taken != NULL)
        return ap_load_fail(result, AP_ERR_DUPLICATE,
                            "backend '%s' in [%s] is already provided by [%s]; skipping the "
                            "second",
                            desc->name, path, taken->path);
    return AP_OK;
}

/* Grow both arrays up front so that recording an outcome cannot fail halfway. */
static ap_status ap_registry_reserve(ap_registry *registry) {
    if (registry->num_files == registry->cap_files) {
        size_t cap = registry->cap_files == 0 ? 16 : 2 * registry->cap_files;
        ap_file_entry *files = realloc(registry->files, cap * sizeof *files);
        if (files == NULL) return AP_ERR_OUT_OF_MEMORY;
        registry->files = files;
        registry->cap_files = cap;
    }
    if (registry->num_plugins == registry->cap_plugins) {
        size_t cap = registry->cap_plugins == 0 ? 8 : 2 * registry->cap_plugins;
        ap_plugin **plugins = realloc(registry->plugins, cap * sizeof *plugins);
        if (plugins == NULL) return AP_ERR_OUT_OF_MEMORY;
        registry->plugins = plugins;
        registry->cap_plugins = cap;
    }
    return AP_OK;
}

/* Copy the outcome into owned memory: a record, and for a loaded file its plugin. */
static ap_status ap_outcome_copy(const char *path, const ap_load_result *result,
                                 ap_file_entry *entry, ap_plugin **plugin) {
    /* The name is known once the descriptor passed its checks (refused later or loaded). */
    const ap_descriptor *desc = result->status == AP_OK || result->status == AP_ERR_REFUSED ||
                                        result->status == AP_ERR_DUPLICATE
                                    ? result->reply.descriptor
                                    : NULL;
    *entry = (ap_file_entry){strdup(path), result->status, strdup(result->message),
                             desc != NULL ? strdup(desc->name) : NULL};
    *plugin = NULL;
    int ok = entry->path != NULL && entry->message != NULL && (desc == NULL || entry->backend);
    if (ok && result->status == AP_OK) {
        *plugin = calloc(1, sizeof **plugin);
        char *path_copy = strdup(path);
        if (*plugin != NULL && path_copy != NULL) {
            **plugin = (ap_plugin){path_copy, result->handle, desc, result->reply.plugin_abi_major,
                                   result->reply.plugin_abi_minor};
        } else {
            free(*plugin);
            free(path_copy);
            *plugin = NULL;
            ok = 0;
        }
    }
    if (ok) return AP_OK;
    free(entry->path);
    free(entry->message);
    free(entry->backend);
    return AP_ERR_OUT_OF_MEMORY;
}

static void ap_plugin_insert(ap_registry *registry, ap_plugin *plugin) {
    size_t position;
    ap_plugin_lookup(registry, plugin->desc->name, &position);
    memmove(registry->plugins + position + 1, registry->plugins + position,
            (registry->num_plugins - position) * sizeof *registry->plugins);
    registry->plugins[position] = plugin;
    registry->num_plugins++;
}

/* A file seen before answers with what became of it then. */
static const ap_file_entry *ap_record_find(const ap_registry *registry, const char *path) {
    for (size_t i = 0; i < registry->num_files; i++) {
        if (strcmp(registry->files[i].path, path) == 0) return &registry->files[i];
    }
    return NULL;
}

ap_status ap_registry_load_locked(ap_registry *registry, const char *path) {
    const ap_file_entry *seen = ap_record_find(registry, path);
    if (seen != NULL) {
        if (seen->status == AP_OK) return AP_OK;
        return ap_error_set(seen->status, "%s", seen->message);
    }
    ap_load_result *result = calloc(1, sizeof *result);
    if (result == NULL || ap_registry_reserve(registry) != AP_OK) {
        free(result);
        return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory loading [%s]", path);
    }
    ap_load_attempt(registry, path, result);
    /* Kept and shown as one line: the plugin's words and the file name, escaped. */
    char *raw = strdup(result->message);
    if (raw != NULL) ap_text_escape(raw, result->message, sizeof result->message);
    free(raw);
    ap_file_entry entry;
    ap_plugin *plugin;
    if (ap_outcome_copy(path, result, &entry, &plugin) != AP_OK) {
        if (result->handle != NULL) dlclose(result->handle);
        free(result);
        return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory loading [%s]", path);
    }
    registry->files[registry->num_files++] = entry;
    ap_status outcome = result->status;
    if (plugin != NULL) {
        ap_plugin_insert(registry, plugin);
        ap_log(AP_LOG_LOAD, "loaded backend '%s' %s (ABI %u.%u) from [%s]", plugin->desc->name,
               plugin->desc->version, plugin->abi_major, plugin->abi_minor, path);
    } else {
        ap_log(AP_LOG_LOAD, "refused [%s]: %s: %s", path, ap_status_name(outcome), result->message);
        /* Refused files never get an instance, so nothing can still point into them. */
        if (result->handle != NULL) dlclose(result->handle);
        ap_error_set(outcome, "%s", result->message);
    }
    free(result);
    return outcome;
}

ap_status ap_registry_record_skip_locked(ap_registry *registry, const char *path, const char *why) {
    if (ap_record_find(registry, path) != NULL) return AP_OK;
    if (ap_registry_reserve(registry) != AP_OK) return AP_ERR_OUT_OF_MEMORY;
    ap_file_entry entry = {strdup(path), AP_ERR_LOAD, NULL, NULL};
    char shown[4096];
    ap_text_escape(path, shown, sizeof shown); /* a file name may hold any byte but '/' */
    if (entry.path == NULL || asprintf(&entry.message, "skipped [%s]: %s", shown, why) < 0) {
        free(entry.path);
        return AP_ERR_OUT_OF_MEMORY;
    }
    registry->files[registry->num_files++] = entry;
    ap_log(AP_LOG_LOAD, "%s", entry.message);
    return AP_OK;
}
