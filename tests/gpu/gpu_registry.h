/* gpu_registry.h: what a GPU test needs before its cases (the backend under test, cpu_ref, a
 * usable GPU), each checked apart and said apart when missing. The checks return -1 to carry on,
 * or the test's exit code: GPU_EXIT_SKIP (meson's "skipped") or 1 (a failure). */
#ifndef AP_GPU_REGISTRY_H
#define AP_GPU_REGISTRY_H

#include "attnplug.h"

#define GPU_EXIT_SKIP 77

/* `backend` in the registry: skipped only when no file of it failed to load (a plugin that is
 * built but does not load is a failure; each such file is said on stderr). */
int gpu_backend_present(const ap_registry *registry, const char *backend);

/* cpu_ref is the oracle: without it nothing can be judged, which is a failure, not a skip. */
int gpu_reference_present(const ap_registry *registry);

/* Device 0 into *device when it is usable; else a skip naming why. */
int gpu_device_usable(ap_device *device);

#endif
