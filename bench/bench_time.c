/* bench_time.c: one case: paged random inputs in rotated sets, warm-up, per-call CUDA events. */
#include "bench_time.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_fill.h"
#include "tests/gpu/gpu_mem.h"
#include "tests/gpu/paged_layout.h"

#define BENCH_MAX_SETS 16
#define BENCH_FP8_SCALE (1.0f / 64.0f)
#define BENCH_NVFP4_SCALE (1.0f / 256.0f) /* the global scale; block scales are random e4m3 */

/* One input set: a whole KV cache (one "layer"), its queries and outputs; nvfp4's block scales. */
typedef struct bench_set {
    void *k_pages, *v_pages, *q, *out, *k_scales, *v_scales;
    void *k, *v; /* the new tokens' k / v (save_kv cases) */
} bench_set;

typedef struct bench_state {
    const bench_case *c;
    gpu_layout layout;
    ap_model model;
    ap_instance *instance;
    size_t page_bytes, scale_bytes, q_bytes, out_bytes, kv_new_bytes;
    int num_sets;
    bench_set sets[BENCH_MAX_SETS];
    int32_t *device_ints;
} bench_state;

void bench_fail(bench_result *out, const char *what, const char *why) {
    out->ok = 0;
    snprintf(out->status, sizeof out->status, "%s: %s", what, why);
    for (char *p = out->status; *p; p++)
        if (*p == '\n' || *p == '"' || *p == '\\') *p = ' '; /* one JSON-safe line */
}

static ap_status bench_open(const bench_ctx *ctx, bench_state *st, bench_result *out) {
    const bench_case *c = st->c;
    const ap_options options = {.struct_size = sizeof(ap_options),
                                .prefix_cache = AP_OPTION_UNSET,
                                .chunked_prefill = AP_OPTION_UNSET,
                                .cuda_graphs = AP_OPTION_UNSET};
    gpu_layout_model(&st->layout, c->q_dtype, c->kv_dtype, c->num_qo_heads, c->num_kv_heads,
                     c->head_dim, &st->model);
    st->model.name = "bench";
    st->model.num_layers = BENCH_MAX_SETS;
    ap_status status = ap_instance_open(ctx->registry, ctx->backend, &st->model, &options,
                                        &ctx->device, &st->instance);
    if (status != AP_OK) {
        bench_fail(out, ap_status_name(status), ap_last_error());
        return status;
    }
    ap_kv_spec spec = {.struct_size = sizeof spec};
    if ((status = ap_instance_kv_spec(st->instance, &spec)) != AP_OK) {
        bench_fail(out, "kv_spec", ap_last_error());
        return status;
    }
    st->page_bytes = spec.k_bytes_per_page > spec.v_bytes_per_page ? spec.k_bytes_per_page
                                                                   : spec.v_bytes_per_page;
    st->scale_bytes = spec.scale_bytes_per_page;
    return AP_OK;
}

/* Enough sets that one pass over them exceeds 4x the L2, so no call finds its KV cached. */
static int bench_num_sets(const bench_ctx *ctx, size_t set_bytes) {
    double l2 = ctx->device.l2_bytes > 0 ? ctx->device.l2_bytes : 50e6;
    int sets = (int)ceil(4.0 * l2 / (double)set_bytes);
    return sets < 1 ? 1 : sets > BENCH_MAX_SETS ? BENCH_MAX_SETS : sets;
}

static ap_status bench_alloc(const bench_ctx *ctx, bench_state *st) {
    const bench_case *c = st->c;
    size_t q_bytes = gpu_dtype_bytes(c->q_dtype);
    size_t cache_bytes = (size_t)st->layout.num_pages_pool * st->page_bytes;
    int fp8 = c->kv_dtype == AP_DTYPE_FP8_E4M3;
    float kv_bound = fp8 ? 2.0f / BENCH_FP8_SCALE : 2.0f;
    st->q_bytes = (size_t)bench_new_tokens(c) * c->num_qo_heads * c->head_dim * q_bytes;
    st->out_bytes = st->q_bytes;
    st->kv_new_bytes =
        c->save_kv ? (size_t)bench_new_tokens(c) * c->num_kv_heads * c->head_dim * q_bytes : 0;
    /* nvfp4: random bytes (every e2m1 code is finite) and e4m3 block scales in +-8 */
    const int nvfp4 = c->kv_dtype == AP_DTYPE_NVFP4;
    const ap_dtype fill_dtype = nvfp4 ? AP_DTYPE_FP8_E4M3 : c->kv_dtype;
    size_t cache_elems = cache_bytes / gpu_dtype_bytes(fill_dtype);
    size_t scale_bytes = nvfp4 ? (size_t)st->layout.num_pages_pool * st->scale_bytes : 0;
    st->num_sets = bench_num_sets(ctx, 2 * (cache_bytes + scale_bytes + st->kv_new_bytes) +
                                           st->q_bytes + st->out_bytes);
    size_t q_elems = st->q_bytes / q_bytes;
    for (int s = 0; s < st->num_sets; s++) {
        bench_set *set = &st->sets[s];
        GPU_CHECK(cudaMalloc(&set->k_pages, cache_bytes));
        GPU_CHECK(cudaMalloc(&set->v_pages, cache_bytes));
        GPU_CHECK(cudaMalloc(&set->q, st->q_bytes));
        GPU_CHECK(cudaMalloc(&set->out, st->out_bytes));
        uint64_t seed = 0x5eed0000ull + 4u * (unsigned)s;
        GPU_CHECK((cudaError_t)bench_fill_random(set->k_pages, cache_elems, fill_dtype, kv_bound,
                                                 seed, ctx->stream));
        GPU_CHECK((cudaError_t)bench_fill_random(set->v_pages, cache_elems, fill_dtype, kv_bound,
                                                 seed + 1, ctx->stream));
        if (nvfp4) {
            GPU_CHECK(cudaMalloc(&set->k_scales, scale_bytes));
            GPU_CHECK(cudaMalloc(&set->v_scales, scale_bytes));
            GPU_CHECK((cudaError_t)bench_fill_random(set->k_scales, scale_bytes, fill_dtype, 8.0f,
                                                     seed + 3, ctx->stream));
            GPU_CHECK((cudaError_t)bench_fill_random(set->v_scales, scale_bytes, fill_dtype, 8.0f,
                                                     seed + 5, ctx->stream));
        }
        GPU_CHECK((cudaError_t)bench_fill_random(set->q, q_elems, c->q_dtype, 2.0f, seed + 2,
                                                 ctx->stream));
        if (c->save_kv) {
            size_t kv_elems = st->kv_new_bytes / q_bytes;
            GPU_CHECK(cudaMalloc(&set->k, st->kv_new_bytes));
            GPU_CHECK(cudaMalloc(&set->v, st->kv_new_bytes));
            GPU_CHECK((cudaError_t)bench_fill_random(set->k, kv_elems, c->q_dtype, 2.0f, seed + 6,
                                                     ctx->stream));
            GPU_CHECK((cudaError_t)bench_fill_random(set->v, kv_elems, c->q_dtype, 2.0f, seed + 7,
                                                     ctx->stream));
        }
    }
    size_t int_bytes = st->layout.num_ints * sizeof(int32_t);
    GPU_CHECK(cudaMalloc((void **)&st->device_ints, int_bytes));
    GPU_CHECK(cudaMemcpy(st->device_ints, st->layout.ints, int_bytes, cudaMemcpyHostToDevice));
    GPU_CHECK(cudaStreamSynchronize((cudaStream_t)ctx->stream));
    return AP_OK;
}

/* One layer's forward on input set `s` (the new tokens' K/V are already in the cache, or, for a
 * save_kv case, passed and saved by the call). */
static ap_status bench_forward(const bench_ctx *ctx, const void *state, int s) {
    const bench_state *st = state;
    const bench_case *c = st->c;
    const bench_set *set = &st->sets[s];
    int fp8 = c->kv_dtype == AP_DTYPE_FP8_E4M3, nvfp4 = c->kv_dtype == AP_DTYPE_NVFP4;
    float scale = fp8 ? BENCH_FP8_SCALE : nvfp4 ? BENCH_NVFP4_SCALE : 1.0f;
    int64_t tokens = bench_new_tokens(c);
    ap_kv_cache kv;
    gpu_layout_kv_cache(&st->layout, c->kv_dtype, c->num_kv_heads, c->head_dim, set->k_pages,
                        set->v_pages, &kv);
    kv.k_block_scales = set->k_scales;
    kv.v_block_scales = set->v_scales;
    ap_layer layer = {
        .struct_size = sizeof layer,
        .layer_id = s,
        .sm_scale = 1.0f / sqrtf((float)c->head_dim),
        .k_scale = scale,
        .v_scale = scale,
        .window_left = -1,
        .kv = &kv,
    };
    gpu_tensor q, out;
    gpu_tensor_make(&q, set->q, c->q_dtype, 1, 3, tokens, c->num_qo_heads, c->head_dim);
    gpu_tensor_make(&out, set->out, c->q_dtype, 1, 3, tokens, c->num_qo_heads, c->head_dim);
    ap_forward_args args = {.struct_size = sizeof args, .q = &q.dl, .out = &out.dl};
    gpu_tensor k, v;
    if (c->save_kv) {
        gpu_tensor_make(&k, set->k, c->q_dtype, 1, 3, tokens, c->num_kv_heads, c->head_dim);
        gpu_tensor_make(&v, set->v, c->q_dtype, 1, 3, tokens, c->num_kv_heads, c->head_dim);
        args.k = &k.dl;
        args.v = &v.dl;
        args.save_kv = 1;
    }
    if (c->mode == AP_MODE_DECODE)
        return ap_instance_forward_decode(st->instance, &layer, &args, ctx->stream);
    return ap_instance_forward_extend(st->instance, &layer, &args, ctx->stream);
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Warm up, then record an event pair around every call (calls queue back to back, so the
 * events time the GPU's work, not the host's). */
ap_status bench_time_calls(const bench_ctx *ctx, bench_call_fn call, const void *state,
                           int num_sets, double *ms) {
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    cudaEvent_t *events = calloc(2 * (size_t)ctx->runs, sizeof *events);
    ap_status status = AP_OK;
    int made = 0;
    if (events == NULL) return AP_ERR_OUT_OF_MEMORY;
    for (; made < 2 * ctx->runs; made++)
        if (cudaEventCreate(&events[made]) != cudaSuccess) break;
    if (made < 2 * ctx->runs) status = AP_ERR_CUDA;
    int warmup = ctx->warmup > num_sets ? ctx->warmup : num_sets;
    for (int i = 0; i < warmup && status == AP_OK; i++) status = call(ctx, state, i % num_sets);
    for (int i = 0; i < ctx->runs && status == AP_OK; i++) {
        if (cudaEventRecord(events[2 * i], stream) != cudaSuccess) status = AP_ERR_CUDA;
        if (status == AP_OK) status = call(ctx, state, i % num_sets);
        if (status == AP_OK && cudaEventRecord(events[2 * i + 1], stream) != cudaSuccess)
            status = AP_ERR_CUDA;
    }
    if (status == AP_OK && cudaStreamSynchronize(stream) != cudaSuccess) status = AP_ERR_CUDA;
    if (status == AP_OK && cudaGetLastError() != cudaSuccess) status = AP_ERR_CUDA;
    for (int i = 0; i < ctx->runs && status == AP_OK; i++) {
        float elapsed = 0.0f;
        if (cudaEventElapsedTime(&elapsed, events[2 * i], events[2 * i + 1]) != cudaSuccess)
            status = AP_ERR_CUDA;
        ms[i] = elapsed;
    }
    for (int i = 0; i < made; i++) cudaEventDestroy(events[i]);
    free(events);
    return status;
}

static void bench_free(bench_state *st) {
    for (int s = 0; s < BENCH_MAX_SETS; s++) {
        cudaFree(st->sets[s].k_pages);
        cudaFree(st->sets[s].v_pages);
        cudaFree(st->sets[s].q);
        cudaFree(st->sets[s].out);
        cudaFree(st->sets[s].k_scales);
        cudaFree(st->sets[s].v_scales);
        cudaFree(st->sets[s].k);
        cudaFree(st->sets[s].v);
    }
    cudaFree(st->device_ints);
    if (st->instance != NULL) ap_instance_close(st->instance);
    gpu_layout_free(&st->layout);
}

void bench_summarize(const bench_case *c, double *ms, int runs, int sets, bench_result *out) {
    qsort(ms, (size_t)runs, sizeof *ms, bench_cmp_double);
    out->ok = 1;
    snprintf(out->status, sizeof out->status, "ok");
    out->runs = runs;
    out->sets = sets;
    out->ms_median = runs % 2 ? ms[runs / 2] : 0.5 * (ms[runs / 2 - 1] + ms[runs / 2]);
    out->ms_min = ms[0];
    out->ms_p90 = ms[(runs * 9) / 10 < runs ? (runs * 9) / 10 : runs - 1];
    double seconds = out->ms_median * 1e-3;
    out->kv_bytes = bench_kv_bytes(c);
    out->gbps = out->kv_bytes / seconds * 1e-9;
    out->tflops = bench_flops(c) / seconds * 1e-12;
    out->tokens_per_s = (double)bench_new_tokens(c) / seconds;
}

ap_status bench_time_case(const bench_ctx *ctx, const bench_case *c, bench_call_fn call,
                          const void *state, int num_sets, const char *what, bench_result *out) {
    double *ms = calloc((size_t)ctx->runs, sizeof *ms);
    if (ms == NULL) return AP_ERR_OUT_OF_MEMORY;
    ap_status status = bench_time_calls(ctx, call, state, num_sets, ms);
    if (status == AP_OK)
        bench_summarize(c, ms, ctx->runs, num_sets, out);
    else
        bench_fail(out, what,
                   status == AP_ERR_CUDA ? cudaGetErrorString(cudaGetLastError())
                                         : ap_last_error());
    free(ms);
    return status;
}

ap_status bench_case_time(const bench_ctx *ctx, const bench_case *c, bench_result *out) {
    if (c->rotary_dim > 0) return bench_append_time(ctx, c, out);
    bench_state st = {.c = c};
    gpu_seq *seqs = calloc((size_t)c->batch, sizeof *seqs);
    uint64_t rng = 0x5eedull; /* page order only: the same shuffle every run */
    ap_status status = AP_ERR_OUT_OF_MEMORY;
    memset(out, 0, sizeof *out);
    bench_fail(out, "error", "out of host memory");
    if (seqs == NULL) goto done;
    for (int32_t i = 0; i < c->batch; i++) seqs[i] = (gpu_seq){c->prefix, c->q_len};
    if ((status = gpu_layout_build(seqs, c->batch, c->page_size, 0, &rng, &st.layout)) != AP_OK)
        goto done;
    if ((status = bench_open(ctx, &st, out)) != AP_OK) goto done;
    if ((status = bench_alloc(ctx, &st)) != AP_OK) {
        bench_fail(out, "error", "device allocation or fill failed (see stderr)");
        goto done;
    }
    ap_batch batch;
    gpu_layout_batch(&st.layout, c->mode, st.device_ints, &batch);
    if ((status = ap_instance_init_metadata(st.instance, &batch, ctx->stream)) != AP_OK) {
        bench_fail(out, "init_metadata", ap_last_error());
        goto done;
    }
    status = bench_time_case(ctx, c, bench_forward, &st, st.num_sets, "forward", out);
done:
    bench_free(&st);
    free(seqs);
    return status;
}
