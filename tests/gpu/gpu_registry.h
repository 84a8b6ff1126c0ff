/* gpu_registry.h: what a GPU test says when a backend it needs is not in the registry. */
#ifndef AP_GPU_REGISTRY_H
#define AP_GPU_REGISTRY_H

#include "attnplug.h"

/* Print on stderr every plugin file of `backend` the scan found but refused (path, status,
 * message); a file whose descriptor was not read is matched by `backend` in its path. Returns 1
 * when there was one (a failure, not a skip: the plugin is built but does not load), else 0. */
int gpu_backend_load_failed(const ap_registry *registry, const char *backend);

#endif
