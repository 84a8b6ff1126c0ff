/* error.c: the thread-local last error every failing core call leaves behind, and the ABI version. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define AP_ERROR_CAPACITY 2048

static _Thread_local char ap_error_text[AP_ERROR_CAPACITY];

ap_status ap_error_set(ap_status status, const char *fmt, ...) {
    /* Format into a scratch buffer first: callers may pass ap_last_error() as an argument. */
    char scratch[AP_ERROR_CAPACITY];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(scratch, sizeof scratch, fmt, args);
    va_end(args);
    if (n < 0) scratch[0] = '\0';
    memcpy(ap_error_text, scratch, sizeof scratch);
    return status;
}

void ap_error_clear(void) {
    ap_error_text[0] = '\0';
}

const char *ap_last_error(void) {
    return ap_error_text;
}

void ap_core_abi_version(uint32_t *major, uint32_t *minor) {
    if (major != NULL) *major = AP_ABI_VERSION_MAJOR;
    if (minor != NULL) *minor = AP_ABI_VERSION_MINOR;
}
