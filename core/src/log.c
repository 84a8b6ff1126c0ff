/* log.c: AP_DEBUG-gated diagnostics on stderr ("attnplug[load]: ..."), parsed once per process. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define AP_LOG_ALL (AP_LOG_LOAD | AP_LOG_SELECT | AP_LOG_CONFIG | AP_LOG_INSTANCE)

static pthread_once_t ap_log_once = PTHREAD_ONCE_INIT;
static unsigned ap_log_mask;

static const struct {
    const char *name;
    unsigned mask;
} ap_log_names[] = {
    {"load", AP_LOG_LOAD},         {"select", AP_LOG_SELECT}, {"config", AP_LOG_CONFIG},
    {"instance", AP_LOG_INSTANCE}, {"all", AP_LOG_ALL},
};

static void ap_log_parse(void) {
    const char *value = secure_getenv("AP_DEBUG");
    if (value == NULL) return;
    const char *p = value;
    while (*p != '\0') {
        while (*p == ' ') p++; /* "load, select" reads as meant */
        size_t len = strcspn(p, ",");
        while (len > 0 && p[len - 1] == ' ') len--;
        for (size_t i = 0; i < sizeof ap_log_names / sizeof ap_log_names[0]; i++) {
            if (strlen(ap_log_names[i].name) == len && strncmp(p, ap_log_names[i].name, len) == 0)
                ap_log_mask |= ap_log_names[i].mask;
        }
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
}

static const char *ap_log_category_name(ap_log_category category) {
    switch (category) {
        case AP_LOG_LOAD: return "load";
        case AP_LOG_SELECT: return "select";
        case AP_LOG_CONFIG: return "config";
        case AP_LOG_INSTANCE: return "instance";
    }
    return "?";
}

int ap_log_enabled(ap_log_category category) {
    pthread_once(&ap_log_once, ap_log_parse);
    return (ap_log_mask & (unsigned)category) != 0;
}

void ap_log(ap_log_category category, const char *fmt, ...) {
    if (!ap_log_enabled(category)) return;
    /* One fprintf per line so lines from several threads do not interleave. */
    char line[2048];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    if (n < 0) return;
    /* File names and plugin words reach a terminal here: one line, no control bytes. */
    char shown[sizeof line];
    ap_text_escape(line, shown, sizeof shown);
    fprintf(stderr, "attnplug[%s]: %s\n", ap_log_category_name(category), shown);
}
