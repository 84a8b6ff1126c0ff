/* json_writer.c: a small streaming JSON emitter with RFC 8259 string escaping. */
#include "json_writer.h"

#include <inttypes.h>

void ap_json_init(ap_json *json, FILE *stream) {
    json->stream = stream;
    json->depth = 0;
    json->has_items[0] = 0;
    json->after_key = 0;
    json->overflow = 0;
}

static void ap_json_indent(ap_json *json) {
    fputc('\n', json->stream);
    for (int i = 0; i < json->depth; i++) fputs("  ", json->stream);
}

/* Separator and indentation before any value or key. */
static void ap_json_before_value(ap_json *json) {
    if (json->after_key) {
        json->after_key = 0;
        return;
    }
    if (json->depth > 0) {
        if (json->has_items[json->depth]) fputc(',', json->stream);
        ap_json_indent(json);
    }
    json->has_items[json->depth] = 1;
}

static void ap_json_open(ap_json *json, char bracket) {
    ap_json_before_value(json);
    fputc(bracket, json->stream);
    if (json->depth + 1 >= AP_JSON_MAX_DEPTH) {
        json->overflow = 1;
        return;
    }
    json->depth++;
    json->has_items[json->depth] = 0;
}

static void ap_json_close(ap_json *json, char bracket) {
    if (json->depth == 0) {
        json->overflow = 1;
        return;
    }
    int had_items = json->has_items[json->depth];
    json->depth--;
    if (had_items) ap_json_indent(json);
    fputc(bracket, json->stream);
}

void ap_json_object_begin(ap_json *json) {
    ap_json_open(json, '{');
}
void ap_json_object_end(ap_json *json) {
    ap_json_close(json, '}');
}
void ap_json_array_begin(ap_json *json) {
    ap_json_open(json, '[');
}
void ap_json_array_end(ap_json *json) {
    ap_json_close(json, ']');
}

/* Length of the well-formed UTF-8 sequence at `p` (1..4), or 0 when it is not one. */
static int ap_json_utf8_length(const unsigned char *p) {
    int length = 0;
    uint32_t code = 0;
    if (p[0] < 0x80) return 1;
    if ((p[0] & 0xe0) == 0xc0)
        length = 2, code = p[0] & 0x1fu;
    else if ((p[0] & 0xf0) == 0xe0)
        length = 3, code = p[0] & 0x0fu;
    else if ((p[0] & 0xf8) == 0xf0)
        length = 4, code = p[0] & 0x07u;
    else
        return 0;
    for (int i = 1; i < length; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0; /* also stops at the NUL */
        code = (code << 6) | (p[i] & 0x3fu);
    }
    static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < smallest[length] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
    return length;
}

/* Write a quoted string: quote, backslash and control characters escaped, well-formed UTF-8
 * passed through, and any other byte (a path in another encoding) replaced by U+FFFD so the
 * document stays valid. */
static void ap_json_quoted(FILE *stream, const char *text) {
    fputc('"', stream);
    for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; p++) {
        if (*p >= 0x80) {
            int length = ap_json_utf8_length(p);
            if (length == 0) {
                fputs("\\ufffd", stream);
            } else {
                fwrite(p, 1, (size_t)length, stream);
                p += length - 1;
            }
            continue;
        }
        switch (*p) {
            case '"': fputs("\\\"", stream); break;
            case '\\': fputs("\\\\", stream); break;
            case '\n': fputs("\\n", stream); break;
            case '\r': fputs("\\r", stream); break;
            case '\t': fputs("\\t", stream); break;
            case '\b': fputs("\\b", stream); break;
            case '\f': fputs("\\f", stream); break;
            default:
                if (*p < 0x20 || *p == 0x7f)
                    fprintf(stream, "\\u%04x", *p);
                else
                    fputc(*p, stream);
        }
    }
    fputc('"', stream);
}

void ap_json_key(ap_json *json, const char *key) {
    ap_json_before_value(json);
    ap_json_quoted(json->stream, key);
    fputs(": ", json->stream);
    json->after_key = 1;
}

void ap_json_string(ap_json *json, const char *value) {
    if (value == NULL) {
        ap_json_null(json);
        return;
    }
    ap_json_before_value(json);
    ap_json_quoted(json->stream, value);
}

void ap_json_int(ap_json *json, int64_t value) {
    ap_json_before_value(json);
    fprintf(json->stream, "%" PRId64, value);
}

void ap_json_bool(ap_json *json, int value) {
    ap_json_before_value(json);
    fputs(value ? "true" : "false", json->stream);
}

void ap_json_null(ap_json *json) {
    ap_json_before_value(json);
    fputs("null", json->stream);
}

void ap_json_member_string(ap_json *json, const char *key, const char *value) {
    ap_json_key(json, key);
    ap_json_string(json, value);
}

void ap_json_member_int(ap_json *json, const char *key, int64_t value) {
    ap_json_key(json, key);
    ap_json_int(json, value);
}

void ap_json_member_bool(ap_json *json, const char *key, int value) {
    ap_json_key(json, key);
    ap_json_bool(json, value);
}

int ap_json_finish(ap_json *json) {
    fputc('\n', json->stream);
    return (json->overflow || json->depth != 0) ? -1 : 0;
}
