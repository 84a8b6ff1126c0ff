/* discover.c: which folders the registry searches, in what order, and the scan over them. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

/* A growing list of owned strings. */
typedef struct ap_strings {
    char **items;
    size_t count, capacity;
    int failed; /* an allocation failed: the list is incomplete */
} ap_strings;

static void ap_strings_push(ap_strings *list, char *owned) {
    if (owned == NULL) {
        list->failed = 1;
        return;
    }
    if (list->count == list->capacity) {
        size_t capacity = list->capacity == 0 ? 16 : 2 * list->capacity;
        char **items = realloc(list->items, capacity * sizeof *items);
        if (items == NULL) {
            free(owned);
            list->failed = 1;
            return;
        }
        list->items = items;
        list->capacity = capacity;
    }
    list->items[list->count++] = owned;
}

static void ap_strings_free(ap_strings *list) {
    for (size_t i = 0; i < list->count; i++) free(list->items[i]);
    free(list->items);
    *list = (ap_strings){0};
}

static int ap_compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *ap_path_join(const char *dir, const char *name) {
    char *path;
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--; /* "dir/" and "dir" name the same files */
    if (asprintf(&path, "%.*s/%s", (int)len, dir, name) < 0) return NULL;
    return path;
}

/* Append each non-empty entry of a ':'-separated list. */
static void ap_push_path_list(ap_strings *dirs, const char *list) {
    const char *p = list;
    while (*p != '\0') {
        size_t len = strcspn(p, ":");
        if (len > 0) ap_strings_push(dirs, strndup(p, len));
        p += len;
        if (*p == ':') p++;
    }
}

/* Why a directory entry named like a plugin is not a file the loader can open, or NULL. */
static const char *ap_entry_skip_reason(const char *path, int want_dirs, char *text, size_t size) {
    struct stat info;
    /* stat, not d_type: d_type may be DT_UNKNOWN, and a symlink to a library is fine. */
    if (stat(path, &info) != 0) {
        int error = errno;
        struct stat link;
        if (error == ELOOP) return "a symbolic link loop";
        if (error == ENOENT && lstat(path, &link) == 0 && S_ISLNK(link.st_mode))
            return "a dangling symbolic link (its target does not exist)";
        snprintf(text, size, "cannot stat it: %s", strerror(error));
        return text;
    }
    if (want_dirs) return S_ISDIR(info.st_mode) ? NULL : "not a folder";
    if (S_ISREG(info.st_mode)) return NULL;
    if (S_ISDIR(info.st_mode)) return "a folder, not a plugin file";
    if (S_ISFIFO(info.st_mode)) return "a FIFO, not a regular file";
    if (S_ISSOCK(info.st_mode)) return "a socket, not a regular file";
    return "a device node, not a regular file";
}

/* Entries of `dir` that are folders (want_dirs), or every entry named "*.so" (the scan then
 * tells files from the rest: ap_entry_skip_reason), sorted. */
static void ap_list_dir(const char *dir, int want_dirs, ap_strings *out) {
    DIR *stream = opendir(dir);
    if (stream == NULL) {
        ap_log(AP_LOG_LOAD, "skipping folder [%s]: %s", dir, strerror(errno));
        return;
    }
    ap_strings names = {0};
    struct dirent *entry;
    while ((entry = readdir(stream)) != NULL) {
        const char *name = entry->d_name;
        size_t len = strlen(name);
        if (name[0] == '.' && (len == 1 || (len == 2 && name[1] == '.'))) continue;
        if (!want_dirs && (len <= 3 || strcmp(name + len - 3, ".so") != 0)) continue;
        char *path = ap_path_join(dir, name), text[128];
        if (want_dirs && path != NULL && ap_entry_skip_reason(path, 1, text, sizeof text) != NULL) {
            free(path);
            continue;
        }
        ap_strings_push(&names, path);
    }
    closedir(stream);
    if (names.count > 1) qsort(names.items, names.count, sizeof *names.items, ap_compare_names);
    for (size_t i = 0; i < names.count; i++) ap_strings_push(out, names.items[i]);
    free(names.items);
    out->failed |= names.failed;
}

/* The build root when libattnplug itself runs from that build tree, else NULL. */
static char *ap_build_root_if_running_from_it(void) {
    /* The address of a static object: an exported function could resolve to another copy of
     * the core loaded earlier (symbol interposition), and dladdr would name that copy. */
    static const char ap_core_marker;
    Dl_info info;
    if (dladdr(&ap_core_marker, &info) == 0 || info.dli_fname == NULL) return NULL;
    char *library = realpath(info.dli_fname, NULL);
    char *root = realpath(AP_BUILD_ROOT, NULL);
    int inside = library != NULL && root != NULL && strncmp(library, root, strlen(root)) == 0 &&
                 library[strlen(root)] == '/';
    free(library);
    if (!inside) {
        free(root);
        return NULL;
    }
    return root;
}

static void ap_push_build_tree(ap_strings *dirs) {
    char *root = ap_build_root_if_running_from_it();
    if (root == NULL) return;
    char *backends = ap_path_join(root, "backends");
    if (backends != NULL) ap_list_dir(backends, 1, dirs);
    free(backends);
    ap_strings_push(dirs, ap_path_join(root, "examples/third_party_plugin"));
    ap_log(AP_LOG_LOAD, "running from the build tree [%s]: searching its plugin folders", root);
    free(root);
}

/* The folders of one scan, in search order. */
static void ap_search_dirs(const ap_registry *registry, ap_strings *dirs) {
    for (size_t i = 0; i < registry->num_dirs; i++)
        ap_strings_push(dirs, strdup(registry->dirs[i]));
    if (registry->flags & AP_REGISTRY_NO_DEFAULT_PATHS) return;
    const char *replace = secure_getenv("AP_PLUGIN_PATH");
    if (replace != NULL && replace[0] != '\0') {
        ap_log(AP_LOG_LOAD, "AP_PLUGIN_PATH='%s' replaces the default folders", replace);
        ap_push_path_list(dirs, replace);
        return;
    }
    const char *add = secure_getenv("AP_ADD_PLUGIN_PATH");
    if (add != NULL) ap_push_path_list(dirs, add);
    ap_strings_push(dirs, strdup(AP_INSTALL_PLUGIN_DIR));
    ap_push_build_tree(dirs);
}

/* Whether the same folder came earlier in this scan under another spelling. */
static int ap_dir_seen(ap_strings *canonical, const char *dir) {
    char *real = realpath(dir, NULL);
    if (real == NULL) return 0; /* missing: ap_list_dir logs it */
    for (size_t i = 0; i < canonical->count; i++) {
        if (strcmp(canonical->items[i], real) == 0) {
            free(real);
            return 1;
        }
    }
    ap_strings_push(canonical, real);
    return 0;
}

ap_status ap_registry_scan(ap_registry *registry) {
    if (registry == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_scan: registry is NULL");
    ap_strings dirs = {0}, canonical = {0}, files = {0};
    ap_status status = AP_OK;
    /* One scan at a time: a second thread waits and then finds every file already recorded. */
    pthread_mutex_lock(&registry->lock);
    ap_search_dirs(registry, &dirs);
    for (size_t i = 0; i < dirs.count; i++) {
        if (ap_dir_seen(&canonical, dirs.items[i])) continue;
        ap_log(AP_LOG_LOAD, "searching folder [%s]", dirs.items[i]);
        ap_list_dir(dirs.items[i], 0, &files);
    }
    if (dirs.failed || canonical.failed || files.failed) status = AP_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < files.count && status == AP_OK; i++) {
        /* Only regular files are opened; anything else named like a plugin is recorded. */
        char text[256];
        const char *why = ap_entry_skip_reason(files.items[i], 0, text, sizeof text);
        if (why != NULL)
            status = ap_registry_record_skip_locked(registry, files.items[i], why);
        else if (ap_registry_load_locked(registry, files.items[i]) == AP_ERR_OUT_OF_MEMORY)
            status = AP_ERR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&registry->lock);
    ap_strings_free(&dirs);
    ap_strings_free(&canonical);
    ap_strings_free(&files);
    if (status != AP_OK)
        return ap_error_set(status, "ap_registry_scan: out of memory while scanning");
    ap_error_clear();
    return AP_OK;
}
