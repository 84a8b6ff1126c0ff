/* json_writer.h: a small streaming JSON emitter for the tools' --json output. */
#ifndef AP_JSON_WRITER_H
#define AP_JSON_WRITER_H

#include <stdint.h>
#include <stdio.h>

#define AP_JSON_MAX_DEPTH 32

/* Writes indented JSON to a stream. Commas and indentation are its business; the caller only
 * opens, closes and writes values, naming each member of an object with ap_json_key first. */
typedef struct ap_json {
    FILE *stream;
    int depth;
    int has_items[AP_JSON_MAX_DEPTH]; /* a value was written at this depth: next needs a comma */
    int after_key;                    /* the next value follows "key": on the same line */
    int overflow;                     /* nesting went past AP_JSON_MAX_DEPTH: output is invalid */
} ap_json;

void ap_json_init(ap_json *json, FILE *stream);
void ap_json_object_begin(ap_json *json);
void ap_json_object_end(ap_json *json);
void ap_json_array_begin(ap_json *json);
void ap_json_array_end(ap_json *json);
void ap_json_key(ap_json *json, const char *key);
void ap_json_string(ap_json *json, const char *value); /* NULL writes null */
void ap_json_int(ap_json *json, int64_t value);
void ap_json_bool(ap_json *json, int value);
void ap_json_null(ap_json *json);

/* Shorthands for a member of an object. */
void ap_json_member_string(ap_json *json, const char *key, const char *value);
void ap_json_member_int(ap_json *json, const char *key, int64_t value);
void ap_json_member_bool(ap_json *json, const char *key, int value);

/* Finish the document with a newline. Returns 0 when the output is well formed. */
int ap_json_finish(ap_json *json);

#endif /* AP_JSON_WRITER_H */
