/* instance.c: open and close backend instances, and call them through checked wrappers. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Copy a failing call's message (from the plugin, or from the core's own argument check) into
 * the last error, naming the backend and the entry. */
static ap_status ap_instance_fail(const ap_instance *instance, const char *entry,
                                  ap_status status) {
    const char *name = instance->plugin->desc->name;
    if (instance->message[0] == '\0')
        return ap_error_set(status, "backend '%s': %s failed (%s)", name, entry,
                            ap_status_name(status));
    return ap_error_set(status, "backend '%s': %s: %s", name, entry, instance->message);
}

/* Reset the instance's message buffer for the next call. */
static ap_msgbuf ap_instance_msg(ap_instance *instance) {
    return ap_msgbuf_over(instance->message, sizeof instance->message);
}

static void *ap_instance_resolve(ap_instance *instance, const char *name) {
    void *hook = instance->plugin->desc->vtable->get_hook(instance->backend, name);
    ap_log(AP_LOG_INSTANCE, "%s: hook %s %s", instance->plugin->desc->name, name,
           hook != NULL ? "present" : "absent");
    return hook;
}

ap_status ap_instance_open(ap_registry *registry, const char *name, const ap_model *model,
                           const ap_options *options, const ap_device *device, ap_instance **out) {
    if (out == NULL) return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_instance_open: out is NULL");
    *out = NULL;
    if (name == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_instance_open: name is NULL");
    ap_verdict verdict;
    ap_status status = ap_registry_check(registry, name, model, options, device, &verdict);
    if (status != AP_OK) return status; /* the last error holds every reason */
    if (options == NULL) options = &ap_options_default;

    ap_instance *instance = calloc(1, sizeof *instance);
    if (instance == NULL)
        return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory opening '%s'", name);
    instance->registry = registry;
    instance->plugin = ap_registry_find_plugin(registry, name);
    instance->device = *device;
    instance->batch_max_page = -1;
    instance->batch_num_kv_tokens = -1;
    ap_model_apply_options(model, options, &instance->model);
    if (model->name != NULL) {
        instance->model_name = strdup(model->name);
        if (instance->model_name == NULL) {
            free(instance);
            return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory opening '%s'", name);
        }
    }
    instance->model.name = instance->model_name;

    /* Counted before create so a concurrent ap_registry_destroy cannot unload the plugin while
     * its create() runs. */
    atomic_fetch_add(&registry->live_instances, 1);
    ap_msgbuf msg = ap_instance_msg(instance);
    status = instance->plugin->desc->vtable->create(&instance->model, options, &instance->device,
                                                    &instance->backend, &msg);
    if (status != AP_OK || instance->backend == NULL) {
        if (status == AP_OK) status = AP_ERR_INTERNAL; /* "success" without an instance */
        ap_status result =
            instance->message[0] != '\0'
                ? ap_error_set(status, "backend '%s': create failed: %s", name, instance->message)
                : ap_error_set(status, "backend '%s': create failed (%s)", name,
                               ap_status_name(status));
        atomic_fetch_sub(&registry->live_instances, 1);
        free(instance->model_name);
        free(instance);
        return result;
    }
    instance->append_kv = (ap_hook_append_kv_v1)ap_instance_resolve(instance, AP_HOOK_APPEND_KV_V1);
    instance->pack_prefix_chunk_kv = (ap_hook_pack_prefix_chunk_kv_v1)ap_instance_resolve(
        instance, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1);
    instance->cuda_graph =
        (ap_hook_cuda_graph_v1)ap_instance_resolve(instance, AP_HOOK_CUDA_GRAPH_V1);
    instance->merge_state =
        (ap_hook_merge_state_v1)ap_instance_resolve(instance, AP_HOOK_MERGE_STATE_V1);
    ap_log(AP_LOG_INSTANCE, "%s: opened for model '%s'", name,
           instance->model_name != NULL ? instance->model_name : "(unnamed)");
    ap_error_clear();
    *out = instance;
    return AP_OK;
}

void ap_instance_close(ap_instance *instance) {
    if (instance == NULL) return;
    instance->plugin->desc->vtable->destroy(instance->backend);
    ap_log(AP_LOG_INSTANCE, "%s: closed", instance->plugin->desc->name);
    atomic_fetch_sub(&instance->registry->live_instances, 1);
    free(instance->model_name);
    free(instance);
}

const char *ap_instance_backend(const ap_instance *instance) {
    return instance != NULL ? instance->plugin->desc->name : NULL;
}

const ap_model *ap_instance_model(const ap_instance *instance) {
    return instance != NULL ? &instance->model : NULL;
}

const ap_caps *ap_instance_caps(const ap_instance *instance) {
    return instance != NULL ? instance->plugin->desc->caps : NULL;
}

ap_status ap_instance_kv_spec(ap_instance *instance, ap_kv_spec *out) {
    if (instance == NULL || out == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_instance_kv_spec: NULL %s",
                            instance == NULL ? "instance" : "out");
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    ap_msgbuf msg = ap_instance_msg(instance);
    ap_status status = instance->plugin->desc->vtable->get_kv_spec(instance->backend, out, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, "get_kv_spec", status);
    return AP_OK;
}

ap_status ap_instance_init_metadata(ap_instance *instance, const ap_batch *batch, void *stream) {
    if (instance == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_instance_init_metadata: instance is NULL");
    instance->batch_planned = 0;
    ap_msgbuf msg = ap_instance_msg(instance);
    ap_batch_facts facts;
    ap_status status = ap_check_batch(instance, batch, &facts, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, "init_metadata", status);
    msg = ap_instance_msg(instance);
    status = instance->plugin->desc->vtable->init_metadata(instance->backend, batch, stream, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, "init_metadata", status);
    instance->batch_planned = 1;
    instance->batch_mode = batch->mode;
    instance->batch_num_tokens = batch->num_tokens;
    instance->batch_max_page = facts.max_page;
    instance->batch_pages = facts.pages;
    instance->batch_num_kv_tokens = facts.num_kv_tokens;
    return AP_OK;
}

static ap_status ap_instance_forward(ap_instance *instance, ap_forward_mode mode,
                                     const ap_layer *layer, const ap_forward_args *args,
                                     void *stream) {
    const char *entry = mode == AP_MODE_DECODE ? "forward_decode" : "forward_extend";
    if (instance == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_instance_%s: instance is NULL", entry);
    ap_msgbuf msg = ap_instance_msg(instance);
    ap_status status = ap_check_forward(instance, mode, layer, args, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, entry, status);
    msg = ap_instance_msg(instance);
    const ap_vtable *vt = instance->plugin->desc->vtable;
    status = mode == AP_MODE_DECODE
                 ? vt->forward_decode(instance->backend, layer, args, stream, &msg)
                 : vt->forward_extend(instance->backend, layer, args, stream, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, entry, status);
    return AP_OK;
}

ap_status ap_instance_forward_extend(ap_instance *instance, const ap_layer *layer,
                                     const ap_forward_args *args, void *stream) {
    return ap_instance_forward(instance, AP_MODE_EXTEND, layer, args, stream);
}

ap_status ap_instance_forward_decode(ap_instance *instance, const ap_layer *layer,
                                     const ap_forward_args *args, void *stream) {
    return ap_instance_forward(instance, AP_MODE_DECODE, layer, args, stream);
}

/* ---- hooks ----------------------------------------------------------------------------------- */

int ap_instance_has_hook(const ap_instance *instance, const char *name) {
    if (instance == NULL || name == NULL) return 0;
    if (strcmp(name, AP_HOOK_APPEND_KV_V1) == 0) return instance->append_kv != NULL;
    if (strcmp(name, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1) == 0)
        return instance->pack_prefix_chunk_kv != NULL;
    if (strcmp(name, AP_HOOK_CUDA_GRAPH_V1) == 0) return instance->cuda_graph != NULL;
    if (strcmp(name, AP_HOOK_MERGE_STATE_V1) == 0) return instance->merge_state != NULL;
    /* Names the core does not know are asked afresh; get_hook must answer the same each time. */
    return instance->plugin->desc->vtable->get_hook(instance->backend, name) != NULL;
}

void *ap_instance_hook(ap_instance *instance, const char *name) {
    if (instance == NULL || name == NULL) {
        ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_instance_hook: NULL %s",
                     instance == NULL ? "instance" : "name");
        return NULL;
    }
    void *hook = instance->plugin->desc->vtable->get_hook(instance->backend, name);
    if (hook == NULL)
        ap_error_set(AP_ERR_NOT_FOUND, "backend '%s' has no hook '%s'",
                     instance->plugin->desc->name, name);
    return hook;
}

static ap_status ap_hook_absent(const ap_instance *instance, const char *name) {
    return ap_error_set(AP_ERR_UNSUPPORTED, "backend '%s' has no hook '%s'",
                        instance->plugin->desc->name, name);
}

ap_status ap_instance_append_kv(ap_instance *instance, const ap_layer *layer,
                                const ap_append_kv_args *args, void *stream) {
    if (instance == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_instance_append_kv: instance is NULL");
    if (instance->append_kv == NULL) return ap_hook_absent(instance, AP_HOOK_APPEND_KV_V1);
    ap_msgbuf msg = ap_instance_msg(instance);
    ap_status status = ap_check_append_kv(instance, layer, args, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, AP_HOOK_APPEND_KV_V1, status);
    msg = ap_instance_msg(instance);
    status = instance->append_kv(instance->backend, layer, args, stream, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, AP_HOOK_APPEND_KV_V1, status);
    return AP_OK;
}

ap_status ap_instance_pack_prefix_chunk_kv(ap_instance *instance, const ap_pack_kv_args *args,
                                           void *stream) {
    if (instance == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "ap_instance_pack_prefix_chunk_kv: instance is NULL");
    if (instance->pack_prefix_chunk_kv == NULL)
        return ap_hook_absent(instance, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1);
    ap_msgbuf msg = ap_instance_msg(instance);
    ap_status status = ap_check_pack_kv(instance, args, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1, status);
    msg = ap_instance_msg(instance);
    status = instance->pack_prefix_chunk_kv(instance->backend, args, stream, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1, status);
    return AP_OK;
}

ap_status ap_instance_cuda_graph_prepare(ap_instance *instance, int32_t max_batch, void *stream) {
    if (instance == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "ap_instance_cuda_graph_prepare: instance is NULL");
    if (instance->cuda_graph == NULL) return ap_hook_absent(instance, AP_HOOK_CUDA_GRAPH_V1);
    int32_t limit = instance->model.max_batch;
    if (max_batch < 1 || (limit > 0 && max_batch > limit))
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "backend '%s': %s: max_batch %d is outside 1..%d (model.max_batch)",
                            instance->plugin->desc->name, AP_HOOK_CUDA_GRAPH_V1, (int)max_batch,
                            (int)(limit > 0 ? limit : INT32_MAX));
    ap_msgbuf msg = ap_instance_msg(instance);
    ap_status status = instance->cuda_graph(instance->backend, max_batch, stream, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, AP_HOOK_CUDA_GRAPH_V1, status);
    return AP_OK;
}

ap_status ap_instance_merge_state(ap_instance *instance, const ap_merge_state_args *args,
                                  void *stream) {
    if (instance == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_instance_merge_state: instance is NULL");
    if (instance->merge_state == NULL) return ap_hook_absent(instance, AP_HOOK_MERGE_STATE_V1);
    ap_msgbuf msg = ap_instance_msg(instance);
    ap_status status = ap_check_merge_state(instance, args, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, AP_HOOK_MERGE_STATE_V1, status);
    msg = ap_instance_msg(instance);
    status = instance->merge_state(instance->backend, args, stream, &msg);
    if (status != AP_OK) return ap_instance_fail(instance, AP_HOOK_MERGE_STATE_V1, status);
    return AP_OK;
}
