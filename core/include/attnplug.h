/* attnplug.h: the host engine's API: find backends, pick one per model, run it.
 *
 * Hosts include this header only. It shares the data structs (model, batch, layer, tensors) with
 * plugin_api.h, but a host never calls a plugin's vtable: it calls the ap_instance_* functions,
 * which check arguments, translate messages into the thread-local last error, and return
 * AP_ERR_UNSUPPORTED for hooks the backend lacks.
 *
 * Errors: every function that can fail returns ap_status and leaves a one-line message in
 * ap_last_error() (per thread). Nothing aborts, exits or prints; AP_DEBUG=load,select,config,all
 * makes the core explain itself on stderr.
 */
#ifndef ATTNPLUG_H
#define ATTNPLUG_H

#include "plugin_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Errors and logging
 * ------------------------------------------------------------------------------------------- */

/* The message of this thread's last failing call ("" when none yet). Like errno, it is meaningful
 * only right after a call returned a status other than AP_OK: the per-layer calls
 * (ap_instance_forward_*, hooks) do not clear it when they succeed, to keep the hot path free of
 * work. Valid until the next attnplug call on this thread. */
const char *ap_last_error(void);

/* A short fixed name for a status, e.g. "AP_ERR_UNSUPPORTED". */
const char *ap_status_name(ap_status status);

/* The core's ABI version (what it offers plugins). */
void ap_core_abi_version(uint32_t *major, uint32_t *minor);

/* ---------------------------------------------------------------------------------------------
 * Devices
 * ------------------------------------------------------------------------------------------- */

/* Read device `ordinal` through the CUDA driver, opened at run time. With no driver or no such
 * GPU, returns AP_ERR_NO_DEVICE and fills `out` as the CPU (ordinal -1) with unusable_reason
 * saying why; the caller may carry on with that CPU device. */
ap_status ap_device_query(int32_t ordinal, ap_device *out);

/* Fill `out` as the CPU device with the given reason ("" for none). */
void ap_device_cpu(ap_device *out, const char *reason);

/* Would code compiled as `target` run on compute capability major.minor? CUDA's rules:
 * sm_XY on X.Z with Z >= Y; sm_XYa only on exactly X.Y; compute_XY PTX on any >= X.Y. */
int ap_arch_runs_on(ap_arch_target target, int32_t cc_major, int32_t cc_minor);

/* Which of a plugin's targets the driver would pick on cc major.minor (exact SASS, then the
 * newest same-major SASS, then the newest PTX), or -1 when none runs. */
int ap_arch_pick(const ap_arch_target *targets, size_t count, int32_t cc_major, int32_t cc_minor);

/* ---------------------------------------------------------------------------------------------
 * The registry: discovery and loading of plugin files
 * ------------------------------------------------------------------------------------------- */

typedef struct ap_registry ap_registry;

#define AP_REGISTRY_NO_DEFAULT_PATHS 0x1u /* skip env, install and build-tree folders */

typedef struct ap_registry_options {
    size_t struct_size;
    const char *const *search_dirs; /* host folders, searched first; may be NULL */
    size_t num_search_dirs;
    uint32_t flags; /* AP_REGISTRY_* */
} ap_registry_options;

/* Make an empty registry. `options` may be NULL (defaults). */
ap_status ap_registry_create(const ap_registry_options *options, ap_registry **out);

/* Add a folder to search (e.g. the config's plugin_path), after the host's folders. */
ap_status ap_registry_add_dir(ap_registry *registry, const char *dir);

/* Discover and load plugins: the host folders, then added folders, then AP_PLUGIN_PATH (which
 * replaces the defaults) or AP_ADD_PLUGIN_PATH (which adds), the install folder, and the build
 * tree when run from a checkout. Each folder's entries are read in sorted order. A file that
 * cannot be used is recorded with its reason; scanning carries on. Safe to call from several
 * threads; a second call only loads files not seen before. */
ap_status ap_registry_scan(ap_registry *registry);

/* Load one plugin file by path (also what the scan does for each file it finds). */
ap_status ap_registry_load_file(ap_registry *registry, const char *path);

/* Free the registry. Instances must be closed first; plugins are never dlclose'd while one
 * lives (the call then returns without unloading them and reports AP_ERR_INVALID_ARGUMENT). */
ap_status ap_registry_destroy(ap_registry *registry);

/* What became of one plugin file. */
typedef struct ap_file_record {
    const char *path;
    ap_status status;    /* AP_OK when loaded */
    const char *message; /* why it was refused; "" when loaded */
    const char *backend; /* the backend name it provides, or NULL */
} ap_file_record;

size_t ap_registry_file_count(const ap_registry *registry);
ap_status ap_registry_file(const ap_registry *registry, size_t index, ap_file_record *out);

/* Loaded backends, sorted by name. The descriptor is for reading name, version, description
 * and caps; the vtable stays the core's business. */
size_t ap_registry_backend_count(const ap_registry *registry);
const ap_descriptor *ap_registry_backend(const ap_registry *registry, size_t index);
const ap_descriptor *ap_registry_find(const ap_registry *registry, const char *name);
const char *ap_registry_backend_path(const ap_registry *registry, const char *name);

/* ---------------------------------------------------------------------------------------------
 * Selection: which backend can serve this model here, and why not the others
 * ------------------------------------------------------------------------------------------- */

/* The core's verdict on one backend for one (model, options, device). */
typedef struct ap_verdict {
    const char *backend; /* the name asked for */
    ap_status status;    /* AP_OK: usable; else why not (NOT_FOUND, NO_DEVICE, UNSUPPORTED, ...) */
    const char *reasons; /* '\n'-separated reasons; "" when usable */
    int arch_index;      /* the picked entry of caps.archs, or -1 */
} ap_verdict;

/* Apply options (page size, KV dtype) to a copy of the model: what a backend will see. */
void ap_model_apply_options(const ap_model *model, const ap_options *options, ap_model *out);

/* Check one backend: device kind and arch, static caps, then the plugin's validate(). Strings in
 * `out` live until the next call to ap_registry_check on this thread, which ap_instance_open and
 * ap_config_open also make: copy them first to keep them. */
ap_status ap_registry_check(ap_registry *registry, const char *name, const ap_model *model,
                            const ap_options *options, const ap_device *device, ap_verdict *out);

/* A walk over a preference list: the verdict on each candidate tried, and the one chosen. */
typedef struct ap_selection ap_selection;

/* Walk `names` in order; the first that serves is chosen. With `explicit_single` = 1 and one
 * name, a refusal is a hard error. Returns AP_OK when one was chosen, else AP_ERR_REFUSED (or
 * the single backend's status) with every reason in the last error. The selection is filled in
 * both cases (free it with ap_selection_destroy). */
ap_status ap_select(ap_registry *registry, const char *const *names, size_t count,
                    int explicit_single, const ap_model *model, const ap_options *options,
                    const ap_device *device, ap_selection **out);
size_t ap_selection_count(const ap_selection *selection);
const ap_verdict *ap_selection_verdict(const ap_selection *selection, size_t index);
const char *ap_selection_chosen(const ap_selection *selection); /* NULL if none */
void ap_selection_destroy(ap_selection *selection);

/* ---------------------------------------------------------------------------------------------
 * Instances
 * ------------------------------------------------------------------------------------------- */

typedef struct ap_instance ap_instance;

/* Check then create backend `name` for the model. Refusals come back as AP_ERR_REFUSED (or the
 * check's status) with the reasons in the last error. */
ap_status ap_instance_open(ap_registry *registry, const char *name, const ap_model *model,
                           const ap_options *options, const ap_device *device, ap_instance **out);
void ap_instance_close(ap_instance *instance);

const char *ap_instance_backend(const ap_instance *instance);
const ap_model *ap_instance_model(const ap_instance *instance); /* with options applied */
const ap_caps *ap_instance_caps(const ap_instance *instance);

ap_status ap_instance_kv_spec(ap_instance *instance, ap_kv_spec *out);
ap_status ap_instance_init_metadata(ap_instance *instance, const ap_batch *batch, void *stream);
ap_status ap_instance_forward_extend(ap_instance *instance, const ap_layer *layer,
                                     const ap_forward_args *args, void *stream);
ap_status ap_instance_forward_decode(ap_instance *instance, const ap_layer *layer,
                                     const ap_forward_args *args, void *stream);

/* Hooks, resolved once when the instance opened. AP_ERR_UNSUPPORTED where absent. */
int ap_instance_has_hook(const ap_instance *instance, const char *name);
void *ap_instance_hook(ap_instance *instance, const char *name); /* any name, uncached */
ap_status ap_instance_append_kv(ap_instance *instance, const ap_layer *layer,
                                const ap_append_kv_args *args, void *stream);
ap_status ap_instance_pack_prefix_chunk_kv(ap_instance *instance, const ap_pack_kv_args *args,
                                           void *stream);
ap_status ap_instance_cuda_graph_prepare(ap_instance *instance, int32_t max_batch, void *stream);
/* merge_state/1: (o_a, lse_a) + (o_b, lse_b) -> (o, lse), plugin_api.h gives the formula. The
 * core checks that o_a, o_b and o share one shape [T][H][D] and one float dtype, and that the
 * LSEs are float32 [T][H]; everything dense, on the instance's device. */
ap_status ap_instance_merge_state(ap_instance *instance, const ap_merge_state_args *args,
                                  void *stream);

/* ---------------------------------------------------------------------------------------------
 * YAML config
 * ------------------------------------------------------------------------------------------- */

typedef struct ap_config ap_config;

/* One rule of the config. Strings live as long as the config. */
typedef struct ap_config_rule {
    const char *pattern;         /* fnmatch glob on the model name */
    const char *const *backends; /* preference list */
    size_t num_backends;
    int explicit_single; /* 1: written as `backend: NAME` (a refusal is an error) */
    ap_options options;  /* page_size, kv_dtype, flags, backend-specific extras */
    int32_t line;        /* where the rule starts in the file, 1-based */
} ap_config_rule;

/* Parse a file / a string. Errors: AP_ERR_CONFIG with "file:line:column: message". */
ap_status ap_config_load(const char *path, ap_config **out);
ap_status ap_config_parse(const char *text, size_t length, const char *source_name,
                          ap_config **out);
void ap_config_destroy(ap_config *config);

int32_t ap_config_version(const ap_config *config);
size_t ap_config_plugin_path_count(const ap_config *config);
const char *ap_config_plugin_path(const ap_config *config, size_t index);
size_t ap_config_rule_count(const ap_config *config);
const ap_config_rule *ap_config_rule_at(const ap_config *config, size_t index);

/* The first rule whose pattern matches `model_name`, or NULL (AP_ERR_NOT_FOUND in last error). */
const ap_config_rule *ap_config_match(const ap_config *config, const char *model_name);

/* Match the model's rule, walk its backends and open the first that serves. `selection` (may
 * be NULL) receives the walk with every verdict, also on failure. */
ap_status ap_config_open(const ap_config *config, ap_registry *registry, const ap_model *model,
                         const ap_device *device, ap_instance **out, ap_selection **selection);

/* Names for enums, and parsing them (config, tools). */
const char *ap_dtype_name(ap_dtype dtype); /* "bf16", "fp8_e4m3", ... */
ap_status ap_dtype_parse(const char *name, ap_dtype *out);
const char *ap_attn_kind_name(ap_attn_kind kind); /* "mha", "mla" */
size_t ap_dtype_size_bits(ap_dtype dtype);        /* 32, 16, 8, 4 (nvfp4: values only) */

#ifdef __cplusplus
}
#endif

#endif /* ATTNPLUG_H */
