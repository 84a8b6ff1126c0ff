/* gpu_mha.c: gpu-mha, trtllm_mha checked on the GPU against cpu_ref on the same cache bytes:
 * decode over bf16 / f16 / fp8 / nvfp4 caches for pages 16/32/64, groups 1..32 and head dims
 * 64/128/256, multi-token decode (1..8 new tokens per sequence) with mixed lengths, split-KV, a
 * second identical call (bit for bit), and CUDA-graph capture + replay with new lengths and page
 * tables, equal to the eager calls bit for bit. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"
#include "backends/numeric/host_numeric.h"
#include "gpu_mem.h"
#include "gpu_rand.h"
#include "gpu_registry.h"
#include "paged_layout.h"

#define MH_BACKEND "trtllm_mha"

/* --option KEY=VALUE: trtllm_mha's own options for every case (e.g. nvfp4_keys_m=v1), after the
 * case's own split_kv=off. */
#define MH_OPTIONS_MAX 4

typedef struct mh_ctx {
    ap_registry *registry;
    ap_device device, cpu;
    cudaStream_t stream;
    int quick;
    const char *filter;
    ap_option_kv options[MH_OPTIONS_MAX];
    size_t num_options;
    size_t passed, failed;
} mh_ctx;

/* One check: the model's shape, the batch ("prefix:q_len,...") and, for graph cases, the second
 * batch the captured graph is replayed on (same number of sequences, other lengths). */
typedef struct mh_case {
    char name[64];
    ap_dtype q_dtype, kv_dtype;
    int32_t page_size, head_dim, num_qo_heads, num_kv_heads;
    const char *seqs;
    const char *seqs_replay; /* NULL: no graph */
    int split_off;
    int quick;
    const char *keys_m;       /* NULL, or the case's nvfp4_keys_m (MH_CASE_KM) */
    const char *schedule;     /* NULL, or the case's decode_schedule (MH_CASE_FLAT) */
    const char *short_extend; /* NULL, or the case's short_extend (MH_CASE_SE) */
} mh_case;

/* The inputs of one batch on both sides: host (cpu_ref) and device (trtllm_mha). The cache and
 * the device index arrays are sized for the largest batch of the case, so a replay batch reuses
 * the same device addresses. */
typedef struct mh_data {
    const mh_case *c;
    gpu_layout layout;
    ap_model model;
    size_t row_bytes, scale_row_bytes; /* per (slot, head) */
    int32_t pool_pages;
    void *k_host, *v_host, *ks_host, *vs_host, *q_host;
    void *k_dev, *v_dev, *ks_dev, *vs_dev, *q_dev, *out_dev, *lse_dev;
    int32_t *ints_dev; /* the batch arrays at fixed offsets (mh_regions), whatever the batch */
    int32_t cap_seqs, cap_pages, cap_tokens;
    float k_scale, v_scale;
    size_t out_bytes, lse_bytes;
} mh_data;

static int mh_cuda(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return 1;
    printf("      CUDA error in %s: %s\n", what, cudaGetErrorString(err));
    return 0;
}

static size_t mh_q_elems(const mh_data *d) {
    return (size_t)d->layout.num_tokens * d->c->num_qo_heads * d->c->head_dim;
}

/* Random cache contents of every pool slot, stored the way the cache holds them: 16-bit values
 * in [-1, 1); fp8 codes of x / k_scale; nvfp4 random value bytes under scales in [1/4, 1]. */
static void mh_fill_cache(mh_data *d, uint64_t *rng) {
    const mh_case *c = d->c;
    const size_t rows = (size_t)d->pool_pages * c->page_size * c->num_kv_heads;
    uint8_t *kv[2] = {d->k_host, d->v_host}, *sc[2] = {d->ks_host, d->vs_host};
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < rows * (size_t)c->head_dim; i++) {
            float x = gpu_rand_uniform(rng, -1.f, 1.f);
            if (c->kv_dtype == AP_DTYPE_BF16)
                ((uint16_t *)kv[s])[i] = ap_float_to_bf16(x);
            else if (c->kv_dtype == AP_DTYPE_F16)
                ((uint16_t *)kv[s])[i] = ap_float_to_f16(x);
            else if (c->kv_dtype == AP_DTYPE_FP8_E4M3)
                kv[s][i] = ap_float_to_fp8_e4m3(x / d->k_scale);
            else if (i % 2 == 0)
                kv[s][i / 2] = (uint8_t)gpu_rand_below(rng, 256);
        }
        if (c->kv_dtype == AP_DTYPE_NVFP4)
            for (size_t i = 0; i < rows * (size_t)c->head_dim / 16; i++)
                sc[s][i] = ap_float_to_fp8_e4m3(gpu_rand_uniform(rng, 0.25f, 1.f));
    }
}

static void mh_fill_q(mh_data *d, uint64_t *rng) {
    for (size_t i = 0; i < mh_q_elems(d); i++) {
        float x = gpu_rand_uniform(rng, -1.f, 1.f);
        ((uint16_t *)d->q_host)[i] =
            d->c->q_dtype == AP_DTYPE_BF16 ? ap_float_to_bf16(x) : ap_float_to_f16(x);
    }
}

static int mh_layout(const char *spec, int32_t page_size, uint64_t *rng, gpu_layout *out) {
    gpu_seq *seqs = NULL;
    int32_t n = 0;
    if (gpu_seqs_parse(spec, &seqs, &n) != AP_OK) return 0;
    ap_status st = gpu_layout_build(seqs, n, page_size, 5, rng, out);
    free(seqs);
    return st == AP_OK;
}

static void *mh_dev(size_t bytes) {
    void *p = NULL;
    return mh_cuda(cudaMalloc(&p, bytes > 0 ? bytes : 16), "cudaMalloc") ? p : NULL;
}

/* Buffers for the case's largest batch (`pool_pages` pages, `max_tokens` tokens). */
static int mh_data_alloc(mh_data *d, int32_t pool_pages, int32_t max_tokens, int32_t max_pages) {
    const mh_case *c = d->c;
    const size_t rows = (size_t)pool_pages * c->page_size * c->num_kv_heads;
    const int nvfp4 = c->kv_dtype == AP_DTYPE_NVFP4;
    d->pool_pages = pool_pages;
    d->row_bytes =
        nvfp4 ? (size_t)c->head_dim / 2 : (size_t)c->head_dim * gpu_dtype_bytes(c->kv_dtype);
    d->scale_row_bytes = nvfp4 ? (size_t)c->head_dim / 16 : 0;
    const size_t cache = rows * d->row_bytes, scales = rows * d->scale_row_bytes;
    const size_t q = (size_t)max_tokens * c->num_qo_heads * c->head_dim * 2;
    d->out_bytes = q;
    d->lse_bytes = (size_t)max_tokens * c->num_qo_heads * sizeof(float);
    d->cap_seqs = d->layout.num_seqs;
    d->cap_pages = max_pages;
    d->cap_tokens = max_tokens;
    const size_t ints_cap = 4 * ((size_t)d->cap_seqs + 1) + (size_t)max_pages + (size_t)max_tokens;
    d->k_host = malloc(cache);
    d->v_host = malloc(cache);
    d->ks_host = nvfp4 ? malloc(scales) : NULL;
    d->vs_host = nvfp4 ? malloc(scales) : NULL;
    d->q_host = malloc(q);
    d->k_dev = mh_dev(cache);
    d->v_dev = mh_dev(cache);
    d->ks_dev = nvfp4 ? mh_dev(scales) : NULL;
    d->vs_dev = nvfp4 ? mh_dev(scales) : NULL;
    d->q_dev = mh_dev(q);
    d->out_dev = mh_dev(q);
    d->lse_dev = mh_dev(d->lse_bytes);
    d->ints_dev = mh_dev(ints_cap * sizeof(int32_t));
    return d->k_host && d->v_host && d->q_host && d->k_dev && d->v_dev && d->q_dev && d->out_dev &&
           d->lse_dev && d->ints_dev &&
           (!nvfp4 || (d->ks_host && d->vs_host && d->ks_dev && d->vs_dev));
}

static void mh_data_free(mh_data *d) {
    void *host[] = {d->k_host, d->v_host, d->ks_host, d->vs_host, d->q_host};
    void *dev[] = {d->k_dev, d->v_dev,   d->ks_dev,  d->vs_dev,
                   d->q_dev, d->out_dev, d->lse_dev, d->ints_dev};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    gpu_layout_free(&d->layout);
}

static int mh_upload_all(mh_data *d) {
    const size_t rows = (size_t)d->pool_pages * d->c->page_size * d->c->num_kv_heads;
    const size_t cache = rows * d->row_bytes, scales = rows * d->scale_row_bytes;
    int ok = mh_cuda(cudaMemcpy(d->k_dev, d->k_host, cache, cudaMemcpyHostToDevice), "k") &&
             mh_cuda(cudaMemcpy(d->v_dev, d->v_host, cache, cudaMemcpyHostToDevice), "v");
    if (ok && scales > 0)
        ok = mh_cuda(cudaMemcpy(d->ks_dev, d->ks_host, scales, cudaMemcpyHostToDevice), "ks") &&
             mh_cuda(cudaMemcpy(d->vs_dev, d->vs_host, scales, cudaMemcpyHostToDevice), "vs");
    return ok;
}

/* The six batch arrays' places in ints_dev: qo_indptr, kv_page_indptr, kv_page_indices,
 * kv_last_page_len, seq_lens, positions, at offsets fixed by the capacities, so a replay batch
 * of other lengths lands at the addresses a captured graph holds. */
static void mh_regions(const mh_data *d, size_t off[6], size_t count[6]) {
    const gpu_layout *l = &d->layout;
    const size_t cap[6] = {(size_t)d->cap_seqs + 1, (size_t)d->cap_seqs + 1, (size_t)d->cap_pages,
                           (size_t)d->cap_seqs,     (size_t)d->cap_seqs,     (size_t)d->cap_tokens};
    const size_t n[6] = {(size_t)l->num_seqs + 1,   (size_t)l->num_seqs + 1,
                         (size_t)l->num_pages_used, (size_t)l->num_seqs,
                         (size_t)l->num_seqs,       (size_t)l->num_tokens};
    size_t at = 0;
    for (int i = 0; i < 6; i++) {
        off[i] = at;
        count[i] = n[i];
        at += cap[i];
    }
}

/* The batch: host mirrors in the layout, device arrays in ints_dev (or the host ones). */
static void mh_batch(const mh_data *d, int on_device, ap_forward_mode mode, ap_batch *batch) {
    gpu_layout_batch(&d->layout, mode, NULL, batch);
    if (!on_device) return;
    size_t off[6], count[6];
    mh_regions(d, off, count);
    batch->qo_indptr = d->ints_dev + off[0];
    batch->kv_page_indptr = d->ints_dev + off[1];
    batch->kv_page_indices = d->ints_dev + off[2];
    batch->kv_last_page_len = d->ints_dev + off[3];
    batch->seq_lens = d->ints_dev + off[4];
    batch->positions = d->ints_dev + off[5];
}

/* The current layout's q and batch arrays to the device (same addresses for every batch). */
static int mh_upload_batch(mh_data *d) {
    const gpu_layout *l = &d->layout;
    const size_t host[6] = {l->off_qo_indptr,        l->off_kv_page_indptr, l->off_kv_page_indices,
                            l->off_kv_last_page_len, l->off_seq_lens,       l->off_positions};
    size_t off[6], count[6];
    mh_regions(d, off, count);
    if (l->num_seqs > d->cap_seqs || l->num_pages_used > d->cap_pages ||
        l->num_tokens > d->cap_tokens)
        return 0;
    int ok =
        mh_cuda(cudaMemcpy(d->q_dev, d->q_host, mh_q_elems(d) * 2, cudaMemcpyHostToDevice), "q");
    for (int i = 0; i < 6 && ok; i++)
        ok = mh_cuda(cudaMemcpy(d->ints_dev + off[i], l->ints + host[i], count[i] * sizeof(int32_t),
                                cudaMemcpyHostToDevice),
                     "batch arrays");
    return ok;
}

/* One forward on either side: host pointers for cpu_ref, device ones for trtllm_mha. `plan` 0
 * reuses the last plan (a later layer). */
static ap_status mh_forward(const mh_data *d, ap_instance *inst, int on_device, void *out,
                            float *lse, int plan, cudaStream_t stream) {
    const mh_case *c = d->c;
    const int64_t t = d->layout.num_tokens;
    ap_kv_cache kv;
    gpu_layout_kv_cache(&d->layout, c->kv_dtype, c->num_kv_heads, c->head_dim,
                        on_device ? d->k_dev : d->k_host, on_device ? d->v_dev : d->v_host, &kv);
    kv.num_pages = d->pool_pages;
    kv.k_block_scales = on_device ? d->ks_dev : d->ks_host;
    kv.v_block_scales = on_device ? d->vs_dev : d->vs_host;
    ap_layer layer = {.struct_size = sizeof layer,
                      .sm_scale = 1.0f / sqrtf((float)c->head_dim),
                      .k_scale = d->k_scale,
                      .v_scale = d->v_scale,
                      .window_left = -1,
                      .kv = &kv};
    gpu_tensor q, o, l;
    gpu_tensor_make(&q, on_device ? d->q_dev : d->q_host, c->q_dtype, on_device, 3, t,
                    c->num_qo_heads, c->head_dim);
    gpu_tensor_make(&o, out, c->q_dtype, on_device, 3, t, c->num_qo_heads, c->head_dim);
    gpu_tensor_make(&l, lse, AP_DTYPE_F32, on_device, 2, t, c->num_qo_heads, 0);
    ap_forward_args args = {.struct_size = sizeof args, .q = &q.dl, .out = &o.dl, .lse = &l.dl};
    const ap_forward_mode mode = d->layout.max_q_len > 1 ? AP_MODE_EXTEND : AP_MODE_DECODE;
    ap_batch batch;
    mh_batch(d, on_device, mode, &batch);
    ap_status st =
        plan ? ap_instance_init_metadata(inst, &batch, on_device ? stream : NULL) : AP_OK;
    if (st != AP_OK) return st;
    if (mode == AP_MODE_DECODE)
        return ap_instance_forward_decode(inst, &layer, &args, on_device ? stream : NULL);
    return ap_instance_forward_extend(inst, &layer, &args, on_device ? stream : NULL);
}

/* rel L2 of out (16-bit) and the largest |lse - lse_ref|; NaN (unwritten) makes them infinite. */
static void mh_errors(const mh_data *d, const uint16_t *out, const float *lse,
                      const uint16_t *ref_out, const float *ref_lse, double *err_out,
                      double *err_lse) {
    const size_t n = mh_q_elems(d), rows = n / d->c->head_dim;
    double num = 0, den = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double a =
            d->c->q_dtype == AP_DTYPE_BF16 ? ap_bf16_to_float(out[i]) : ap_f16_to_float(out[i]);
        double b = d->c->q_dtype == AP_DTYPE_BF16 ? ap_bf16_to_float(ref_out[i])
                                                  : ap_f16_to_float(ref_out[i]);
        num += isfinite(a) ? (a - b) * (a - b) : INFINITY;
        den += b * b;
    }
    for (size_t i = 0; i < rows; i++) {
        double e = isfinite(lse[i]) ? fabs((double)lse[i] - ref_lse[i]) : INFINITY;
        worst = e > worst ? e : worst;
    }
    *err_out = den > 0 ? sqrt(num / den) : sqrt(num);
    *err_lse = worst;
}

static int mh_download(const mh_data *d, uint16_t *out, float *lse) {
    return mh_cuda(cudaMemcpy(out, d->out_dev, mh_q_elems(d) * 2, cudaMemcpyDeviceToHost), "out") &&
           mh_cuda(cudaMemcpy(lse, d->lse_dev, mh_q_elems(d) / d->c->head_dim * 4,
                              cudaMemcpyDeviceToHost),
                   "lse");
}

/* trtllm_mha on the current batch (poisoned outputs first), then cpu_ref on the same bytes. */
static int mh_check_batch(mh_ctx *ctx, mh_data *d, ap_instance *inst, ap_instance *ref,
                          uint16_t *out, float *lse, char *detail, size_t size) {
    const size_t n = mh_q_elems(d), rows = n / d->c->head_dim;
    uint16_t *ref_out = malloc(n * 2), *again = malloc(n * 2);
    float *ref_lse = malloc(rows * 4), *again_lse = malloc(rows * 4);
    int ok = ref_out && again && ref_lse && again_lse && mh_upload_batch(d) &&
             mh_cuda(cudaMemset(d->out_dev, 0xff, d->out_bytes), "poison") &&
             mh_cuda(cudaMemset(d->lse_dev, 0xff, d->lse_bytes), "poison");
    ap_status st = ok ? mh_forward(d, inst, 1, d->out_dev, d->lse_dev, 1, ctx->stream) : AP_OK;
    if (st != AP_OK) snprintf(detail, size, "forward: %s", ap_last_error());
    ok = ok && st == AP_OK && mh_cuda(cudaStreamSynchronize(ctx->stream), "sync") &&
         mh_download(d, out, lse) && mh_cuda(cudaMemset(d->out_dev, 0xff, d->out_bytes), "poison");
    st = ok ? mh_forward(d, inst, 1, d->out_dev, d->lse_dev, 0, ctx->stream) : AP_OK;
    ok = ok && st == AP_OK && mh_cuda(cudaStreamSynchronize(ctx->stream), "sync") &&
         mh_download(d, again, again_lse);
    const int same = ok && memcmp(out, again, n * 2) == 0 && memcmp(lse, again_lse, rows * 4) == 0;
    if (ok && mh_forward(d, ref, 0, ref_out, ref_lse, 1, NULL) != AP_OK) {
        snprintf(detail, size, "cpu_ref: %s", ap_last_error());
        ok = 0;
    }
    if (ok) {
        double eo, el;
        mh_errors(d, out, lse, ref_out, ref_lse, &eo, &el);
        const double tol =
            d->c->kv_dtype == AP_DTYPE_BF16 || d->c->kv_dtype == AP_DTYPE_F16 ? 1e-2 : 2e-2;
        snprintf(detail, size, "out %.2e lse |d|<=%.1e tol %.0e%s", eo, el, tol,
                 same ? "" : " [second call differs]");
        ok = same && eo < tol && el < 2e-3;
    }
    free(ref_out);
    free(again);
    free(ref_lse);
    free(again_lse);
    return ok;
}

/* Capture two layers' forward_decode once; replay on the first batch and, after a new
 * init_metadata, on the replay batch (new lengths and page tables at the same addresses): each
 * replay equals the eager call bit for bit, and the replay batch's eager call passes cpu_ref. */
static int mh_graph_check(mh_ctx *ctx, mh_data *d, ap_instance *inst, ap_instance *ref,
                          gpu_layout *replay, char *detail, size_t size) {
    const size_t cap = d->out_bytes;
    uint16_t *eager = malloc(cap), *graph = malloc(cap);
    float *eager_lse = malloc(d->lse_bytes), *graph_lse = malloc(d->lse_bytes);
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    int ok = eager && graph && eager_lse && graph_lse &&
             ap_instance_cuda_graph_prepare(inst, d->layout.num_seqs, ctx->stream) == AP_OK;
    ok = ok && mh_check_batch(ctx, d, inst, ref, eager, eager_lse, detail, size);
    ok = ok &&
         mh_cuda(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal), "capture");
    if (ok) {
        ap_status a = mh_forward(d, inst, 1, d->out_dev, d->lse_dev, 0, ctx->stream);
        ap_status b = mh_forward(d, inst, 1, d->out_dev, d->lse_dev, 0, ctx->stream);
        ok = mh_cuda(cudaStreamEndCapture(ctx->stream, &g), "end capture") && a == AP_OK &&
             b == AP_OK;
        if (!ok) snprintf(detail, size, "forward under capture: %s", ap_last_error());
    }
    ok = ok && mh_cuda(cudaGraphInstantiate(&exec, g, 0), "instantiate");
    for (int round = 0; ok && round < 2; round++) {
        if (round == 1) { /* the replay batch: same sequences count, other lengths and pages */
            gpu_layout_free(&d->layout);
            d->layout = *replay;
            memset(replay, 0, sizeof *replay);
            ok = mh_check_batch(ctx, d, inst, ref, eager, eager_lse, detail, size);
        }
        ok = ok && mh_upload_batch(d) && mh_cuda(cudaMemset(d->out_dev, 0xff, cap), "poison") &&
             mh_cuda(cudaMemset(d->lse_dev, 0xff, d->lse_bytes), "poison");
        ap_batch batch;
        mh_batch(d, 1, AP_MODE_DECODE, &batch);
        ok = ok && ap_instance_init_metadata(inst, &batch, ctx->stream) == AP_OK &&
             mh_cuda(cudaGraphLaunch(exec, ctx->stream), "replay") &&
             mh_cuda(cudaStreamSynchronize(ctx->stream), "sync") &&
             mh_download(d, graph, graph_lse);
        if (ok && (memcmp(graph, eager, mh_q_elems(d) * 2) != 0 ||
                   memcmp(graph_lse, eager_lse, mh_q_elems(d) / d->c->head_dim * 4) != 0)) {
            snprintf(detail, size, "graph replay %d differs from the eager call", round);
            ok = 0;
        }
    }
    if (ok) {
        size_t used = strlen(detail);
        snprintf(detail + used, size - used, "; graph replay == eager on 2 batches");
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (g) cudaGraphDestroy(g);
    free(eager);
    free(graph);
    free(eager_lse);
    free(graph_lse);
    return ok;
}

static void mh_case_run(mh_ctx *ctx, const mh_case *c, uint64_t seed) {
    mh_data d = {.c = c, .k_scale = 1.f, .v_scale = 1.f};
    gpu_layout replay = {0};
    char detail[256] = "";
    uint64_t rng = seed;
    if (c->kv_dtype == AP_DTYPE_FP8_E4M3) d.k_scale = d.v_scale = 1.f / 64;
    if (c->kv_dtype == AP_DTYPE_NVFP4) d.k_scale = d.v_scale = 1.f / 6;
    int ok = mh_layout(c->seqs, c->page_size, &rng, &d.layout);
    if (ok && c->seqs_replay != NULL) ok = mh_layout(c->seqs_replay, c->page_size, &rng, &replay);
    int32_t pool = d.layout.num_pages_pool, tokens = d.layout.num_tokens;
    int32_t pages = d.layout.num_pages_used;
    if (c->seqs_replay != NULL && ok) {
        pool = pool > replay.num_pages_pool ? pool : replay.num_pages_pool;
        tokens = tokens > replay.num_tokens ? tokens : replay.num_tokens;
        pages = pages > replay.num_pages_used ? pages : replay.num_pages_used;
        ok = replay.num_seqs == d.layout.num_seqs;
    }
    ok = ok && mh_data_alloc(&d, pool, tokens, pages);
    if (ok) {
        mh_fill_cache(&d, &rng);
        mh_fill_q(&d, &rng);
        ok = mh_upload_all(&d);
    }
    gpu_layout_model(&d.layout, c->q_dtype, c->kv_dtype, c->num_qo_heads, c->num_kv_heads,
                     c->head_dim, &d.model);
    d.model.max_tokens = tokens;
    d.model.max_kv_len = 65536;
    ap_option_kv extra[4 + MH_OPTIONS_MAX] = {{"split_kv", "off"}};
    size_t num_extra = c->split_off ? 1 : 0;
    if (c->keys_m != NULL) extra[num_extra++] = (ap_option_kv){"nvfp4_keys_m", c->keys_m};
    if (c->schedule != NULL) extra[num_extra++] = (ap_option_kv){"decode_schedule", c->schedule};
    if (c->short_extend != NULL)
        extra[num_extra++] = (ap_option_kv){"short_extend", c->short_extend};
    for (size_t i = 0; i < ctx->num_options; i++) extra[num_extra++] = ctx->options[i];
    ap_options opts = {.struct_size = sizeof opts,
                       .prefix_cache = AP_OPTION_UNSET,
                       .chunked_prefill = AP_OPTION_UNSET,
                       .cuda_graphs = AP_OPTION_UNSET,
                       .extra = extra,
                       .num_extra = num_extra};
    ap_instance *inst = NULL, *ref = NULL;
    if (ok &&
        (ap_instance_open(ctx->registry, MH_BACKEND, &d.model, &opts, &ctx->device, &inst) !=
             AP_OK ||
         ap_instance_open(ctx->registry, "cpu_ref", &d.model, NULL, &ctx->cpu, &ref) != AP_OK)) {
        snprintf(detail, sizeof detail, "open: %s", ap_last_error());
        ok = 0;
    }
    uint16_t *out = ok ? malloc(d.out_bytes) : NULL;
    float *lse = ok ? malloc(d.lse_bytes) : NULL;
    if (ok && c->seqs_replay != NULL)
        ok = mh_graph_check(ctx, &d, inst, ref, &replay, detail, sizeof detail);
    else if (ok)
        ok = out && lse && mh_check_batch(ctx, &d, inst, ref, out, lse, detail, sizeof detail);
    printf("%s  %-44s %s\n", ok ? "PASS" : "FAIL", c->name, detail);
    fflush(stdout);
    ok ? ctx->passed++ : ctx->failed++;
    free(out);
    free(lse);
    ap_instance_close(inst);
    ap_instance_close(ref);
    gpu_layout_free(&replay);
    mh_data_free(&d);
}

static const char *mh_tag(ap_dtype t) {
    switch (t) {
        case AP_DTYPE_BF16: return "bf16";
        case AP_DTYPE_F16: return "f16";
        case AP_DTYPE_FP8_E4M3: return "fp8";
        default: return "nvfp4";
    }
}

/* Lengths 1, 63, 64, 65 and 5000 in one batch (prefix:q_len). */
#define MH_DECODE_SEQS "0:1,62:1,63:1,64:1,4999:1"
/* 1..8 new tokens per sequence over prefixes ending around page edges, one of 5000. */
#define MH_MTP_SEQS "0:1,61:2,61:3,60:4,4995:5,59:6,0:8,57:7"

/* The sweep: every page size meets every group (1, 4, 8, 16, 32) for each cache type, the head
 * dim and the query type rotating, so each (cache type, head dim) pair appears. */
static size_t mh_cases_sweep(mh_case *out, size_t cap) {
    static const int32_t pages[] = {16, 32, 64}, groups[] = {1, 4, 8, 16, 32},
                         dims[] = {64, 128, 256};
    static const ap_dtype kvs[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, AP_DTYPE_NVFP4};
    size_t n = 0;
    for (int k = 0; k < 4; k++)
        for (int p = 0; p < 3; p++)
            for (int g = 0; g < 5 && n < cap; g++) {
                mh_case *c = &out[n++];
                const ap_dtype kv = kvs[k];
                const ap_dtype q = kv == AP_DTYPE_BF16 || kv == AP_DTYPE_F16
                                       ? kv
                                       : ((p + g) % 2 ? AP_DTYPE_F16 : AP_DTYPE_BF16);
                *c = (mh_case){.q_dtype = q,
                               .kv_dtype = kv,
                               .page_size = pages[p],
                               .head_dim = dims[(p + g + k) % 3],
                               .num_kv_heads = 2,
                               .num_qo_heads = 2 * groups[g],
                               .seqs = MH_DECODE_SEQS,
                               .quick = g == 2};
                snprintf(c->name, sizeof c->name, "decode_%s_q%s_p%d_d%d_g%d", mh_tag(kv),
                         mh_tag(q), c->page_size, c->head_dim, groups[g]);
            }
    return n;
}

#define MH_CASE(name_, q_, kv_, page_, dim_, hq_, hk_, seqs_, replay_, split_off_, quick_) \
    { \
        .name = name_, .q_dtype = q_, .kv_dtype = kv_, .page_size = page_, .head_dim = dim_, \
        .num_qo_heads = hq_, .num_kv_heads = hk_, .seqs = seqs_, .seqs_replay = replay_, \
        .split_off = split_off_, .quick = quick_ \
    }

/* the flat decode schedule (option decode_schedule flat) */
#define MH_CASE_FLAT(name_, q_, kv_, page_, dim_, hq_, hk_, seqs_, replay_, quick_) \
    { \
        .name = name_, .q_dtype = q_, .kv_dtype = kv_, .page_size = page_, .head_dim = dim_, \
        .num_qo_heads = hq_, .num_kv_heads = hk_, .seqs = seqs_, .seqs_replay = replay_, \
        .quick = quick_, .schedule = "flat" \
    }

/* an extend of <= 8 new tokens a sequence on the kernel option short_extend names */
#define MH_CASE_SE(name_, q_, kv_, page_, dim_, hq_, hk_, seqs_, short_extend_, quick_) \
    { \
        .name = name_, .q_dtype = q_, .kv_dtype = kv_, .page_size = page_, .head_dim = dim_, \
        .num_qo_heads = hq_, .num_kv_heads = hk_, .seqs = seqs_, .quick = quick_, \
        .short_extend = short_extend_ \
    }

/* nvfp4 D128 with <= 8 rows per KV head: keys_m_ NULL takes auto (the keys-on-M v2), "v1" the
 * first keys-on-M form */
#define MH_CASE_KM(name_, keys_m_, q_, page_, hq_, hk_, seqs_, replay_, quick_) \
    { \
        .name = name_, .q_dtype = q_, .kv_dtype = AP_DTYPE_NVFP4, .page_size = page_, \
        .head_dim = 128, .num_qo_heads = hq_, .num_kv_heads = hk_, .seqs = seqs_, \
        .seqs_replay = replay_, .quick = quick_, .keys_m = keys_m_ \
    }

static const mh_case mh_named[] = {
    /* group 4 x up to 8 tokens is 32 rows per KV head: option short_extend's auto runs this
     * extend on the kit's prefill (forward.c), the _decode twin on the decode kernel; the
     * _prefill case forces the prefill where auto would not take it (group 2, head dim 64) */
    MH_CASE("mtp_bf16_g4_d128_p16", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8, MH_MTP_SEQS, NULL,
            0, 1),
    MH_CASE_SE("mtp_bf16_g4_d128_p16_decode", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8,
               MH_MTP_SEQS, "decode", 1),
    MH_CASE_SE("mtp_f16_g2_d64_p32_prefill", AP_DTYPE_F16, AP_DTYPE_F16, 32, 64, 16, 8, MH_MTP_SEQS,
               "prefill", 0),
    MH_CASE("mtp_fp8_g8_d64_p32", AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, 32, 64, 16, 2, MH_MTP_SEQS, NULL,
            0, 0),
    MH_CASE("mtp_nvfp4_g16_d256_p64", AP_DTYPE_BF16, AP_DTYPE_NVFP4, 64, 256, 32, 2, MH_MTP_SEQS,
            NULL, 0, 1),
    MH_CASE("mtp_f16_g32_d128_p16", AP_DTYPE_F16, AP_DTYPE_F16, 16, 128, 32, 1, MH_MTP_SEQS, NULL,
            0, 0),
    MH_CASE("mtp_nvfp4_g4_d128_p16", AP_DTYPE_BF16, AP_DTYPE_NVFP4, 16, 128, 32, 8, MH_MTP_SEQS,
            NULL, 0, 0),
    /* <= 8 rows per (sequence, KV head): nvfp4's keys-on-M kernel (decode_keys_m.cuh) */
    MH_CASE("mtp_nvfp4_g1_d64_p32", AP_DTYPE_F16, AP_DTYPE_NVFP4, 32, 64, 8, 8, MH_MTP_SEQS, NULL,
            0, 1),
    MH_CASE("mtp_nvfp4_g2_d128_p16", AP_DTYPE_BF16, AP_DTYPE_NVFP4, 16, 128, 16, 8,
            "0:1,61:2,61:3,60:4,4995:4,59:3", NULL, 0, 0),
    MH_CASE("mtp_nosplit_bf16_g4", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8, MH_MTP_SEQS, NULL,
            1, 0),
    MH_CASE("split_b1_l32768_bf16", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8, "32767:1", NULL,
            0, 1),
    MH_CASE("split_b1_l32768_nvfp4", AP_DTYPE_BF16, AP_DTYPE_NVFP4, 64, 128, 32, 8, "32767:1", NULL,
            0, 0),
    MH_CASE("split_b2_l20000_fp8_g32", AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, 32, 128, 32, 1,
            "19999:1,333:1", NULL, 0, 0),
    MH_CASE("nosplit_b2_l20000_bf16", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8, "19999:1,333:1",
            NULL, 1, 0),
    /* one wave of splits (plan.c): 40 CTAs of lengths 1..12345 in 3 (bf16) or 6 (fp8) splits */
    MH_CASE("split_mixed_b5_bf16", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8,
            "0:1,699:1,4096:1,8999:1,12344:1", NULL, 0, 1),
    MH_CASE("split_mixed_b5_fp8", AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, 32, 128, 32, 8,
            "12344:1,0:1,4096:1,699:1,8999:1", NULL, 0, 0),
    MH_CASE("many_b64_l1031_bf16", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8, "1030:1x64", NULL,
            0, 0),
    /* the flat schedule (option decode_schedule flat; decode_flat.cuh): one long sequence among
     * short ones (its units cut over many CTAs), 300 sequences (two passes of the search),
     * lengths 1..9000 with MTP rows in several row blocks (group 32 x 8 tokens), a graph replayed
     * on a skewed batch at D = 256 (no flat kernel there: the option falls back to the split
     * grid); and the first skewed batch on the split grid */
    MH_CASE_FLAT("flat_skew_b64_bf16", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8,
                 "32767:1,1023:1x63", NULL, 1),
    MH_CASE_FLAT("flat_skew_b33_fp8_p64", AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, 64, 128, 32, 8,
                 "17:1x16,20000:1,130:1x16", NULL, 0),
    MH_CASE_FLAT("flat_many_b300_f16_d64", AP_DTYPE_F16, AP_DTYPE_F16, 32, 64, 16, 4,
                 "0:1x40,63:1x60,200:1x100,1500:1x100", NULL, 0),
    MH_CASE_FLAT("flat_mtp_g32_blocks_bf16", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 64, 2,
                 "0:8,9000:8,127:5,64:3,3000:8", NULL, 1),
    MH_CASE_FLAT("flat_fallback_graph_fp8_d256", AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, 16, 256, 16, 4,
                 "100:1,5000:1,7:1,300:1", "9000:1,1:1,2:1,3:1", 0),
    MH_CASE("split_skew_b64_bf16", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8,
            "32767:1,1023:1x63", NULL, 0, 0),
    MH_CASE("graph_bf16_g4_d128_p16", AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 128, 32, 8, MH_DECODE_SEQS,
            "3000:1,10:1,700:1,0:1,127:1", 0, 1),
    MH_CASE("graph_nvfp4_g8_d128_p32", AP_DTYPE_BF16, AP_DTYPE_NVFP4, 32, 128, 64, 8,
            MH_DECODE_SEQS, "1:1,2000:1,31:1,32:1,9000:1", 0, 0),
    MH_CASE("graph_fp8_g32_d64_p64", AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, 64, 64, 32, 1, "100:1,7000:1",
            "6000:1,5:1", 0, 0),
    /* the keys-on-M v2 with one KV head per CTA (option v2; auto's kernel where the heads do not
     * pair up): its copies take 8-row groups of a page per thread, a step's mask only where the
     * step may need it: lengths around 8-row, page and stage edges, causal MTP rows, splits
     * (stages from a multiple of 128), a graph replayed on other lengths; and the first form
     * (option v1) on two of them */
    MH_CASE_KM("v2_decode_nvfp4_g4_p16", "v2", AP_DTYPE_BF16, 16, 32, 8,
               "0:1,6:1,7:1,8:1,126:1,127:1,128:1,4999:1", NULL, 1),
    MH_CASE_KM("v2_mtp_nvfp4_g2_p32", "v2", AP_DTYPE_F16, 32, 16, 8,
               "0:1,61:2,61:3,60:4,4995:4,120:3", NULL, 0),
    MH_CASE_KM("v2_split_b1_l32768_nvfp4_p64", "v2", AP_DTYPE_BF16, 64, 8, 1, "32766:1", NULL, 0),
    MH_CASE_KM("v2_graph_nvfp4_g8_p16", "v2", AP_DTYPE_BF16, 16, 64, 8, MH_DECODE_SEQS,
               "1:1,2000:1,31:1,32:1,9000:1", 0),
    MH_CASE_KM("v1_decode_nvfp4_g4_p16", "v1", AP_DTYPE_BF16, 16, 32, 8,
               "0:1,6:1,7:1,8:1,126:1,127:1,128:1,4999:1", NULL, 1),
    MH_CASE_KM("v1_mtp_nvfp4_g2_p32", "v1", AP_DTYPE_F16, 32, 16, 8,
               "0:1,61:2,61:3,60:4,4995:4,120:3", NULL, 0),
    /* auto at D = 128 (v2h): one CTA over KV heads 2j, 2j + 1 (stages of 64 keys, a thread's copies in one
     * 16-key group of a page): lengths around 8-row, 16-key, page, stage and 128-key edges, MTP
     * at 8 rows, splits (one sequence, and mixed lengths), B64 (2 splits on the H100), a graph
     * replayed on other lengths; odd num_kv_heads and rows > 8 take the other kernels */
    MH_CASE_KM("v2h_decode_nvfp4_g4_p16", NULL, AP_DTYPE_BF16, 16, 32, 8,
               "0:1,6:1,7:1,8:1,14:1,15:1,16:1,62:1,63:1,64:1,126:1,127:1,128:1,4999:1", NULL, 1),
    MH_CASE_KM("v2h_decode_nvfp4_g8_p64", NULL, AP_DTYPE_F16, 64, 16, 2,
               "0:1,7:1,15:1,16:1,63:1,64:1,65:1,127:1,191:1,4999:1", NULL, 0),
    MH_CASE_KM("v2h_mtp_nvfp4_g2_p32", NULL, AP_DTYPE_F16, 32, 16, 8,
               "0:1,61:2,61:3,60:4,4995:4,120:3", NULL, 1),
    MH_CASE_KM("v2h_mtp_nvfp4_g4_p16", NULL, AP_DTYPE_BF16, 16, 32, 8,
               "0:1,61:2,62:2,14:2,4995:2,63:1", NULL, 0),
    MH_CASE_KM("v2h_split_b1_l32768_nvfp4_p64", NULL, AP_DTYPE_BF16, 64, 8, 2, "32766:1", NULL, 1),
    MH_CASE_KM("v2h_split_mixed_b5_nvfp4_p16", NULL, AP_DTYPE_BF16, 16, 32, 8,
               "0:1,699:1,4096:1,8999:1,12344:1", NULL, 0),
    MH_CASE_KM("v2h_many_b64_l1031_nvfp4_p16", NULL, AP_DTYPE_BF16, 16, 32, 8, "1030:1x64", NULL,
               0),
    MH_CASE_KM("v2h_graph_nvfp4_g8_p16", NULL, AP_DTYPE_BF16, 16, 64, 8, MH_DECODE_SEQS,
               "1:1,2000:1,31:1,32:1,9000:1", 0),
    MH_CASE_KM("v2h_odd_heads_nvfp4_g4_p16", NULL, AP_DTYPE_BF16, 16, 12, 3, "0:1,63:1,64:1,4999:1",
               NULL, 1),
    MH_CASE_KM("v2h_rows12_mtp_nvfp4_g4_p32", NULL, AP_DTYPE_F16, 32, 32, 8,
               "0:1,61:2,61:3,60:3,4995:3", NULL, 0),
};

/* The backend, the reference and the device, each said apart when missing (gpu_registry.h),
 * then the stream. Returns an exit code, or -1 to carry on. */
static int mh_open(mh_ctx *ctx) {
    int code = gpu_backend_present(ctx->registry, MH_BACKEND);
    if (code < 0) code = gpu_reference_present(ctx->registry);
    if (code < 0) code = gpu_device_usable(&ctx->device);
    if (code >= 0) return code;
    return mh_cuda(cudaStreamCreate(&ctx->stream), "cudaStreamCreate") ? -1 : 1;
}

int main(int argc, char **argv) {
    mh_ctx ctx = {0};
    const char *dirs[8];
    size_t num_dirs = 0;
    uint64_t seed = 0;
    int have_seed = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plugin-dir") == 0 && i + 1 < argc && num_dirs < 8)
            dirs[num_dirs++] = argv[++i];
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0), have_seed = 1;
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            ctx.filter = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            ctx.quick = 1;
        else if (strcmp(argv[i], "--option") == 0 && i + 1 < argc &&
                 ctx.num_options < MH_OPTIONS_MAX && strchr(argv[i + 1], '=') != NULL) {
            char *kv = argv[++i], *eq = strchr(kv, '=');
            *eq = '\0';
            ctx.options[ctx.num_options++] = (ap_option_kv){kv, eq + 1};
        } else {
            fprintf(stderr, "usage: gpu-mha [--quick] [--seed N] [--filter TEXT] "
                            "[--option KEY=VALUE]... [--plugin-dir DIR]...\n");
            return 2;
        }
    }
    if (!have_seed) seed = gpu_rand_fresh_seed();
    printf("gpu-mha: %s vs cpu_ref, seed %llu", MH_BACKEND, (unsigned long long)seed);
    for (size_t i = 0; i < ctx.num_options; i++)
        printf("%s %s=%s", i == 0 ? ", options" : ",", ctx.options[i].key, ctx.options[i].value);
    printf("\n");
    ap_registry_options ro = {
        .struct_size = sizeof ro, .search_dirs = dirs, .num_search_dirs = num_dirs};
    if (ap_registry_create(&ro, &ctx.registry) != AP_OK) {
        fprintf(stderr, "registry: %s\n", ap_last_error());
        return 1;
    }
    ap_registry_scan(ctx.registry);
    ap_device_cpu(&ctx.cpu, "");
    int code = mh_open(&ctx);
    if (code >= 0) {
        ap_registry_destroy(ctx.registry);
        return code;
    }
    mh_case cases[112];
    size_t n = mh_cases_sweep(cases, 112);
    for (size_t i = 0; i < sizeof mh_named / sizeof mh_named[0] && n < 112; i++)
        cases[n++] = mh_named[i];
    for (size_t i = 0; i < n; i++) {
        if (ctx.filter != NULL && strstr(cases[i].name, ctx.filter) == NULL) continue;
        if (ctx.quick && !cases[i].quick) continue;
        uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
        mh_case_run(&ctx, &cases[i], gpu_rand_next(&s));
    }
    printf("summary: gpu-mha %s: %zu passed, %zu failed (seed %llu)\n", MH_BACKEND, ctx.passed,
           ctx.failed, (unsigned long long)seed);
    cudaStreamDestroy(ctx.stream);
    ap_registry_destroy(ctx.registry);
    return ctx.failed > 0 ? 1 : 0;
}
