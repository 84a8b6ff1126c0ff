/* engine_model.c: one model through the engine: select, allocate, prefill, decode, check, time. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

/* Everything one model's run holds; freed by eng_run_free. */
typedef struct eng_run {
    eng_context *context;
    const ap_config_rule *rule;
    ap_options options; /* the rule's, with --kv-dtype applied */
    ap_instance *instance;
    const ap_model *model; /* the instance's model: options applied */
    eng_memory memory;
    int skip_kv; /* embedding model with prefix caching off: no cache written or read */
    eng_sequences seqs;
    eng_cache *caches; /* [num_layers], NULL with skip_kv */
    ap_layer *layers;  /* [num_layers] */
    eng_rng rng;
    eng_tensor q, k, v, out;
    eng_batch batch;
    void *snapshot[4];  /* host copy of the last layer's cache before the checked forward */
    eng_shadow *shadow; /* --kv-dtype: the bf16-cache twin, else NULL */
    eng_graph *graph;   /* --cuda-graphs: the captured decode step, else NULL */
    char error[512];    /* what an allocation of the engine's own failed on */
} eng_run;

static double eng_now_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

/* Print each reason line of `text` with an indent. */
static void eng_print_lines(const char *text, const char *indent) {
    while (text != NULL && *text != '\0') {
        const char *end = strchr(text, '\n');
        int length = end != NULL ? (int)(end - text) : (int)strlen(text);
        if (length > 0) printf("%s%.*s\n", indent, length, text);
        text += length + (end != NULL);
    }
}

/* The walk: every candidate tried, its verdict and every reason. */
static void eng_print_walk(const ap_config_rule *rule, const ap_selection *walk) {
    printf("  rule '%s' (line %d): %s", rule->pattern, rule->line,
           rule->explicit_single ? "backend " : "backends ");
    for (size_t i = 0; i < rule->num_backends; i++)
        printf("%s%s", i ? " > " : "", rule->backends[i]);
    printf("\n");
    const char *chosen = walk != NULL ? ap_selection_chosen(walk) : NULL;
    for (size_t i = 0; walk != NULL && i < ap_selection_count(walk); i++) {
        const ap_verdict *verdict = ap_selection_verdict(walk, i);
        if (verdict->status == AP_OK) {
            printf("  candidate %s: usable%s\n", verdict->backend,
                   chosen && strcmp(chosen, verdict->backend) == 0 ? " <- chosen" : "");
            continue;
        }
        printf("  candidate %s: refused (%s)\n", verdict->backend, ap_status_name(verdict->status));
        eng_print_lines(verdict->reasons, "      - ");
    }
}

/* A failed ap_config_open is "no backend can serve this model here" when the walk tried every
 * backend of the rule, chose none, and each refusal is a capability/device/absence one. A
 * backend that passed the checks and then failed to open is a real error, and so is a config
 * error (a rule none of whose backends any plugin provides). */
static int eng_is_known_refusal(ap_status status, const ap_config_rule *rule,
                                const ap_selection *walk) {
    if (status == AP_ERR_CONFIG) return 0;
    if (walk == NULL || ap_selection_chosen(walk) != NULL) return 0;
    if (ap_selection_count(walk) != rule->num_backends) return 0;
    for (size_t i = 0; i < ap_selection_count(walk); i++) {
        ap_status status = ap_selection_verdict(walk, i)->status;
        if (status != AP_ERR_REFUSED && status != AP_ERR_NOT_FOUND && status != AP_ERR_NO_DEVICE &&
            status != AP_ERR_UNSUPPORTED)
            return 0;
    }
    return 1;
}

/* Select and open the model's backend through the config; prints the walk either way. */
static eng_outcome eng_run_open(eng_run *run, const ap_model *model) {
    eng_context *context = run->context;
    run->rule = ap_config_match(context->config, model->name);
    if (run->rule == NULL) {
        printf("  error: %s\n", ap_last_error());
        return ENG_FAILED;
    }
    ap_selection *walk = NULL;
    ap_status status = eng_open_model(context, model, &run->options, &run->instance, &walk);
    eng_print_walk(run->rule, walk);
    eng_outcome outcome = ENG_RAN;
    if (status != AP_OK) {
        int known = eng_is_known_refusal(status, run->rule, walk);
        printf("  %s: %s\n",
               known                     ? "no backend can serve this model here"
               : status == AP_ERR_CONFIG ? "config error"
                                         : "error",
               ap_status_name(status));
        eng_print_lines(ap_last_error(), "      ");
        outcome = known ? ENG_NO_BACKEND : ENG_FAILED;
    }
    ap_selection_destroy(walk);
    return outcome;
}

/* Host memory for CPU backends, device memory for CUDA ones. */
static eng_outcome eng_run_place(eng_run *run) {
    const ap_caps *caps = ap_instance_caps(run->instance);
    const ap_device *device = &run->context->device;
    int gpu = device->ordinal >= 0 && device->unusable_reason[0] == '\0';
    run->memory.on_device = gpu && (caps->device_kinds & AP_DEVICE_KIND_CUDA) &&
                            !(caps->device_kinds & AP_DEVICE_KIND_CPU);
    run->memory.ordinal = device->ordinal;
    if (run->memory.on_device && !eng_cuda_built()) {
        printf("  error: backend %s needs device memory: %s\n", ap_instance_backend(run->instance),
               eng_mem_error());
        return ENG_FAILED;
    }
    run->skip_kv = run->model->embedding && run->rule->options.prefix_cache == 0;
    if (run->skip_kv && !(caps->features & AP_FEATURE_EMBEDDING_SKIP_KV)) {
        printf("  note: %s has no embedding skip-KV mode; the prefill writes the KV cache\n",
               ap_instance_backend(run->instance));
        run->skip_kv = 0;
    }
    return ENG_RAN;
}

/* Say in run->error what failed to allocate (the engine's own calls leave no core error). */
static ap_status eng_run_fail(eng_run *run, ap_status status, const char *what, double bytes) {
    const char *cause = status == AP_ERR_OUT_OF_MEMORY ? "out of memory"
                        : status == AP_ERR_CUDA        ? eng_mem_error()
                                                       : ap_status_name(status);
    snprintf(run->error, sizeof(run->error), "%s for %s: %.1f MiB", cause, what,
             bytes / (1024.0 * 1024.0));
    return status;
}

/* Sequences, one cache per layer (unless skip_kv) and the layer parameters. */
static ap_status eng_run_allocate(eng_run *run, int32_t steps) {
    const eng_args *args = run->context->args;
    const ap_model *m = run->model;
    ap_status status = eng_sequences_make(&run->seqs, &run->rng, args->batch, args->prompt_len,
                                          steps, m->page_size);
    if (status != AP_OK)
        return eng_run_fail(run, status, "the sequences' page tables",
                            (double)args->batch * (args->prompt_len + steps) * sizeof(int32_t));
    run->layers = calloc((size_t)m->num_layers, sizeof(ap_layer));
    if (run->layers == NULL)
        return eng_run_fail(run, AP_ERR_OUT_OF_MEMORY, "the layers",
                            (double)m->num_layers * sizeof(ap_layer));
    ap_kv_spec spec = {sizeof(ap_kv_spec), 0, 0, 0, 0};
    if (!run->skip_kv) {
        run->caches = calloc((size_t)m->num_layers, sizeof(eng_cache));
        if (run->caches == NULL)
            return eng_run_fail(run, AP_ERR_OUT_OF_MEMORY, "the caches",
                                (double)m->num_layers * sizeof(eng_cache));
        if ((status = ap_instance_kv_spec(run->instance, &spec)) != AP_OK) {
            snprintf(run->error, sizeof(run->error), "%s", ap_last_error());
            return status;
        }
    }
    for (int32_t l = 0; l < m->num_layers; l++) {
        ap_layer *layer = &run->layers[l];
        layer->struct_size = sizeof(ap_layer);
        layer->layer_id = l;
        layer->sm_scale = 1.0f / sqrtf((float)m->head_dim_qk);
        /* nvfp4: the global scale that puts the activations' amax (1) at 6 x 448, the top of
         * E2M1 times E4M3, as a calibrated engine would */
        layer->k_scale = layer->v_scale = m->kv_dtype == AP_DTYPE_NVFP4 ? 1.0f / 2688.0f : 1.0f;
        layer->window_left = -1;
        if (run->skip_kv) continue;
        status = eng_cache_make(&run->caches[l], m, &spec, run->seqs.num_pages, &run->memory);
        if (status != AP_OK) {
            char what[96];
            snprintf(what, sizeof(what), "the KV cache of layer %d (%d pages)", l,
                     run->seqs.num_pages);
            return eng_run_fail(run, status, what,
                                (double)(spec.k_bytes_per_page + spec.v_bytes_per_page +
                                         2 * spec.scale_bytes_per_page) *
                                    run->seqs.num_pages);
        }
        layer->kv = &run->caches[l].kv;
    }
    if (args->kv_dtype != AP_DTYPE_NONE && args->kv_dtype != AP_DTYPE_BF16 && !run->skip_kv) {
        run->shadow = calloc(1, sizeof(*run->shadow));
        if (run->shadow == NULL) return AP_ERR_OUT_OF_MEMORY;
        status = eng_shadow_open(run->shadow, run->context->registry, m, &run->options,
                                 &run->layers[0], run->seqs.num_pages);
        if (status != AP_OK) return status;
    }
    if (!run->skip_kv) {
        const eng_cache *c = &run->caches[0];
        double mib = (double)(c->k_bytes + c->v_bytes + 2 * c->scale_bytes) * m->num_layers /
                     (1024.0 * 1024.0);
        printf("  KV cache: %d layer%s x %d pages of %d tokens, %.2f MiB in %s memory\n",
               m->num_layers, eng_plural(m->num_layers), run->seqs.num_pages, m->page_size, mib,
               run->memory.on_device ? "device" : "host");
    } else {
        printf("  KV cache: none (embedding model, prefix caching off: skip-KV mode)\n");
    }
    return AP_OK;
}

/* Fresh random q/k/v for the next forward of `num_tokens` tokens, and an output buffer. */
static ap_status eng_run_activations(eng_run *run, int64_t num_tokens) {
    const ap_model *m = run->model;
    eng_tensor *all[4] = {&run->q, &run->k, &run->v, &run->out};
    for (int i = 0; i < 4; i++) eng_tensor_free(all[i], &run->memory);
    int64_t q_shape[3] = {num_tokens, m->num_qo_heads, m->head_dim_qk};
    int64_t k_shape[3] = {num_tokens, m->num_kv_heads, m->head_dim_qk};
    int64_t v_shape[3] = {num_tokens, m->num_kv_heads, m->head_dim_v};
    int64_t o_shape[3] = {num_tokens, m->num_qo_heads, m->head_dim_v};
    const int64_t *shapes[4] = {q_shape, k_shape, v_shape, o_shape};
    ap_status status = AP_OK;
    for (int i = 0; i < 4 && status == AP_OK; i++) {
        status = eng_tensor_make(all[i], &run->memory, m->dtype, 3, shapes[i]);
        if (status == AP_OK && i < 3) eng_tensor_fill_random(all[i], &run->rng);
        if (status == AP_OK && i < 3) status = eng_tensor_upload(all[i], &run->memory);
    }
    return status;
}

/* Keep a host copy of the last layer's cache: the state its next forward starts from. Only that
 * layer's forward writes that cache, so copying before the timed step is exact. */
static ap_status eng_run_snapshot(eng_run *run) {
    if (run->skip_kv) return AP_OK;
    const eng_cache *c = &run->caches[run->model->num_layers - 1];
    const void *src[4] = {c->kv.k_pages, c->kv.v_pages, c->kv.k_block_scales, c->kv.v_block_scales};
    size_t bytes[4] = {c->k_bytes, c->v_bytes, c->scale_bytes, c->scale_bytes};
    for (int i = 0; i < 4; i++) {
        free(run->snapshot[i]);
        run->snapshot[i] = NULL;
        if (src[i] == NULL || bytes[i] == 0) continue;
        run->snapshot[i] = malloc(bytes[i]);
        if (run->snapshot[i] == NULL) return AP_ERR_OUT_OF_MEMORY;
        ap_status status = eng_mem_download(&run->memory, run->snapshot[i], src[i], bytes[i]);
        if (status != AP_OK) return status;
    }
    return AP_OK;
}

/* One timed forward over every layer: plan once, then run each layer. */
static ap_status eng_run_forward(eng_run *run, ap_forward_mode mode, double *elapsed_ms) {
    ap_forward_args args = {
        sizeof(ap_forward_args), &run->q.dl, &run->k.dl, &run->v.dl, &run->out.dl, NULL,
        !run->skip_kv,           NULL};
    double start = eng_now_ms();
    ap_status status = ap_instance_init_metadata(run->instance, &run->batch.batch, NULL);
    for (int32_t l = 0; l < run->model->num_layers && status == AP_OK; l++)
        status = mode == AP_MODE_EXTEND
                     ? ap_instance_forward_extend(run->instance, &run->layers[l], &args, NULL)
                     : ap_instance_forward_decode(run->instance, &run->layers[l], &args, NULL);
    if (status == AP_OK) status = eng_mem_sync(&run->memory);
    *elapsed_ms = eng_now_ms() - start;
    if (status != AP_OK)
        printf("  error: %s forward failed: %s: %s\n", mode == AP_MODE_EXTEND ? "extend" : "decode",
               ap_status_name(status), status == AP_ERR_CUDA ? eng_mem_error() : ap_last_error());
    return status;
}

/* Is every element of the last output finite? A NaN here means a broken kernel or cache. */
static int eng_run_output_finite(eng_run *run) {
    if (eng_tensor_download(&run->out, &run->memory) != AP_OK) return 0;
    size_t count = eng_tensor_count(&run->out);
    for (size_t i = 0; i < count; i++)
        if (!isfinite(eng_tensor_get(&run->out, i))) return 0;
    return 1;
}

/* Replay the last layer of the last forward on cpu_ref (unless cpu_ref itself ran it). */
static eng_outcome eng_run_check(eng_run *run, ap_forward_mode mode) {
    const char *backend = ap_instance_backend(run->instance);
    if (strcmp(backend, "cpu_ref") == 0) {
        printf("  check: cpu_ref is the reference itself; outputs all finite\n");
        return ENG_RAN;
    }
    int32_t last = run->model->num_layers - 1;
    eng_replay replay = {run->model,
                         &run->options,
                         &run->layers[last],
                         run->skip_kv ? NULL : &run->caches[last],
                         run->snapshot[0],
                         run->snapshot[1],
                         {run->snapshot[2], run->snapshot[3]},
                         &run->batch,
                         mode,
                         !run->skip_kv,
                         &run->q,
                         &run->k,
                         &run->v,
                         &run->out};
    double error = NAN;
    char why[1024] = "";
    ap_status status =
        eng_check_against_cpu_ref(run->context->registry, &replay, &error, why, sizeof(why));
    if (status == AP_ERR_UNSUPPORTED) {
        printf("  check: skipped: %s\n", why);
        return ENG_RAN;
    }
    if (status != AP_OK) {
        printf("  check: error: %s\n", why);
        return ENG_FAILED;
    }
    double limit = eng_check_tolerance(run->model->kv_dtype);
    int pass = isfinite(error) && error <= limit;
    printf("  check vs cpu_ref (layer %d, %s, %d sequence%s): rel L2 error %.3e (limit %.0e): "
           "%s\n",
           last, mode == AP_MODE_EXTEND ? "prefill" : "last decode step", run->seqs.num_seqs,
           eng_plural(run->seqs.num_seqs), error, limit, pass ? "ok" : "FAIL");
    return pass ? ENG_RAN : ENG_FAILED;
}

/* One forward (prefill or one decode step): batch, activations, optional snapshot, timing. */
static ap_status eng_run_step(eng_run *run, ap_forward_mode mode, int checked, double *ms) {
    eng_batch_free(&run->batch, &run->memory);
    ap_status status = eng_batch_make(&run->batch, &run->seqs, mode, !run->skip_kv, &run->memory);
    if (status == AP_OK) status = eng_run_activations(run, run->batch.batch.num_tokens);
    if (status == AP_OK && checked) status = eng_run_snapshot(run);
    if (status != AP_OK) {
        printf("  error: preparing the %s batch: %s (%s)\n",
               mode == AP_MODE_EXTEND ? "prefill" : "decode", ap_status_name(status),
               status == AP_ERR_CUDA ? eng_mem_error() : "host");
        return status;
    }
    status = eng_run_forward(run, mode, ms);
    if (status == AP_OK && run->shadow != NULL) {
        status = eng_tensor_download(&run->out, &run->memory);
        if (status == AP_OK)
            status = eng_shadow_step(run->shadow, &run->batch, mode, &run->q, &run->k, &run->v,
                                     &run->out);
        if (status != AP_OK)
            printf("  error: the bf16-cache twin failed: %s: %s\n", ap_status_name(status),
                   ap_last_error());
    }
    return status;
}

static void eng_print_rate(const char *what, int64_t tokens, int32_t layers, double ms) {
    printf("  %s: %lld token%s x %d layer%s in %.3f ms: %.0f tokens/s\n", what, (long long)tokens,
           eng_plural(tokens), layers, eng_plural(layers), ms,
           ms > 0.0 ? (double)tokens / (ms / 1e3) : 0.0);
}

/* Graph mode: the rule's cuda_graphs (or --cuda-graphs) on, a backend whose caps allow decode
 * capture, device memory. */
static int eng_run_graph_mode(const eng_run *run) {
    if (run->options.cuda_graphs != 1) return 0;
    const ap_caps *caps = ap_instance_caps(run->instance);
    if (caps->cuda_graph == AP_GRAPH_NONE || !run->memory.on_device) {
        printf("  cuda graphs: not used (%s)\n", run->memory.on_device ? "the backend allows no "
                                                                         "capture"
                                                                       : "host memory");
        return 0;
    }
    return 1;
}

/* After eager decode step s (eager_ms): the same step replayed from the captured graph. */
static ap_status eng_run_graph_step(eng_run *run, int32_t s, double eager_ms) {
    ap_status status = AP_OK;
    if (run->graph == NULL)
        status = eng_graph_open(&run->graph, &run->batch, &run->q, &run->k, &run->v, &run->out);
    eng_graph_timing t = {0};
    if (status == AP_OK)
        status =
            eng_graph_step(run->graph, run->instance, run->layers, run->model->num_layers,
                           &run->batch, &run->q, &run->k, &run->v, &run->out, !run->skip_kv, &t);
    if (status != AP_OK) {
        printf("  error: cuda graph decode step %d: %s: %s\n", s + 1, ap_status_name(status),
               status == AP_ERR_CUDA ? eng_mem_error() : ap_last_error());
        return status;
    }
    printf("  decode step %d: eager %.3f ms, graph %.3f ms (init_metadata %.1f us, launch %.1f "
           "us%s): %s\n",
           s + 1, eager_ms, t.step_ms, t.plan_us, t.launch_us, t.captured ? ", captured" : "",
           t.equal ? "graph == eager" : "GRAPH DIFFERS FROM EAGER");
    return t.equal ? AP_OK : AP_ERR_INTERNAL;
}

/* The prefill, then the decode steps; the last forward is the one checked. */
static eng_outcome eng_run_steps(eng_run *run, int32_t steps) {
    const ap_model *m = run->model;
    double ms = 0.0;
    printf("  batch: %d sequence%s, prompt length%s", run->seqs.num_seqs,
           eng_plural(run->seqs.num_seqs), eng_plural(run->seqs.num_seqs));
    int64_t prompt_tokens = 0;
    for (int32_t i = 0; i < run->seqs.num_seqs; i++) {
        printf(" %d", run->seqs.prompt_lens[i]);
        prompt_tokens += run->seqs.prompt_lens[i];
    }
    printf(" (%lld token%s)\n", (long long)prompt_tokens, eng_plural(prompt_tokens));
    if (eng_run_step(run, AP_MODE_EXTEND, 1, &ms) != AP_OK) return ENG_FAILED;
    eng_print_rate("prefill", run->batch.batch.num_tokens, m->num_layers, ms);
    /* The prefill is checked too: extend and decode are different kernels. */
    if (!eng_run_output_finite(run)) {
        printf("  error: the prefill output holds NaN or inf\n");
        return ENG_FAILED;
    }
    eng_outcome checked = eng_run_check(run, AP_MODE_EXTEND);
    if (checked == ENG_RAN && run->skip_kv && run->memory.on_device) /* embedding skip-KV */
        checked = eng_embed_compare(&(eng_embed_input){run->context, &run->options, run->instance,
                                                       &run->seqs, run->layers, &run->q, &run->k,
                                                       &run->v, &run->out, &run->memory});
    if (run->shadow != NULL && steps == 0) eng_shadow_report(run->shadow, m->num_layers, 0);
    if (checked != ENG_RAN || steps == 0) return checked;
    double total_ms = 0.0;
    const int graphs = eng_run_graph_mode(run);
    for (int32_t s = 0; s < steps; s++) {
        if (eng_run_step(run, AP_MODE_DECODE, s == steps - 1, &ms) != AP_OK) return ENG_FAILED;
        char label[48];
        snprintf(label, sizeof(label), "decode step %d", s + 1);
        eng_print_rate(label, run->seqs.num_seqs, m->num_layers, ms);
        total_ms += ms;
        if (graphs && eng_run_graph_step(run, s, ms) != AP_OK) return ENG_FAILED;
    }
    printf("  decode: %d step%s, %.3f ms/step mean, %.0f tokens/s\n", steps, eng_plural(steps),
           total_ms / steps,
           total_ms > 0.0 ? (double)steps * run->seqs.num_seqs / (total_ms / 1e3) : 0.0);
    if (!eng_run_output_finite(run)) {
        printf("  error: the last decode output holds NaN or inf\n");
        return ENG_FAILED;
    }
    if (run->shadow != NULL) eng_shadow_report(run->shadow, m->num_layers, steps);
    return eng_run_check(run, AP_MODE_DECODE);
}

static void eng_run_free(eng_run *run) {
    eng_tensor *all[4] = {&run->q, &run->k, &run->v, &run->out};
    for (int i = 0; i < 4; i++) eng_tensor_free(all[i], &run->memory);
    eng_batch_free(&run->batch, &run->memory);
    for (int32_t l = 0; run->caches != NULL && l < run->model->num_layers; l++)
        eng_cache_free(&run->caches[l], &run->memory);
    for (int i = 0; i < 4; i++) free(run->snapshot[i]);
    if (run->shadow != NULL) eng_shadow_close(run->shadow);
    eng_graph_close(run->graph);
    free(run->shadow);
    free(run->caches);
    free(run->layers);
    eng_sequences_free(&run->seqs);
    ap_instance_close(run->instance);
}

/* The preset resized to the engine's run: --model-spec (checked by the argument parser), then
 * layers, batch and lengths from the command line. */
static ap_model eng_model_for_run(const eng_args *args, const ap_model_preset *preset) {
    ap_model model = preset->model;
    char error[256];
    if (args->model_spec != NULL)
        ap_preset_apply_spec(&model, args->model_spec, error, sizeof(error));
    model.num_layers = args->layers;
    model.max_batch = args->batch;
    model.max_tokens = args->batch * args->prompt_len;
    model.max_kv_len = (int64_t)args->prompt_len + args->steps;
    return model;
}

eng_outcome eng_model_run(eng_context *context, const ap_model_preset *preset) {
    eng_run run;
    memset(&run, 0, sizeof(run));
    run.context = context;
    /* Each model its own stream, the same for the same --seed: FNV-1a of the name. */
    uint64_t name_hash = 0xcbf29ce484222325ull;
    for (const char *c = preset->name; *c != '\0'; c++)
        name_hash = (name_hash ^ (unsigned char)*c) * 0x100000001b3ull;
    eng_rng_seed(&run.rng, context->args->seed ^ name_hash);
    ap_model model = eng_model_for_run(context->args, preset);
    /* The shape as the backend will see it: the rule's options (KV dtype, page size) applied,
     * --kv-dtype over them. */
    const ap_config_rule *rule = ap_config_match(context->config, model.name);
    ap_options shown = {.struct_size = sizeof shown}; /* page size 0, no dtype: the model's */
    if (rule != NULL) shown = rule->options;
    if (context->args->kv_dtype != AP_DTYPE_NONE) shown.kv_dtype = context->args->kv_dtype;
    ap_model applied;
    ap_model_apply_options(&model, &shown, &applied);
    char shape[256];
    ap_model_describe(&applied, shape, sizeof(shape));
    printf("\n== %s: %s (of %d)\n", model.name, shape, preset->model.num_layers);
    eng_outcome outcome = eng_run_open(&run, &model);
    if (outcome != ENG_RAN) return outcome;
    run.model = ap_instance_model(run.instance);
    const char *backend = ap_instance_backend(run.instance);
    /* MLA's latent cache and its two forward forms are engine_mla.c's */
    int mla = run.model->kind == AP_ATTN_MLA;
    outcome = eng_run_place(&run);
    if (outcome == ENG_RAN && mla)
        outcome = eng_mla_run(context, &run.options, run.instance, &run.memory, &run.rng);
    if (outcome == ENG_RAN && !mla) {
        printf("  backend: %s on %s\n", backend,
               run.memory.on_device ? context->device.name : "the CPU (host memory)");
        int32_t steps = run.model->embedding ? 0 : context->args->steps;
        if (run.model->embedding) printf("  embedding model: prefill only, no decode\n");
        ap_status status = eng_run_allocate(&run, steps);
        if (status != AP_OK) {
            printf("  error: allocating: %s: %s\n", ap_status_name(status), run.error);
            outcome = ENG_FAILED;
        } else {
            outcome = eng_run_steps(&run, steps);
        }
    }
    if (outcome == ENG_RAN)
        printf("  result: %s served by %s\n", model.name, backend);
    else
        printf("  result: %s FAILED on %s\n", model.name, backend);
    eng_run_free(&run);
    return outcome;
}
