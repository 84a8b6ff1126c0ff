/* config.c: the YAML config that picks backends per model: loading, freeing, reading rules.
 *
 * The format (version 1). Every key is checked: an unknown one is an error, since a typo must
 * not silently change the backend.
 *
 *   version: 1                          # required; this reader knows only 1
 *   plugin_path: [plugins, /opt/x]      # optional; folders a host adds to its registry
 *                                       # (ap_config_plugin_path); relative ones are relative
 *                                       # to the config file's folder
 *   rules:                              # required, non-empty, ordered: the first rule whose
 *     - match: "meta-llama/Llama-3*"    #   `match` glob (fnmatch, '*' crosses '/') fits wins
 *       backends: [trtllm_mha, cpu_ref] # a preference list: the first that serves is taken,
 *                                       #   names no plugin provides are skipped
 *       options:                        # optional, every entry optional
 *         page_size: 16                 # positive integer (else the model's)
 *         kv_dtype: bf16                # bf16 | fp16 | fp8_e4m3 | fp8_e5m2 | nvfp4
 *         prefix_cache: true            # booleans: true/false, yes/no, on/off
 *         chunked_prefill: true
 *         cuda_graphs: false
 *         backend_options:              # passed through untouched as "BACKEND.KEY" = "VALUE";
 *           trtllm_mha: {split_kv: auto}  # BACKEND must be one the rule names
 *     - match: "*"
 *       backend: cpu_ref                # one explicit backend: if it cannot serve, hard error
 *
 * Values: integers and booleans are plain scalars (a quoted "16" is a string and is refused);
 * backend names are [a-z0-9_]+; anchors, aliases, tags and a second document are refused. A
 * glob that starts with '*' must be quoted, or YAML reads it as an alias.
 * Errors are AP_ERR_CONFIG "FILE:LINE:COLUMN: message" (1-based), FILE being the path given to
 * ap_config_load or the source name given to ap_config_parse.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

/* A config is text a person wrote; a larger file is a mistake (or an attack), not a config. */
#define AP_CONFIG_MAX_BYTES (16u << 20)

void ap_config_destroy(ap_config *config) {
    if (config == NULL) return;
    for (size_t i = 0; i < config->num_rules; i++) {
        free((void *)config->rules[i].rule.backends);
        free((void *)config->rules[i].rule.options.extra);
        free(config->rules[i].backend_pos);
    }
    free(config->rules);
    free(config->plugin_path);
    for (size_t i = 0; i < config->num_strings; i++) free(config->strings[i]);
    free(config->strings);
    free(config->base_dir);
    free(config->source);
    free(config);
}

/* Parse with plugin_path entries resolved against `base_dir` (NULL: kept as written). */
static ap_status ap_config_parse_in(const char *text, size_t length, const char *source,
                                    const char *base_dir, ap_config **out) {
    ap_ynode *root = NULL;
    ap_status status = AP_OK;
    ap_config *config = calloc(1, sizeof *config);
    if (config == NULL) {
        status = ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    config->source = strdup(source);
    config->base_dir = base_dir != NULL ? strdup(base_dir) : NULL;
    if (config->source == NULL || (base_dir != NULL && config->base_dir == NULL)) {
        status = ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    /* libyaml wants a non-NULL buffer even when it is empty. */
    status = ap_ynode_parse(text != NULL ? text : "", length, source, &root);
    if (status != AP_OK) goto out;
    status = ap_config_build(config, root);
    if (status != AP_OK) goto out;
    ap_log(AP_LOG_CONFIG, "%s: version %d, %zu rules, %zu plugin folders", source, config->version,
           config->num_rules, config->num_plugin_path);
    *out = config;
    config = NULL;
out:
    ap_ynode_free(root);
    ap_config_destroy(config);
    return status;
}

ap_status ap_config_parse(const char *text, size_t length, const char *source_name,
                          ap_config **out) {
    if (out == NULL) return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_config_parse: out is NULL");
    *out = NULL;
    if (text == NULL && length > 0)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_config_parse: text is NULL");
    return ap_config_parse_in(text, length, source_name != NULL ? source_name : "<string>", NULL,
                              out);
}

/* The whole file into memory: libyaml then parses from a string, and reader errors that only
 * know a byte offset can be placed at a line and column. */
static ap_status ap_file_read(const char *path, char **text, size_t *length) {
    ap_status status = AP_OK;
    char *buffer = NULL;
    size_t used = 0, capacity = 0;
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        int error = errno;
        return ap_error_set(error == ENOENT ? AP_ERR_NOT_FOUND : AP_ERR_CONFIG,
                            "cannot open config '%s': %s", path, strerror(error));
    }
    for (;;) {
        if (used == capacity) {
            if (capacity > AP_CONFIG_MAX_BYTES) {
                status = ap_error_set(AP_ERR_CONFIG, "config '%s' is larger than %u bytes", path,
                                      AP_CONFIG_MAX_BYTES);
                goto out;
            }
            capacity = capacity ? 2 * capacity : 4096;
            /* One byte past the limit tells a file of exactly the limit from a larger one. */
            if (capacity > AP_CONFIG_MAX_BYTES) capacity = AP_CONFIG_MAX_BYTES + 1;
            char *grown = realloc(buffer, capacity);
            if (grown == NULL) {
                status = ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", path);
                goto out;
            }
            buffer = grown;
        }
        size_t got = fread(buffer + used, 1, capacity - used, file);
        used += got;
        if (got > 0) continue;
        if (ferror(file)) {
            status =
                ap_error_set(AP_ERR_CONFIG, "cannot read config '%s': %s", path, strerror(errno));
            goto out;
        }
        break;
    }
    *text = buffer;
    *length = used;
    buffer = NULL;
out:
    free(buffer);
    fclose(file);
    return status;
}

/* The folder plugin_path entries are relative to: the file's folder, made absolute so a host
 * that changes directory later still finds it. */
static char *ap_config_folder(const char *path) {
    const char *slash = strrchr(path, '/');
    char *folder = slash == NULL   ? strdup(".")
                   : slash == path ? strdup("/")
                                   : strndup(path, (size_t)(slash - path));
    if (folder == NULL) return NULL;
    char *absolute = realpath(folder, NULL);
    if (absolute == NULL) return folder;
    free(folder);
    return absolute;
}

ap_status ap_config_load(const char *path, ap_config **out) {
    char *text = NULL, *folder = NULL;
    size_t length = 0;
    ap_status status = AP_OK;
    if (out == NULL || path == NULL) {
        status = ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_config_load: %s is NULL",
                              out == NULL ? "out" : "path");
        goto out;
    }
    *out = NULL;
    status = ap_file_read(path, &text, &length);
    if (status != AP_OK) goto out;
    folder = ap_config_folder(path);
    if (folder == NULL) {
        status = ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    status = ap_config_parse_in(text, length, path, folder, out);
out:
    free(folder);
    free(text);
    return status;
}

int32_t ap_config_version(const ap_config *config) {
    return config != NULL ? config->version : 0;
}

size_t ap_config_plugin_path_count(const ap_config *config) {
    return config != NULL ? config->num_plugin_path : 0;
}

const char *ap_config_plugin_path(const ap_config *config, size_t index) {
    if (config == NULL || index >= config->num_plugin_path) return NULL;
    return config->plugin_path[index];
}

size_t ap_config_rule_count(const ap_config *config) {
    return config != NULL ? config->num_rules : 0;
}

const ap_config_rule *ap_config_rule_at(const ap_config *config, size_t index) {
    if (config == NULL || index >= config->num_rules) return NULL;
    return &config->rules[index].rule;
}
