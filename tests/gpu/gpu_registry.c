/* gpu_registry.c: see gpu_registry.h. */
#include "gpu_registry.h"

#include <stdio.h>
#include <string.h>

int gpu_backend_load_failed(const ap_registry *registry, const char *backend) {
    int failed = 0;
    for (size_t i = 0; i < ap_registry_file_count(registry); i++) {
        ap_file_record record;
        if (ap_registry_file(registry, i, &record) != AP_OK || record.status == AP_OK) continue;
        int named = record.backend != NULL ? strcmp(record.backend, backend) == 0
                                           : strstr(record.path, backend) != NULL;
        if (named) {
            fprintf(stderr, "%s: %s: %s\n", record.path, ap_status_name(record.status),
                    record.message);
            failed = 1;
        }
    }
    return failed;
}
