/* engine_kv_compare.c: --kv-dtype: run a model with another KV cache type, against bf16's output. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

/* The walk over the rule's backends with the rule's options, the KV dtype replaced by
 * --kv-dtype. Without --kv-dtype this is ap_config_open. With it, the first backend that serves
 * the changed options is opened (a failing create is an error, not a step to the next). */
ap_status eng_open_model(const eng_context *context, const ap_model *model, ap_options *options,
                         ap_instance **out, ap_selection **walk) {
    const ap_config_rule *rule = ap_config_match(context->config, model->name);
    *out = NULL;
    *walk = NULL;
    if (rule == NULL) return AP_ERR_NOT_FOUND;
    *options = rule->options;
    if (context->args->kv_dtype == AP_DTYPE_NONE && !context->args->cuda_graphs)
        return ap_config_open(context->config, context->registry, model, &context->device, out,
                              walk);
    if (context->args->kv_dtype != AP_DTYPE_NONE) options->kv_dtype = context->args->kv_dtype;
    if (context->args->cuda_graphs) options->cuda_graphs = 1; /* --cuda-graphs */
    ap_status status = ap_select(context->registry, rule->backends, rule->num_backends,
                                 rule->explicit_single, model, options, &context->device, walk);
    if (status != AP_OK) return status;
    return ap_instance_open(context->registry, ap_selection_chosen(*walk), model, options,
                            &context->device, out);
}

/* The bf16 twin: cpu_ref over a bf16 cache of one layer, fed the same batches and the same
 * q/k/v as the run (every layer of the run gets the same activations, so one layer stands for
 * all). Its output is what the model gives with a bf16 cache. */
ap_status eng_shadow_open(eng_shadow *shadow, ap_registry *registry, const ap_model *served,
                          const ap_options *options, const ap_layer *like, int32_t num_pages) {
    memset(shadow, 0, sizeof(*shadow));
    shadow->kv_dtype = served->kv_dtype;
    ap_model model = *served;
    model.kv_dtype = AP_DTYPE_BF16;
    ap_options bf16 = *options;
    bf16.kv_dtype = AP_DTYPE_BF16;
    bf16.extra = NULL; /* the served backend's keys; cpu_ref takes none */
    bf16.num_extra = 0;
    ap_device cpu;
    ap_device_cpu(&cpu, "");
    ap_status status = ap_instance_open(registry, "cpu_ref", &model, &bf16, &cpu, &shadow->ref);
    ap_kv_spec spec = {sizeof(ap_kv_spec), 0, 0, 0, 0};
    if (status == AP_OK) status = ap_instance_kv_spec(shadow->ref, &spec);
    eng_memory host = {0, -1};
    if (status == AP_OK)
        status =
            eng_cache_make(&shadow->cache, ap_instance_model(shadow->ref), &spec, num_pages, &host);
    shadow->layer = *like; /* softmax scale, softcap, window: the run's */
    shadow->layer.k_scale = shadow->layer.v_scale = 1.0f;
    shadow->layer.kv = &shadow->cache.kv;
    shadow->prefill_error = shadow->last_error = shadow->worst_decode_error = NAN;
    return status;
}

void eng_shadow_close(eng_shadow *shadow) {
    eng_memory host = {0, -1};
    eng_cache_free(&shadow->cache, &host);
    ap_instance_close(shadow->ref);
    memset(shadow, 0, sizeof(*shadow));
}

/* The forward the run just made, on the twin: same host batch and q/k/v, save_kv on. `out` is
 * the run's output, downloaded. Records ||out - twin|| / ||twin||. */
ap_status eng_shadow_step(eng_shadow *shadow, const eng_batch *batch, ap_forward_mode mode,
                          const eng_tensor *q, const eng_tensor *k, const eng_tensor *v,
                          const eng_tensor *out) {
    eng_memory host = {0, -1};
    eng_tensor twin;
    ap_status status = eng_tensor_make(&twin, &host, out->dtype, out->dl.ndim, out->shape);
    if (status != AP_OK) return status;
    ap_batch plan = eng_batch_host(batch);
    DLTensor q_view = eng_tensor_host_view(q), k_view = eng_tensor_host_view(k),
             v_view = eng_tensor_host_view(v);
    ap_forward_args args = {
        sizeof(ap_forward_args), &q_view, &k_view, &v_view, &twin.dl, NULL, 1, NULL};
    status = ap_instance_init_metadata(shadow->ref, &plan, NULL);
    if (status == AP_OK)
        status = mode == AP_MODE_DECODE
                     ? ap_instance_forward_decode(shadow->ref, &shadow->layer, &args, NULL)
                     : ap_instance_forward_extend(shadow->ref, &shadow->layer, &args, NULL);
    if (status == AP_OK) {
        double error = eng_tensor_rel_l2(out, &twin);
        if (mode == AP_MODE_EXTEND) shadow->prefill_error = error;
        if (mode == AP_MODE_DECODE && !(error <= shadow->worst_decode_error))
            shadow->worst_decode_error = error;
        shadow->last_error = error;
    }
    eng_tensor_free(&twin, &host);
    return status;
}

void eng_shadow_report(const eng_shadow *shadow, int32_t layers, int32_t steps) {
    printf("  %s cache vs a bf16 cache, same inputs (cpu_ref over bf16, %d layer%s alike): rel L2 "
           "prefill %.3e",
           ap_dtype_str(shadow->kv_dtype), layers, layers == 1 ? "" : "s", shadow->prefill_error);
    if (steps > 0)
        printf(", last decode step %.3e, worst decode step %.3e", shadow->last_error,
               shadow->worst_decode_error);
    printf("\n");
}
