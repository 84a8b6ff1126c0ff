/* config_internal.h: private structures shared by the YAML config files (config*.c). */
#ifndef ATTNPLUG_CONFIG_INTERNAL_H
#define ATTNPLUG_CONFIG_INTERNAL_H

#include "internal.h"

/* Deeper nesting than this is refused: the format needs five levels, and a bound keeps a
 * hostile file from exhausting the stack of the recursive tree builder. */
#define AP_YAML_MAX_DEPTH 32

/* ---- the YAML tree (config_yaml.c) ---------------------------------------------------------
 * libyaml's events turned into a small tree that keeps every node's position. Anchors, aliases
 * and tags are refused while building it, so the tree is a plain tree (no shared nodes). */
typedef enum ap_ynode_kind { AP_YNODE_SCALAR, AP_YNODE_LIST, AP_YNODE_MAP } ap_ynode_kind;

typedef struct ap_ynode {
    ap_ynode_kind kind;
    int32_t line, column; /* 1-based */
    char *text;           /* scalars: the value, NUL-terminated */
    size_t length;
    int quoted;              /* scalars: written in quotes or as a block (so never a number) */
    struct ap_ynode **items; /* lists: the items; maps: key, value, key, value, ... */
    size_t count, capacity;
} ap_ynode;

/* Parse `text` into a tree. An empty stream gives "SOURCE:1:1: empty config". Every failure
 * is AP_ERR_CONFIG (or AP_ERR_OUT_OF_MEMORY) with "SOURCE:LINE:COLUMN: message". */
ap_status ap_ynode_parse(const char *text, size_t length, const char *source, ap_ynode **out);
void ap_ynode_free(ap_ynode *node);

/* "a mapping", "a list", "the string 'x'", "nothing": what a type error says it got. */
const char *ap_ynode_describe(const ap_ynode *node, char *text, size_t size);

/* Set the last error to AP_ERR_CONFIG "SOURCE:LINE:COLUMN: message" and return it. */
ap_status ap_config_error(const char *source, int32_t line, int32_t column, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- the parsed config (config_parse.c, config.c, config_open.c) ---------------------------- */

/* Where something was written in the file. */
typedef struct ap_config_pos {
    int32_t line, column;
} ap_config_pos;

/* A rule with what only the core needs: positions for messages at open time. The public part
 * comes first, so an ap_config_rule pointer handed out converts back. */
typedef struct ap_config_rule_full {
    ap_config_rule rule;
    int32_t column;             /* of the rule's first key */
    ap_config_pos list_pos;     /* the `backend:` / `backends:` value */
    ap_config_pos *backend_pos; /* one per rule.backends entry */
} ap_config_rule_full;

struct ap_config {
    char *source;   /* the path or source name, as given: the FILE of every message */
    char *base_dir; /* the config file's folder (for plugin_path), or NULL for a string */
    int32_t version;
    char **plugin_path; /* resolved against base_dir */
    size_t num_plugin_path;
    ap_config_rule_full *rules;
    size_t num_rules;
    char **strings; /* every string the rules point at, freed with the config */
    size_t num_strings, cap_strings;
};

/* Fill `config` (source and base_dir already set) from the tree's root. */
ap_status ap_config_build(ap_config *config, const ap_ynode *root);

/* A copy of `length` bytes of `text` owned by the config, or NULL when memory ran out. */
char *ap_config_keep(ap_config *config, const char *text, size_t length);
char *ap_config_keepf(ap_config *config, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif /* ATTNPLUG_CONFIG_INTERNAL_H */
