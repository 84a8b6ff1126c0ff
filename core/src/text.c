/* text.c: text from plugins and file names made safe to print and to keep: escaped and capped. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* The length of the well-formed UTF-8 sequence at `s` of a printable character, or 0 (a C0 or
 * C1 control, DEL, or bytes that are not well-formed UTF-8: overlong, surrogate, past U+10FFFF,
 * cut short). */
static size_t ap_utf8_printable(const unsigned char *s) {
    unsigned char c = s[0];
    if (c >= 0x20 && c < 0x7f) return 1;
    if (c < 0xc2 || c > 0xf4) return 0; /* controls, DEL, continuation bytes, overlong leads */
    size_t length = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    for (size_t i = 1; i < length; i++)
        if ((s[i] & 0xc0) != 0x80) return 0; /* also stops at the NUL */
    if (c == 0xc2 && s[1] < 0xa0) return 0;  /* U+0080..U+009F: the C1 controls */
    if (c == 0xe0 && s[1] < 0xa0) return 0;  /* overlong */
    if (c == 0xed && s[1] >= 0xa0) return 0; /* surrogates */
    if (c == 0xf0 && s[1] < 0x90) return 0;  /* overlong */
    if (c == 0xf4 && s[1] >= 0x90) return 0; /* past U+10FFFF */
    return length;
}

/* "\n", "\t", "\r" as such; other bytes that are not printable as "\xHH". */
static int ap_escape_byte(unsigned char c, char *out, size_t size) {
    switch (c) {
        case '\n': return snprintf(out, size, "\\n");
        case '\r': return snprintf(out, size, "\\r");
        case '\t': return snprintf(out, size, "\\t");
        default: return snprintf(out, size, "\\x%02x", c);
    }
}

/* One piece of the output: a printable character as it is, or one byte escaped. */
static size_t ap_escape_piece(const unsigned char *text, size_t size, char *piece,
                              size_t *advance) {
    size_t length = ap_utf8_printable(text);
    if (length == 0 || length > size) {
        *advance = 1;
        return (size_t)ap_escape_byte(text[0], piece, 8);
    }
    memcpy(piece, text, length);
    *advance = length;
    return length;
}

/* How long the escaped form of the `size` bytes at `text` is. */
static size_t ap_escaped_length(const unsigned char *text, size_t size) {
    size_t total = 0, advance;
    char piece[8];
    for (size_t at = 0; at < size && text[at] != '\0'; at += advance)
        total += ap_escape_piece(text + at, size - at, piece, &advance);
    return total;
}

/* Escape the `size` bytes at `text` into `out`; what does not fit is cut, ending in "...". */
static int ap_escape_span(const unsigned char *text, size_t size, char *out, size_t capacity) {
    static const char mark[] = "...";
    size_t mark_length = sizeof mark - 1, limit = capacity - 1, used = 0, advance;
    size_t room = limit > mark_length ? limit - mark_length : 0; /* what fits before a mark */
    int changed = 0, rest_fits = 0;
    for (size_t at = 0; at < size && text[at] != '\0'; at += advance) {
        char piece[8];
        size_t length = ap_escape_piece(text + at, size - at, piece, &advance);
        changed |= length != advance || (unsigned char)piece[0] != text[at];
        if (used + length > room && !rest_fits) {
            rest_fits = used + ap_escaped_length(text + at, size - at) <= limit;
            if (!rest_fits) {
                size_t n = limit - used < mark_length ? limit - used : mark_length;
                memcpy(out + used, mark, n);
                out[used + n] = '\0';
                return 1;
            }
        }
        memcpy(out + used, piece, length);
        used += length;
    }
    out[used] = '\0';
    return changed;
}

int ap_text_escape(const char *text, char *out, size_t capacity) {
    if (out == NULL || capacity == 0) return 0;
    if (text == NULL) text = "";
    return ap_escape_span((const unsigned char *)text, strlen(text), out, capacity);
}

void ap_text_escape_lines(const char *lines, char *out, size_t capacity) {
    size_t used = 0;
    if (capacity == 0) return;
    out[0] = '\0';
    for (const char *line = lines; line != NULL && *line != '\0' && used + 1 < capacity;) {
        const char *end = strchr(line, '\n');
        size_t length = end != NULL ? (size_t)(end - line) : strlen(line);
        if (used > 0 && used + 3 < capacity) used += (size_t)snprintf(out + used, 3, "; ");
        size_t room = capacity - used < AP_TEXT_LINE_MAX ? capacity - used : AP_TEXT_LINE_MAX;
        ap_escape_span((const unsigned char *)line, length, out + used, room);
        used += strlen(out + used);
        line = end != NULL ? end + 1 : NULL;
    }
}
