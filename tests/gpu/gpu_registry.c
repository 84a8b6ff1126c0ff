/* gpu_registry.c: see gpu_registry.h. */
#include "gpu_registry.h"

#include <stdio.h>
#include <string.h>

/* Print on stderr every plugin file of `backend` the scan found but refused (path, status,
 * message); a file whose descriptor was not read is matched by `backend` in its path. Returns 1
 * when there was one, else 0. */
static int gpu_backend_load_failed(const ap_registry *registry, const char *backend) {
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

int gpu_backend_present(const ap_registry *registry, const char *backend) {
    if (ap_registry_find(registry, backend) != NULL) return -1;
    if (gpu_backend_load_failed(registry, backend)) return 1;
    printf("SKIP: backend %s is not built or not found\n", backend);
    return GPU_EXIT_SKIP;
}

int gpu_reference_present(const ap_registry *registry) {
    if (ap_registry_find(registry, "cpu_ref") != NULL) return -1;
    gpu_backend_load_failed(registry, "cpu_ref");
    fprintf(stderr, "cpu_ref, the reference, is not loaded: nothing to compare with\n");
    return 1;
}

int gpu_device_usable(ap_device *device) {
    if (ap_device_query(0, device) == AP_OK && device->unusable_reason[0] == '\0') return -1;
    printf("SKIP: no usable GPU: %s\n",
           device->unusable_reason[0] != '\0' ? device->unusable_reason : ap_last_error());
    return GPU_EXIT_SKIP;
}
