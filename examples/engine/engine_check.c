/* engine_check.c: replays a backend's last forward on cpu_ref and measures the relative L2 error. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

double eng_check_tolerance(ap_dtype kv_dtype) {
    /* fp8 caches: both sides read the same quantized cache, but the query-side rounding of the
     * scores differs more; the project's GPU rule is 5e-2 there and 1e-2 for bf16/fp16. */
    return kv_dtype == AP_DTYPE_FP8_E4M3 || kv_dtype == AP_DTYPE_FP8_E5M2 ? 5e-2 : 1e-2;
}

/* ||backend - reference|| / ||reference|| over every element; NaN when either holds a NaN/inf. */
double eng_tensor_rel_l2(const eng_tensor *backend, const eng_tensor *reference) {
    double diff = 0.0, norm = 0.0;
    size_t count = eng_tensor_count(reference);
    for (size_t i = 0; i < count; i++) {
        double a = eng_tensor_get(backend, i), b = eng_tensor_get(reference, i);
        if (!isfinite(a) || !isfinite(b)) return NAN;
        diff += (a - b) * (a - b);
        norm += b * b;
    }
    return norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
}

/* Run the replay on an open cpu_ref instance; the reference output lands in `reference`. */
static ap_status eng_replay_run(ap_instance *ref, const eng_replay *replay, eng_tensor *reference,
                                char *why, size_t why_size) {
    ap_kv_cache kv;
    ap_layer layer = *replay->layer;
    if (replay->cache != NULL) {
        kv = replay->cache->kv;
        kv.k_pages = replay->cache_k_host;
        kv.v_pages = replay->cache_v_host;
        kv.k_block_scales = replay->cache_scales_host[0];
        kv.v_block_scales = replay->cache_scales_host[1];
        layer.kv = &kv;
    }
    /* cpu_ref reads host memory: every device array becomes its host mirror. */
    ap_batch batch = eng_batch_host(replay->batch);
    DLTensor q = eng_tensor_host_view(replay->q), k = eng_tensor_host_view(replay->k);
    DLTensor v = eng_tensor_host_view(replay->v), out = eng_tensor_host_view(reference);
    ap_forward_args args = {sizeof(ap_forward_args), &q, &k, &v, &out, NULL, replay->save_kv, NULL};
    ap_status status = ap_instance_init_metadata(ref, &batch, NULL);
    if (status == AP_OK)
        status = replay->mode == AP_MODE_DECODE
                     ? ap_instance_forward_decode(ref, &layer, &args, NULL)
                     : ap_instance_forward_extend(ref, &layer, &args, NULL);
    if (status != AP_OK)
        snprintf(why, why_size, "cpu_ref failed to replay: %s: %s", ap_status_name(status),
                 ap_last_error());
    return status;
}

ap_status eng_open_cpu_ref(ap_registry *registry, const ap_model *model,
                           const ap_options *rule_options, ap_instance **out, char *why,
                           size_t why_size) {
    ap_device cpu;
    ap_device_cpu(&cpu, "");
    /* Backend-specific keys are the checked backend's business; cpu_ref takes none. */
    ap_options options = *rule_options;
    options.extra = NULL;
    options.num_extra = 0;
    if (ap_instance_open(registry, "cpu_ref", model, &options, &cpu, out) == AP_OK) return AP_OK;
    snprintf(why, why_size, "cpu_ref cannot replay this model: %s", ap_last_error());
    return AP_ERR_UNSUPPORTED;
}

ap_status eng_check_against_cpu_ref(ap_registry *registry, const eng_replay *replay,
                                    double *rel_error, char *why, size_t why_size) {
    ap_instance *ref = NULL;
    ap_status status =
        eng_open_cpu_ref(registry, replay->model, replay->options, &ref, why, why_size);
    if (status != AP_OK) return status;
    eng_memory host = {0, -1};
    eng_tensor reference;
    status = eng_tensor_make(&reference, &host, replay->out->dtype, replay->out->dl.ndim,
                             replay->out->shape);
    if (status == AP_OK) {
        /* Poisoned, so an element cpu_ref did not write shows up as a NaN, not as agreement. */
        memset(reference.host, 0xff, reference.bytes);
        status = eng_replay_run(ref, replay, &reference, why, why_size);
    } else {
        snprintf(why, why_size, "out of host memory for the reference output");
    }
    if (status == AP_OK) *rel_error = eng_tensor_rel_l2(replay->out, &reference);
    eng_tensor_free(&reference, &host);
    ap_instance_close(ref);
    return status;
}
