/* engine_embed_compare.c: an embedding model served in skip-KV mode, against the same backend's
 * cached path on the same inputs: per-layer time of each and the cosine of their outputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

#define ENG_EMBED_REPS 10

static double eng_embed_now_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

static int eng_embed_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One path: the plan once, then every layer (the cached one writes k/v first). */
typedef struct eng_embed_path {
    ap_instance *instance;
    eng_batch batch;
    ap_layer *layers; /* [num_layers] */
    ap_forward_args args;
} eng_embed_path;

static ap_status eng_embed_forward(const eng_embed_path *p, int32_t num_layers,
                                   const eng_memory *memory) {
    ap_status status = ap_instance_init_metadata(p->instance, &p->batch.batch, NULL);
    for (int32_t l = 0; l < num_layers && status == AP_OK; l++)
        status = ap_instance_forward_extend(p->instance, &p->layers[l], &p->args, NULL);
    return status == AP_OK ? eng_mem_sync(memory) : status;
}

/* Median wall time per layer (ms) of ENG_EMBED_REPS forwards, after one warm-up. */
static ap_status eng_embed_time(const eng_embed_path *p, int32_t num_layers,
                                const eng_memory *memory, double *per_layer_ms) {
    double ms[ENG_EMBED_REPS];
    ap_status status = eng_embed_forward(p, num_layers, memory);
    for (int r = 0; r < ENG_EMBED_REPS && status == AP_OK; r++) {
        double start = eng_embed_now_ms();
        status = eng_embed_forward(p, num_layers, memory);
        ms[r] = eng_embed_now_ms() - start;
    }
    if (status != AP_OK) return status;
    qsort(ms, ENG_EMBED_REPS, sizeof(double), eng_embed_cmp);
    *per_layer_ms = ms[ENG_EMBED_REPS / 2] / num_layers;
    return AP_OK;
}

static double eng_embed_cosine(const eng_tensor *a, const eng_tensor *b) {
    double dot = 0.0, aa = 0.0, bb = 0.0;
    size_t count = eng_tensor_count(a);
    for (size_t i = 0; i < count; i++) {
        double x = eng_tensor_get(a, i), y = eng_tensor_get(b, i);
        dot += x * y, aa += x * x, bb += y * y;
    }
    return aa > 0.0 && bb > 0.0 ? dot / sqrt(aa * bb) : NAN;
}

/* The cached twin: the same backend with prefix caching on, its caches, a batch with pages. */
static ap_status eng_embed_cached_open(const eng_embed_input *in, eng_embed_path *p,
                                       eng_cache *caches, eng_sequences *seqs) {
    const ap_model *m = ap_instance_model(in->skip_instance);
    ap_options options = *in->options;
    options.prefix_cache = 1;
    ap_status status =
        ap_instance_open(in->context->registry, ap_instance_backend(in->skip_instance), m, &options,
                         &in->context->device, &p->instance);
    ap_kv_spec spec = {sizeof(ap_kv_spec), 0, 0, 0, 0};
    if (status == AP_OK) status = ap_instance_kv_spec(p->instance, &spec);
    for (int32_t l = 0; l < m->num_layers && status == AP_OK; l++) {
        status = eng_cache_make(&caches[l], m, &spec, seqs->num_pages, in->memory);
        p->layers[l] = in->layers[l];
        p->layers[l].kv = &caches[l].kv;
    }
    if (status == AP_OK) status = eng_batch_make(&p->batch, seqs, AP_MODE_EXTEND, 1, in->memory);
    return status;
}

eng_outcome eng_embed_compare(const eng_embed_input *in) {
    const ap_model *m = ap_instance_model(in->skip_instance);
    eng_embed_path skip = {0}, cached = {0};
    eng_sequences seqs = *in->seqs; /* its own lengths: batches advance them */
    eng_cache *caches = calloc((size_t)m->num_layers, sizeof(eng_cache));
    eng_tensor cached_out;
    memset(&cached_out, 0, sizeof cached_out);
    seqs.seq_lens = calloc((size_t)seqs.num_seqs, sizeof(int32_t));
    skip.layers = calloc((size_t)m->num_layers, sizeof(ap_layer));
    cached.layers = calloc((size_t)m->num_layers, sizeof(ap_layer));
    ap_status status =
        caches && seqs.seq_lens && skip.layers && cached.layers ? AP_OK : AP_ERR_OUT_OF_MEMORY;
    skip.instance = in->skip_instance;
    for (int32_t l = 0; l < m->num_layers && status == AP_OK; l++) skip.layers[l] = in->layers[l];
    if (status == AP_OK) status = eng_batch_make(&skip.batch, &seqs, AP_MODE_EXTEND, 0, in->memory);
    if (status == AP_OK) status = eng_embed_cached_open(in, &cached, caches, &seqs);
    if (status == AP_OK)
        status = eng_tensor_make(&cached_out, in->memory, in->out->dtype, 3, in->out->shape);
    skip.args = (ap_forward_args){
        sizeof(ap_forward_args), &in->q->dl, &in->k->dl, &in->v->dl, &in->out->dl, NULL, 0, NULL};
    cached.args = skip.args;
    cached.args.out = &cached_out.dl;
    cached.args.save_kv = 1;
    double skip_ms = NAN, cached_ms = NAN;
    if (status == AP_OK) status = eng_embed_time(&skip, m->num_layers, in->memory, &skip_ms);
    if (status == AP_OK) status = eng_embed_time(&cached, m->num_layers, in->memory, &cached_ms);
    if (status == AP_OK) status = eng_tensor_download(in->out, in->memory);
    if (status == AP_OK) status = eng_tensor_download(&cached_out, in->memory);
    eng_outcome outcome = ENG_RAN;
    if (status != AP_OK) {
        printf("  skip-KV vs cached: error: %s: %s\n", ap_status_name(status),
               status == AP_ERR_CUDA ? eng_mem_error() : ap_last_error());
        outcome = ENG_FAILED;
    } else {
        double cosine = eng_embed_cosine(in->out, &cached_out);
        int pass = isfinite(cosine) && cosine > 0.99;
        printf("  skip-KV vs cached (same inputs, %d layers, plan included): %.1f us vs %.1f us "
               "per layer (%.1f us saved); cosine similarity of outputs %.6f (> 0.99): %s\n",
               m->num_layers, skip_ms * 1e3, cached_ms * 1e3, (cached_ms - skip_ms) * 1e3, cosine,
               pass ? "ok" : "FAIL");
        outcome = pass ? ENG_RAN : ENG_FAILED;
    }
    eng_tensor_free(&cached_out, in->memory);
    for (int32_t l = 0; caches != NULL && l < m->num_layers; l++)
        eng_cache_free(&caches[l], in->memory);
    eng_batch_free(&skip.batch, in->memory);
    eng_batch_free(&cached.batch, in->memory);
    ap_instance_close(cached.instance);
    free(caches), free(seqs.seq_lens), free(skip.layers), free(cached.layers);
    return outcome;
}
