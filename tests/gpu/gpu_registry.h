/* gpu_registry.h: what a GPU test needs before its cases (the backend under test, cpu_ref, a
 * usable GPU), each checked apart and said apart when missing. The checks return -1 to carry on,
 * or the test's exit code: GPU_EXIT_SKIP (meson's "skipped") or 1 (a failure). */
#ifndef AP_GPU_REGISTRY_H
#define AP_GPU_REGISTRY_H

#include "attnplug.h"

#define GPU_EXIT_SKIP 77

/* Print on stderr every plugin file of `backend` the scan found but refused (path, status,
 * message); a file whose descriptor was not read is matched by `backend` in its path. Returns 1
 * when there was one (a failure, not a skip: the plugin is built but does not load), else 0. */
int gpu_backend_load_failed(const ap_registry *registry, const char *backend);

/* `backend` in the registry: skipped only when no file of it failed to load. */
int gpu_backend_present(const ap_registry *registry, const char *backend);

/* cpu_ref is the oracle: without it nothing can be judged, which is a failure, not a skip. */
int gpu_reference_present(const ap_registry *registry);

/* Device 0 into *device when it is usable; else a skip naming why. */
int gpu_device_usable(ap_device *device);

#endif
