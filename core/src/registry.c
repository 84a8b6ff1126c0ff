/* registry.c: the registry's life cycle, its folders, and read access to files and backends. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The registry's mutex guards state that const accessors read too. */
static pthread_mutex_t *ap_registry_mutex(const ap_registry *registry) {
    return (pthread_mutex_t *)&registry->lock;
}

static ap_status ap_registry_push_dir(ap_registry *registry, const char *dir) {
    char **dirs = realloc(registry->dirs, (registry->num_dirs + 1) * sizeof *dirs);
    if (dirs == NULL) return AP_ERR_OUT_OF_MEMORY;
    registry->dirs = dirs;
    dirs[registry->num_dirs] = strdup(dir);
    if (dirs[registry->num_dirs] == NULL) return AP_ERR_OUT_OF_MEMORY;
    registry->num_dirs++;
    return AP_OK;
}

static void ap_registry_free(ap_registry *registry) {
    for (size_t i = 0; i < registry->num_plugins; i++) {
        ap_plugin *plugin = registry->plugins[i];
        dlclose(plugin->handle);
        free(plugin->path);
        free(plugin);
    }
    for (size_t i = 0; i < registry->num_files; i++) {
        free(registry->files[i].path);
        free(registry->files[i].message);
        free(registry->files[i].backend);
    }
    for (size_t i = 0; i < registry->num_dirs; i++) free(registry->dirs[i]);
    free(registry->plugins);
    free(registry->files);
    free(registry->dirs);
    pthread_mutex_destroy(&registry->lock);
    free(registry);
}

static ap_status ap_registry_options_check(const ap_registry_options *options) {
    if (options->struct_size < offsetof(ap_registry_options, flags) + sizeof options->flags)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "ap_registry_create: options.struct_size %zu is too small (set it "
                            "to sizeof(ap_registry_options))",
                            options->struct_size);
    if (options->num_search_dirs > 0 && options->search_dirs == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "ap_registry_create: options.search_dirs is NULL but "
                            "num_search_dirs is %zu",
                            options->num_search_dirs);
    for (size_t i = 0; i < options->num_search_dirs; i++) {
        if (options->search_dirs[i] == NULL || options->search_dirs[i][0] == '\0')
            return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                                "ap_registry_create: options.search_dirs[%zu] is %s", i,
                                options->search_dirs[i] == NULL ? "NULL" : "empty");
    }
    return AP_OK;
}

ap_status ap_registry_create(const ap_registry_options *options, ap_registry **out) {
    if (out == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_create: out is NULL");
    *out = NULL;
    if (options != NULL && ap_registry_options_check(options) != AP_OK)
        return AP_ERR_INVALID_ARGUMENT;
    ap_registry *registry = calloc(1, sizeof *registry);
    if (registry == NULL || pthread_mutex_init(&registry->lock, NULL) != 0) {
        free(registry);
        return ap_error_set(AP_ERR_OUT_OF_MEMORY, "ap_registry_create: out of memory");
    }
    atomic_init(&registry->live_instances, 0);
    if (options != NULL) {
        registry->flags = options->flags;
        for (size_t i = 0; i < options->num_search_dirs; i++) {
            if (ap_registry_push_dir(registry, options->search_dirs[i]) != AP_OK) {
                ap_registry_free(registry);
                return ap_error_set(AP_ERR_OUT_OF_MEMORY, "ap_registry_create: out of memory");
            }
        }
    }
    *out = registry;
    ap_error_clear();
    return AP_OK;
}

ap_status ap_registry_add_dir(ap_registry *registry, const char *dir) {
    if (registry == NULL || dir == NULL || dir[0] == '\0')
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_add_dir: %s",
                            registry == NULL ? "registry is NULL"
                            : dir == NULL    ? "dir is NULL"
                                             : "dir is empty");
    pthread_mutex_lock(&registry->lock);
    ap_status status = ap_registry_push_dir(registry, dir);
    pthread_mutex_unlock(&registry->lock);
    if (status != AP_OK) return ap_error_set(status, "ap_registry_add_dir: out of memory");
    ap_error_clear();
    return AP_OK;
}

ap_status ap_registry_load_file(ap_registry *registry, const char *path) {
    if (registry == NULL || path == NULL || path[0] == '\0')
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_load_file: %s",
                            registry == NULL ? "registry is NULL"
                            : path == NULL   ? "path is NULL"
                                             : "path is empty");
    pthread_mutex_lock(&registry->lock);
    ap_status status = ap_registry_load_locked(registry, path);
    pthread_mutex_unlock(&registry->lock);
    if (status == AP_OK) ap_error_clear();
    return status;
}

ap_status ap_registry_destroy(ap_registry *registry) {
    if (registry == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_destroy: registry is NULL");
    int live = atomic_load(&registry->live_instances);
    if (live > 0)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "ap_registry_destroy: %d instance(s) still open; close them first "
                            "(plugins stay loaded)",
                            live);
    ap_registry_free(registry);
    ap_error_clear();
    return AP_OK;
}

size_t ap_registry_file_count(const ap_registry *registry) {
    if (registry == NULL) {
        ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_file_count: registry is NULL");
        return 0;
    }
    pthread_mutex_lock(ap_registry_mutex(registry));
    size_t count = registry->num_files;
    pthread_mutex_unlock(ap_registry_mutex(registry));
    return count;
}

ap_status ap_registry_file(const ap_registry *registry, size_t index, ap_file_record *out) {
    if (registry == NULL || out == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_file: %s is NULL",
                            registry == NULL ? "registry" : "out");
    pthread_mutex_lock(ap_registry_mutex(registry));
    size_t count = registry->num_files;
    if (index < count) {
        const ap_file_entry *entry = &registry->files[index];
        *out = (ap_file_record){entry->path, entry->status, entry->message, entry->backend};
    }
    pthread_mutex_unlock(ap_registry_mutex(registry));
    if (index >= count)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "ap_registry_file: index %zu is out of range (%zu files)", index,
                            count);
    return AP_OK;
}

size_t ap_registry_backend_count(const ap_registry *registry) {
    if (registry == NULL) {
        ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_backend_count: registry is NULL");
        return 0;
    }
    pthread_mutex_lock(ap_registry_mutex(registry));
    size_t count = registry->num_plugins;
    pthread_mutex_unlock(ap_registry_mutex(registry));
    return count;
}

const ap_descriptor *ap_registry_backend(const ap_registry *registry, size_t index) {
    if (registry == NULL) {
        ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_backend: registry is NULL");
        return NULL;
    }
    const ap_descriptor *desc = NULL;
    pthread_mutex_lock(ap_registry_mutex(registry));
    size_t count = registry->num_plugins;
    if (index < count) desc = registry->plugins[index]->desc;
    pthread_mutex_unlock(ap_registry_mutex(registry));
    if (desc == NULL)
        ap_error_set(AP_ERR_INVALID_ARGUMENT,
                     "ap_registry_backend: index %zu is out of range (%zu backends)", index, count);
    return desc;
}

ap_plugin *ap_registry_find_plugin(ap_registry *registry, const char *name) {
    if (registry == NULL || name == NULL) {
        ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_find_plugin: %s is NULL",
                     registry == NULL ? "registry" : "name");
        return NULL;
    }
    pthread_mutex_lock(&registry->lock);
    ap_plugin *plugin = ap_registry_lookup_locked(registry, name);
    pthread_mutex_unlock(&registry->lock);
    if (plugin == NULL) ap_error_set(AP_ERR_NOT_FOUND, "no backend named '%s' is loaded", name);
    return plugin;
}

int ap_registry_refusal(const ap_registry *registry, const char *name, char *text, size_t size) {
    int found = 0;
    pthread_mutex_lock(ap_registry_mutex(registry));
    for (size_t i = 0; i < registry->num_files && !found; i++) {
        const ap_file_entry *entry = &registry->files[i];
        found = entry->status == AP_ERR_REFUSED && entry->backend != NULL &&
                strcmp(entry->backend, name) == 0;
        if (found) snprintf(text, size, "%s", entry->message);
    }
    pthread_mutex_unlock(ap_registry_mutex(registry));
    return found;
}

const ap_descriptor *ap_registry_find(const ap_registry *registry, const char *name) {
    ap_plugin *plugin = ap_registry_find_plugin((ap_registry *)registry, name);
    return plugin != NULL ? plugin->desc : NULL;
}

const char *ap_registry_backend_path(const ap_registry *registry, const char *name) {
    ap_plugin *plugin = ap_registry_find_plugin((ap_registry *)registry, name);
    return plugin != NULL ? plugin->path : NULL;
}
