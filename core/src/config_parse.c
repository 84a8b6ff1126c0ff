/* config_parse.c: the config's YAML tree checked key by key and turned into rules and options. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

#define AP_CONFIG_VERSION 1

/* Keys each level accepts, in the order messages list them. */
static const char *const ap_top_keys[] = {"version", "plugin_path", "rules"};
static const char *const ap_rule_keys[] = {"match", "backend", "backends", "options"};
static const char *const ap_option_keys[] = {"page_size",       "kv_dtype",    "prefix_cache",
                                             "chunked_prefill", "cuda_graphs", "backend_options"};
#define AP_COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* KV-cache element types a config may name. */
static const ap_dtype ap_kv_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3,
                                        AP_DTYPE_FP8_E5M2, AP_DTYPE_NVFP4};

static ap_status ap_node_error(const ap_config *config, const ap_ynode *node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ap_status ap_node_error(const ap_config *config, const ap_ynode *node, const char *fmt,
                               ...) {
    char message[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    return ap_config_error(config->source, node->line, node->column, "%s", message);
}

char *ap_config_keep(ap_config *config, const char *text, size_t length) {
    if (config->num_strings == config->cap_strings) {
        size_t capacity = config->cap_strings ? 2 * config->cap_strings : 32;
        char **strings = realloc(config->strings, capacity * sizeof *strings);
        if (strings == NULL) return NULL;
        config->strings = strings;
        config->cap_strings = capacity;
    }
    char *copy = malloc(length + 1);
    if (copy == NULL) return NULL;
    memcpy(copy, text, length);
    copy[length] = '\0';
    config->strings[config->num_strings++] = copy;
    return copy;
}

char *ap_config_keepf(ap_config *config, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    int length = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    if (length < 0) return NULL;
    char *text = ap_config_keep(config, "", 0);
    if (text == NULL) return NULL;
    char *grown = realloc(text, (size_t)length + 1);
    if (grown == NULL) return NULL; /* `text` stays listed and is freed with the config */
    config->strings[config->num_strings - 1] = grown;
    va_start(args, fmt);
    vsnprintf(grown, (size_t)length + 1, fmt, args);
    va_end(args);
    return grown;
}

static ap_status ap_config_oom(void) {
    return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory while reading the config");
}

/* ---- maps: known keys, no duplicates ---------------------------------------------------------- */

/* Edit distance, bounded: enough to suggest the key a typo meant. */
static size_t ap_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return SIZE_MAX;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t above = row[j];
            size_t best = diagonal + (a[i - 1] != b[j - 1]);
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    return row[lb];
}

static ap_status ap_unknown_key(const ap_config *config, const ap_ynode *key,
                                const char *const *known, size_t num_known) {
    char list[512] = "", hint[96] = "";
    size_t used = 0, best = SIZE_MAX;
    for (size_t i = 0; i < num_known; i++) {
        int n = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", known[i]);
        if (n > 0 && (size_t)n < sizeof list - used) used += (size_t)n;
        size_t distance = ap_edit_distance(key->text, known[i]);
        if (distance <= 2 && distance < best) {
            best = distance;
            snprintf(hint, sizeof hint, "; did you mean '%s'?", known[i]);
        }
    }
    return ap_node_error(config, key, "unknown key '%s' (known: %s)%s", key->text, list, hint);
}

/* Every key a plain name of `known`, none twice. */
static ap_status ap_map_check(const ap_config *config, const ap_ynode *map,
                              const char *const *known, size_t num_known) {
    for (size_t i = 0; i < map->count; i += 2) {
        const ap_ynode *key = map->items[i];
        char got[96];
        if (key->kind != AP_YNODE_SCALAR || key->length == 0)
            return ap_node_error(config, key, "expected a key name, got %s",
                                 ap_ynode_describe(key, got, sizeof got));
        for (size_t j = 0; j < i; j += 2) {
            const ap_ynode *earlier = map->items[j];
            if (strcmp(earlier->text, key->text) == 0)
                return ap_node_error(config, key, "duplicate key '%s' (first at %d:%d)", key->text,
                                     earlier->line, earlier->column);
        }
        if (known == NULL) continue;
        size_t k = 0;
        while (k < num_known && strcmp(known[k], key->text) != 0) k++;
        if (k == num_known) return ap_unknown_key(config, key, known, num_known);
    }
    return AP_OK;
}

/* The value under `name`, or NULL when absent. Keys are unique after ap_map_check. */
static const ap_ynode *ap_map_get(const ap_ynode *map, const char *name) {
    for (size_t i = 0; i < map->count; i += 2)
        if (strcmp(map->items[i]->text, name) == 0) return map->items[i + 1];
    return NULL;
}

static const ap_ynode *ap_map_key(const ap_ynode *map, const char *name) {
    for (size_t i = 0; i < map->count; i += 2)
        if (strcmp(map->items[i]->text, name) == 0) return map->items[i];
    return NULL;
}

/* ---- scalar values ---------------------------------------------------------------------------- */

static ap_status ap_expect_kind(const ap_config *config, const ap_ynode *node, ap_ynode_kind kind,
                                const char *what) {
    if (node->kind == kind) return AP_OK;
    char got[96];
    return ap_node_error(config, node, "expected %s, got %s", what,
                         ap_ynode_describe(node, got, sizeof got));
}

/* A non-empty string (plain or quoted). */
static ap_status ap_read_string(const ap_config *config, const ap_ynode *node, const char *what) {
    ap_status status = ap_expect_kind(config, node, AP_YNODE_SCALAR, what);
    if (status != AP_OK) return status;
    char got[96];
    if (node->length == 0)
        return ap_node_error(config, node, "expected %s, got %s", what,
                             ap_ynode_describe(node, got, sizeof got));
    /* A "\0" escape would cut the C string short of what the file says. */
    if (strlen(node->text) != node->length)
        return ap_node_error(config, node, "expected %s, got a string holding a NUL character",
                             what);
    return AP_OK;
}

/* A plain decimal integer in [minimum, INT32_MAX]. Quoted "16" is a string in YAML, and is
 * refused as one so that the file means what it reads as; so is "010", octal 8 to YAML 1.1 and
 * decimal 10 to YAML 1.2. */
static ap_status ap_read_int(const ap_config *config, const ap_ynode *node, const char *what,
                             int32_t minimum, int32_t *out) {
    char got[96];
    if (node->kind != AP_YNODE_SCALAR || node->quoted || node->length == 0)
        return ap_node_error(config, node, "%s must be %s, got %s", what,
                             minimum > 0 ? "a positive integer" : "an integer",
                             ap_ynode_describe(node, got, sizeof got));
    const char *digits = node->text + (node->text[0] == '+' || node->text[0] == '-');
    int decimal = *digits != '\0' && !(digits[0] == '0' && digits[1] != '\0');
    for (const char *c = digits; *c; c++) decimal &= *c >= '0' && *c <= '9';
    errno = 0;
    long long value = decimal ? strtoll(node->text, NULL, 10) : 0;
    if (!decimal || errno == ERANGE || value < minimum || value > INT32_MAX)
        return ap_node_error(config, node, "%s must be %s, got '%s'", what,
                             minimum > 0 ? "a positive integer" : "an integer", node->text);
    *out = (int32_t)value;
    return AP_OK;
}

/* YAML 1.1's boolean words, and only those: "1" or "enabled" is a typo, not a yes. */
static ap_status ap_read_bool(const ap_config *config, const ap_ynode *node, const char *what,
                              int32_t *out) {
    static const char *const words_true[] = {"true", "yes", "on"};
    static const char *const words_false[] = {"false", "no", "off"};
    char got[96];
    if (node->kind == AP_YNODE_SCALAR && !node->quoted) {
        for (size_t i = 0; i < 3; i++) {
            if (strcmp(node->text, words_true[i]) == 0) return *out = 1, AP_OK;
            if (strcmp(node->text, words_false[i]) == 0) return *out = 0, AP_OK;
        }
    }
    return ap_node_error(config, node, "%s must be true or false (or yes/no, on/off), got %s", what,
                         ap_ynode_describe(node, got, sizeof got));
}

static ap_status ap_read_kv_dtype(const ap_config *config, const ap_ynode *node, ap_dtype *out) {
    char known[128] = "";
    size_t used = 0;
    for (size_t i = 0; i < AP_COUNT(ap_kv_dtypes); i++) {
        int n = snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                         ap_dtype_str(ap_kv_dtypes[i]));
        if (n > 0 && (size_t)n < sizeof known - used) used += (size_t)n;
    }
    ap_status status = ap_read_string(config, node, "a KV-cache dtype name");
    if (status != AP_OK) return status;
    ap_dtype dtype = AP_DTYPE_NONE;
    if (ap_dtype_parse(node->text, &dtype) == AP_OK) {
        for (size_t i = 0; i < AP_COUNT(ap_kv_dtypes); i++)
            if (ap_kv_dtypes[i] == dtype) return *out = dtype, AP_OK;
    }
    return ap_node_error(config, node, "unknown kv_dtype '%s' (known: %s)", node->text, known);
}

/* Backend names are what plugins declare: [a-z0-9_]+. */
static ap_status ap_read_backend_name(const ap_config *config, const ap_ynode *node,
                                      const char *what) {
    ap_status status = ap_read_string(config, node, what);
    if (status != AP_OK) return status;
    if (!ap_backend_name_valid(node->text))
        return ap_node_error(config, node, "backend name '%s' may hold only a-z, 0-9 and '_'",
                             node->text);
    return AP_OK;
}

/* ---- options ---------------------------------------------------------------------------------- */

static int ap_rule_names(const ap_config_rule *rule, const char *name) {
    for (size_t i = 0; i < rule->num_backends; i++)
        if (strcmp(rule->backends[i], name) == 0) return 1;
    return 0;
}

/* backend_options: {BACKEND: {KEY: VALUE}} -> extras "BACKEND.KEY" = "VALUE", in file order. A
 * BACKEND the rule does not name is refused: the options could never reach it. */
static ap_status ap_read_backend_options(ap_config *config, ap_config_rule *rule,
                                         const ap_ynode *node) {
    ap_status status = ap_expect_kind(config, node, AP_YNODE_MAP, "a mapping of backend names");
    if (status == AP_OK) status = ap_map_check(config, node, NULL, 0);
    if (status != AP_OK) return status;
    size_t total = 0;
    for (size_t i = 0; i < node->count; i += 2) {
        const ap_ynode *backend = node->items[i], *table = node->items[i + 1];
        if ((status = ap_read_backend_name(config, backend, "a backend name")) != AP_OK)
            return status;
        if (!ap_rule_names(rule, backend->text))
            return ap_node_error(config, backend,
                                 "backend_options for '%s', which this rule does not list",
                                 backend->text);
        status = ap_expect_kind(config, table, AP_YNODE_MAP, "a mapping of option keys");
        if (status == AP_OK) status = ap_map_check(config, table, NULL, 0);
        if (status != AP_OK) return status;
        total += table->count / 2;
    }
    if (total == 0) return AP_OK;
    ap_option_kv *extra = calloc(total, sizeof *extra);
    if (extra == NULL) return ap_config_oom();
    rule->options.extra = extra;
    for (size_t i = 0; i < node->count; i += 2) {
        const ap_ynode *backend = node->items[i], *table = node->items[i + 1];
        for (size_t j = 0; j < table->count; j += 2) {
            const ap_ynode *key = table->items[j], *value = table->items[j + 1];
            char got[96];
            if (value->kind != AP_YNODE_SCALAR || (value->length == 0 && !value->quoted))
                return ap_node_error(config, value, "option '%s.%s' needs a value, got %s",
                                     backend->text, key->text,
                                     ap_ynode_describe(value, got, sizeof got));
            char *name = ap_config_keepf(config, "%s.%s", backend->text, key->text);
            if (name == NULL) return ap_config_oom();
            extra[rule->options.num_extra].key = name;
            extra[rule->options.num_extra].value =
                ap_config_keep(config, value->text, value->length);
            if (extra[rule->options.num_extra].value == NULL) return ap_config_oom();
            rule->options.num_extra++;
        }
    }
    return AP_OK;
}

static ap_status ap_read_options(ap_config *config, ap_config_rule *rule, const ap_ynode *node) {
    ap_status status = ap_expect_kind(config, node, AP_YNODE_MAP, "a mapping of options");
    if (status == AP_OK)
        status = ap_map_check(config, node, ap_option_keys, AP_COUNT(ap_option_keys));
    if (status != AP_OK) return status;
    ap_options *options = &rule->options;
    const ap_ynode *value;
    if (status == AP_OK && (value = ap_map_get(node, "page_size")) != NULL)
        status = ap_read_int(config, value, "page_size", 1, &options->page_size);
    if (status == AP_OK && (value = ap_map_get(node, "kv_dtype")) != NULL)
        status = ap_read_kv_dtype(config, value, &options->kv_dtype);
    if (status == AP_OK && (value = ap_map_get(node, "prefix_cache")) != NULL)
        status = ap_read_bool(config, value, "prefix_cache", &options->prefix_cache);
    if (status == AP_OK && (value = ap_map_get(node, "chunked_prefill")) != NULL)
        status = ap_read_bool(config, value, "chunked_prefill", &options->chunked_prefill);
    if (status == AP_OK && (value = ap_map_get(node, "cuda_graphs")) != NULL)
        status = ap_read_bool(config, value, "cuda_graphs", &options->cuda_graphs);
    if (status == AP_OK && (value = ap_map_get(node, "backend_options")) != NULL)
        status = ap_read_backend_options(config, rule, value);
    return status;
}

/* ---- rules ------------------------------------------------------------------------------------ */

/* `backend: NAME` (explicit) or `backends: [NAME, ...]` (a preference list), never both. */
static ap_status ap_read_rule_backends(ap_config *config, ap_config_rule_full *full,
                                       const ap_ynode *map) {
    const ap_ynode *single = ap_map_get(map, "backend"), *list = ap_map_get(map, "backends");
    if (single != NULL && list != NULL) {
        const ap_ynode *one = ap_map_key(map, "backend"), *many = ap_map_key(map, "backends");
        const ap_ynode *later =
            one->line > many->line || (one->line == many->line && one->column > many->column)
                ? one
                : many;
        return ap_node_error(config, later,
                             "a rule takes 'backend' (one explicit backend) or 'backends' (a "
                             "preference list), not both");
    }
    if (single == NULL && list == NULL)
        return ap_node_error(config, map, "rule has neither 'backend' nor 'backends'");
    char got[96];
    ap_status status;
    if (single != NULL && single->kind == AP_YNODE_LIST)
        return ap_node_error(config, single,
                             "expected one backend name, got a list (a preference list is "
                             "written 'backends: [...]')");
    if (list != NULL && list->kind == AP_YNODE_SCALAR)
        return ap_node_error(config, list,
                             "expected a list of backend names, got %s (write [%s], or "
                             "'backend: %s' for one explicit backend)",
                             ap_ynode_describe(list, got, sizeof got), list->text, list->text);
    if (list != NULL) {
        status = ap_expect_kind(config, list, AP_YNODE_LIST, "a list of backend names");
        if (status != AP_OK) return status;
        if (list->count == 0) return ap_node_error(config, list, "empty list of backends");
    }
    const ap_ynode *const *names = single != NULL ? &single : (const ap_ynode *const *)list->items;
    size_t count = single != NULL ? 1 : list->count;
    const ap_ynode *where = single != NULL ? single : list;
    full->list_pos = (ap_config_pos){where->line, where->column};
    const char **backends = calloc(count, sizeof *backends);
    full->backend_pos = calloc(count, sizeof *full->backend_pos);
    full->rule.backends = backends;
    if (backends == NULL || full->backend_pos == NULL) return ap_config_oom();
    for (size_t i = 0; i < count; i++) {
        const ap_ynode *name = names[i];
        status = ap_read_backend_name(config, name, "a backend name");
        if (status != AP_OK) return status;
        for (size_t j = 0; j < i; j++)
            if (strcmp(backends[j], name->text) == 0)
                return ap_node_error(config, name, "backend '%s' listed twice (first at %d:%d)",
                                     name->text, full->backend_pos[j].line,
                                     full->backend_pos[j].column);
        if ((backends[i] = ap_config_keep(config, name->text, name->length)) == NULL)
            return ap_config_oom();
        full->backend_pos[i] = (ap_config_pos){name->line, name->column};
        full->rule.num_backends = i + 1;
    }
    full->rule.explicit_single = single != NULL;
    return AP_OK;
}

static ap_status ap_read_rule(ap_config *config, ap_config_rule_full *full, const ap_ynode *node) {
    ap_status status = ap_expect_kind(config, node, AP_YNODE_MAP,
                                      "a rule (a mapping with match and backend or backends)");
    if (status == AP_OK) status = ap_map_check(config, node, ap_rule_keys, AP_COUNT(ap_rule_keys));
    if (status != AP_OK) return status;
    ap_config_rule *rule = &full->rule;
    rule->line = node->line;
    full->column = node->column;
    rule->options = ap_options_default;
    const ap_ynode *match = ap_map_get(node, "match");
    if (match == NULL)
        return ap_node_error(config, node, "rule has no 'match' (a model-name glob)");
    if ((status = ap_read_string(config, match, "a model-name glob")) != AP_OK) return status;
    if ((rule->pattern = ap_config_keep(config, match->text, match->length)) == NULL)
        return ap_config_oom();
    if ((status = ap_read_rule_backends(config, full, node)) != AP_OK) return status;
    const ap_ynode *options = ap_map_get(node, "options");
    if (options != NULL) status = ap_read_options(config, rule, options);
    return status;
}

/* ---- the top level ---------------------------------------------------------------------------- */

/* Relative folders are relative to the config file's folder, not to the working directory. */
static ap_status ap_read_plugin_path(ap_config *config, const ap_ynode *node) {
    ap_status status = ap_expect_kind(config, node, AP_YNODE_LIST, "a list of folders");
    if (status != AP_OK) return status;
    if (node->count == 0) return AP_OK;
    config->plugin_path = calloc(node->count, sizeof *config->plugin_path);
    if (config->plugin_path == NULL) return ap_config_oom();
    for (size_t i = 0; i < node->count; i++) {
        const ap_ynode *entry = node->items[i];
        if ((status = ap_read_string(config, entry, "a folder")) != AP_OK) return status;
        char *path = entry->text[0] != '/' && config->base_dir != NULL
                         ? ap_config_keepf(config, "%s/%s", config->base_dir, entry->text)
                         : ap_config_keep(config, entry->text, entry->length);
        if (path == NULL) return ap_config_oom();
        config->plugin_path[config->num_plugin_path++] = path;
    }
    return AP_OK;
}

static ap_status ap_read_rules(ap_config *config, const ap_ynode *top) {
    const ap_ynode *rules = ap_map_get(top, "rules");
    if (rules == NULL) return ap_node_error(config, top, "missing 'rules' (a list of rules)");
    ap_status status = ap_expect_kind(config, rules, AP_YNODE_LIST, "a list of rules");
    if (status != AP_OK) return status;
    if (rules->count == 0)
        return ap_node_error(config, rules, "empty list of rules: no model would ever match");
    config->rules = calloc(rules->count, sizeof *config->rules);
    if (config->rules == NULL) return ap_config_oom();
    for (size_t i = 0; i < rules->count; i++) {
        /* Counted before reading, so a half-read rule is freed with the config. */
        config->num_rules = i + 1;
        if ((status = ap_read_rule(config, &config->rules[i], rules->items[i])) != AP_OK)
            return status;
    }
    return AP_OK;
}

ap_status ap_config_build(ap_config *config, const ap_ynode *root) {
    char got[96];
    if (root->kind != AP_YNODE_MAP)
        return ap_node_error(config, root,
                             "expected a mapping with version, plugin_path and rules at the top, "
                             "got %s",
                             ap_ynode_describe(root, got, sizeof got));
    ap_status status = ap_map_check(config, root, ap_top_keys, AP_COUNT(ap_top_keys));
    if (status != AP_OK) return status;
    /* The version first: a newer file's other keys would only give confusing errors. */
    const ap_ynode *version = ap_map_get(root, "version");
    if (version == NULL)
        return ap_node_error(config, root, "missing 'version' (this attnplug reads version %d)",
                             AP_CONFIG_VERSION);
    if ((status = ap_read_int(config, version, "version", 0, &config->version)) != AP_OK)
        return status;
    if (config->version != AP_CONFIG_VERSION)
        return ap_node_error(config, version,
                             "unsupported config version %d (this attnplug reads version %d)",
                             config->version, AP_CONFIG_VERSION);
    const ap_ynode *plugin_path = ap_map_get(root, "plugin_path");
    if (plugin_path != NULL && (status = ap_read_plugin_path(config, plugin_path)) != AP_OK)
        return status;
    return ap_read_rules(config, root);
}
