/* config_yaml.c: libyaml's event stream turned into a small positioned tree for the config. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config_internal.h"

typedef struct ap_yreader {
    yaml_parser_t parser;
    const char *text; /* the whole input, to place reader errors that only know a byte offset */
    size_t length;
    const char *source;
} ap_yreader;

ap_status ap_config_error(const char *source, int32_t line, int32_t column, const char *fmt, ...) {
    char message[1536];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    return ap_error_set(AP_ERR_CONFIG, "%s:%d:%d: %s", source, line, column, message);
}

static int32_t ap_mark_number(size_t zero_based) {
    return zero_based >= INT32_MAX ? INT32_MAX : (int32_t)zero_based + 1;
}

/* Line and column (1-based, in characters) of a byte offset: libyaml's reader errors (bad
 * UTF-8, control characters) carry only the offset. */
static void ap_offset_position(const char *text, size_t length, size_t offset, int32_t *line,
                               int32_t *column) {
    *line = 1;
    *column = 1;
    for (size_t i = 0; i < offset && i < length; i++) {
        unsigned char byte = (unsigned char)text[i];
        if (byte == '\n') {
            ++*line;
            *column = 1;
        } else if ((byte & 0xC0) != 0x80) {
            ++*column;
        }
    }
}

/* Report why libyaml stopped, at the place it names. */
static ap_status ap_yreader_fail(ap_yreader *reader) {
    const yaml_parser_t *parser = &reader->parser;
    if (parser->error == YAML_MEMORY_ERROR)
        return ap_error_set(AP_ERR_OUT_OF_MEMORY, "%s: out of memory while reading YAML",
                            reader->source);
    const char *problem = parser->problem != NULL ? parser->problem : "unknown error";
    int32_t line, column;
    if (parser->error == YAML_READER_ERROR) {
        ap_offset_position(reader->text, reader->length, parser->problem_offset, &line, &column);
        return ap_config_error(reader->source, line, column, "malformed YAML: %s", problem);
    }
    line = ap_mark_number(parser->problem_mark.line);
    column = ap_mark_number(parser->problem_mark.column);
    /* An unquoted glob such as *Llama* reads as a broken alias: say so where the '*' is. */
    if (parser->context != NULL && strstr(parser->context, "alias") != NULL)
        return ap_config_error(reader->source, ap_mark_number(parser->context_mark.line),
                               ap_mark_number(parser->context_mark.column),
                               "malformed YAML: %s, %s (a glob starting with '*' must be quoted)",
                               parser->context, problem);
    if (parser->context == NULL)
        return ap_config_error(reader->source, line, column, "malformed YAML: %s", problem);
    return ap_config_error(reader->source, line, column, "malformed YAML: %s (%s at %d:%d)",
                           problem, parser->context, ap_mark_number(parser->context_mark.line),
                           ap_mark_number(parser->context_mark.column));
}

static ap_status ap_yreader_next(ap_yreader *reader, yaml_event_t *event) {
    if (!yaml_parser_parse(&reader->parser, event)) return ap_yreader_fail(reader);
    return AP_OK;
}

void ap_ynode_free(ap_ynode *node) {
    if (node == NULL) return;
    for (size_t i = 0; i < node->count; i++) ap_ynode_free(node->items[i]);
    free(node->items);
    free(node->text);
    free(node);
}

static ap_status ap_ynode_append(ap_ynode *parent, ap_ynode *child) {
    if (parent->count == parent->capacity) {
        size_t capacity = parent->capacity ? 2 * parent->capacity : 8;
        ap_ynode **items = realloc(parent->items, capacity * sizeof *items);
        if (items == NULL) return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory");
        parent->items = items;
        parent->capacity = capacity;
    }
    parent->items[parent->count++] = child;
    return AP_OK;
}

/* Anchors, aliases and tags would need a half-implemented YAML: refuse them by name. A bare
 * `*` glob is the usual way to meet this, so the alias message says to quote it. */
static ap_status ap_yevent_refuse_extras(const ap_yreader *reader, const yaml_event_t *event) {
    int32_t line = ap_mark_number(event->start_mark.line);
    int32_t column = ap_mark_number(event->start_mark.column);
    const yaml_char_t *anchor = NULL, *tag = NULL;
    switch (event->type) {
        case YAML_ALIAS_EVENT:
            return ap_config_error(reader->source, line, column,
                                   "YAML aliases (*%s) are not supported; write the value out "
                                   "(a glob starting with '*' must be quoted: \"*\")",
                                   (const char *)event->data.alias.anchor);
        case YAML_SCALAR_EVENT:
            anchor = event->data.scalar.anchor;
            tag = event->data.scalar.tag;
            break;
        case YAML_SEQUENCE_START_EVENT:
            anchor = event->data.sequence_start.anchor;
            tag = event->data.sequence_start.tag;
            break;
        case YAML_MAPPING_START_EVENT:
            anchor = event->data.mapping_start.anchor;
            tag = event->data.mapping_start.tag;
            break;
        default: return AP_OK;
    }
    if (anchor != NULL)
        return ap_config_error(reader->source, line, column,
                               "YAML anchors (&%s) are not supported; write the value out",
                               (const char *)anchor);
    if (tag != NULL)
        return ap_config_error(reader->source, line, column,
                               "YAML tags (%s) are not supported; write the plain value",
                               (const char *)tag);
    return AP_OK;
}

static ap_status ap_ynode_from_event(ap_yreader *reader, yaml_event_t *event, int depth,
                                     ap_ynode **out);

/* Read the children of a list or map whose start event was just consumed. */
static ap_status ap_ynode_read_children(ap_yreader *reader, ap_ynode *node, int depth) {
    yaml_event_type_t end =
        node->kind == AP_YNODE_LIST ? YAML_SEQUENCE_END_EVENT : YAML_MAPPING_END_EVENT;
    for (;;) {
        yaml_event_t event;
        ap_status status = ap_yreader_next(reader, &event);
        if (status != AP_OK) return status;
        if (event.type == end) {
            yaml_event_delete(&event);
            return AP_OK;
        }
        ap_ynode *child = NULL;
        status = ap_ynode_from_event(reader, &event, depth + 1, &child);
        yaml_event_delete(&event);
        if (status == AP_OK) status = ap_ynode_append(node, child);
        if (status != AP_OK) {
            ap_ynode_free(child);
            return status;
        }
    }
}

/* Build the node that starts with `event` (the caller deletes the event). */
static ap_status ap_ynode_from_event(ap_yreader *reader, yaml_event_t *event, int depth,
                                     ap_ynode **out) {
    ap_status status = ap_yevent_refuse_extras(reader, event);
    if (status != AP_OK) return status;
    int32_t line = ap_mark_number(event->start_mark.line);
    int32_t column = ap_mark_number(event->start_mark.column);
    if (depth > AP_YAML_MAX_DEPTH)
        return ap_config_error(reader->source, line, column, "nesting deeper than %d levels",
                               AP_YAML_MAX_DEPTH);
    ap_ynode *node = calloc(1, sizeof *node);
    if (node == NULL) return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory");
    node->line = line;
    node->column = column;
    switch (event->type) {
        case YAML_SCALAR_EVENT:
            node->kind = AP_YNODE_SCALAR;
            node->length = event->data.scalar.length;
            node->quoted = event->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
            node->text = malloc(node->length + 1);
            if (node->text == NULL) {
                status = ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory");
                break;
            }
            memcpy(node->text, event->data.scalar.value, node->length);
            node->text[node->length] = '\0';
            break;
        case YAML_SEQUENCE_START_EVENT:
            node->kind = AP_YNODE_LIST;
            status = ap_ynode_read_children(reader, node, depth);
            break;
        case YAML_MAPPING_START_EVENT:
            node->kind = AP_YNODE_MAP;
            status = ap_ynode_read_children(reader, node, depth);
            break;
        default:
            status = ap_error_set(AP_ERR_INTERNAL, "%s:%d:%d: unexpected YAML event %d",
                                  reader->source, line, column, (int)event->type);
            break;
    }
    if (status != AP_OK) {
        ap_ynode_free(node);
        return status;
    }
    *out = node;
    return AP_OK;
}

/* Expect the event of `type` next; anything else is a bug in libyaml's contract. */
static ap_status ap_yreader_expect(ap_yreader *reader, yaml_event_type_t type) {
    yaml_event_t event;
    ap_status status = ap_yreader_next(reader, &event);
    if (status != AP_OK) return status;
    if (event.type != type)
        status = ap_error_set(AP_ERR_INTERNAL, "%s: unexpected YAML event %d (wanted %d)",
                              reader->source, (int)event.type, (int)type);
    yaml_event_delete(&event);
    return status;
}

/* The stream: one document holding the root node, then the end. No document or a null root
 * is an empty config; a second document is refused, since it would be silently ignored. */
static ap_status ap_yreader_document(ap_yreader *reader, ap_ynode **out) {
    ap_status status = ap_yreader_expect(reader, YAML_STREAM_START_EVENT);
    if (status != AP_OK) return status;
    yaml_event_t event;
    if ((status = ap_yreader_next(reader, &event)) != AP_OK) return status;
    yaml_event_type_t type = event.type;
    yaml_event_delete(&event);
    if (type == YAML_STREAM_END_EVENT) return ap_config_error(reader->source, 1, 1, "empty config");
    if ((status = ap_yreader_next(reader, &event)) != AP_OK) return status;
    ap_ynode *root = NULL;
    status = ap_ynode_from_event(reader, &event, 1, &root);
    yaml_event_delete(&event);
    if (status == AP_OK) status = ap_yreader_expect(reader, YAML_DOCUMENT_END_EVENT);
    if (status == AP_OK) status = ap_yreader_next(reader, &event);
    if (status == AP_OK) {
        if (event.type != YAML_STREAM_END_EVENT)
            status = ap_config_error(reader->source, ap_mark_number(event.start_mark.line),
                                     ap_mark_number(event.start_mark.column),
                                     "a second YAML document; a config holds exactly one");
        yaml_event_delete(&event);
    }
    if (status == AP_OK && root->kind == AP_YNODE_SCALAR && !root->quoted && root->length == 0)
        status = ap_config_error(reader->source, 1, 1, "empty config");
    if (status != AP_OK) {
        ap_ynode_free(root);
        return status;
    }
    *out = root;
    return AP_OK;
}

ap_status ap_ynode_parse(const char *text, size_t length, const char *source, ap_ynode **out) {
    ap_yreader reader = {.text = text, .length = length, .source = source};
    *out = NULL;
    if (!yaml_parser_initialize(&reader.parser))
        return ap_error_set(AP_ERR_OUT_OF_MEMORY, "%s: cannot start the YAML parser", source);
    yaml_parser_set_input_string(&reader.parser, (const unsigned char *)text, length);
    ap_status status = ap_yreader_document(&reader, out);
    yaml_parser_delete(&reader.parser);
    return status;
}

const char *ap_ynode_describe(const ap_ynode *node, char *text, size_t size) {
    switch (node->kind) {
        case AP_YNODE_MAP: return "a mapping";
        case AP_YNODE_LIST: return "a list";
        case AP_YNODE_SCALAR: break;
    }
    if (node->length == 0 && !node->quoted) return "nothing";
    snprintf(text, size, "%s '%.60s%s'", node->quoted ? "the quoted string" : "the value",
             node->text, node->length > 60 ? "..." : "");
    return text;
}
