/* fav_bench.c: fav-bench, fa_varlen timed through the core API the way a host calls it: prefill
 * over ragged k/v (kv_indptr) and over a shuffled paged cache, causal and not, head dims 64 /
 * 128 / 256, fp8 K/V, a varlen batch against the dense one of its token count, and the
 * embedding path with and without skip-KV (per layer, plan included). CUDA events, warm-up,
 * median of --runs; two input sets rotated (each past the L2).
 *   fav-bench [--runs N] [--only TEXT] [--json FILE] [--list FILE] [--option KEY=VALUE]...
 *             [--plugin-dir DIR]...
 * --option passes an fa_varlen option to the timed cases' instances (e.g. schedule=rounds). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"
#include "backends/numeric/host_numeric.h"
#include "bench_fill.h"
#include "tests/gpu/gpu_rand.h"

#define FB_SETS 2
#define FB_EMB_LAYERS 8
#define FB_FP8_SCALE 0.01f

typedef enum fb_source { FB_RAGGED, FB_PAGED, FB_VARLEN } fb_source;

/* One timed shape: B sequences of S new tokens each (FB_VARLEN: 64 of 16..4096). */
typedef struct fb_case {
    const char *name;
    fb_source source;
    int32_t dim, hq, hk, batch, seq, causal, fp8;
} fb_case;

/* Issue 10's targets table, the shapes fa_varlen serves (Llama-3-8B heads, 32 / 8). */
static const fb_case fb_cases[] = {
    {"fav_causal_b4_s4096_d128_ragged", FB_RAGGED, 128, 32, 8, 4, 4096, 1, 0},
    {"fav_causal_b4_s4096_d128_paged", FB_PAGED, 128, 32, 8, 4, 4096, 1, 0},
    {"fav_noncausal_b4_s4096_d128_ragged", FB_RAGGED, 128, 32, 8, 4, 4096, 0, 0},
    {"fav_causal_b1_s16384_d128_ragged", FB_RAGGED, 128, 32, 8, 1, 16384, 1, 0},
    {"fav_causal_b4_s4096_d64_ragged", FB_RAGGED, 64, 32, 8, 4, 4096, 1, 0},
    {"fav_causal_b4_s4096_d256_ragged", FB_RAGGED, 256, 32, 8, 4, 4096, 1, 0},
    {"fav_varlen_64seqs_16_4096_causal", FB_VARLEN, 128, 32, 8, 64, 4096, 1, 0},
    {"fav_causal_b16_s4096_d128_ragged", FB_RAGGED, 128, 32, 8, 16, 4096, 1, 0},
    {"fav_fp8kv_causal_b4_s4096_d128_ragged", FB_RAGGED, 128, 32, 8, 4, 4096, 1, 1},
    {"fav_fp8kv_causal_b4_s4096_d128_paged", FB_PAGED, 128, 32, 8, 4, 4096, 1, 1},
};

static int fb_runs = 100;
static FILE *fb_json;
/* --option KEY=VALUE: fa_varlen's options for the timed instances (e.g. schedule=rounds) */
#define FB_MAX_OPTIONS 4
static ap_option_kv fb_extra[FB_MAX_OPTIONS];
static size_t fb_num_extra;
static int fb_first_row = 1;

static int fb_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    return 0;
}

static const DLDataType fb_bf16 = {kDLBfloat, 16, 1}, fb_fp8 = {AP_DL_FLOAT8_E4M3FN, 8, 1};

static void fb_tensor(DLTensor *t, int64_t *shape, void *data, DLDataType dt) {
    memset(t, 0, sizeof *t);
    t->data = data;
    t->device.device_type = kDLCUDA;
    t->ndim = 3;
    t->dtype = dt;
    t->shape = shape;
}

/* n random bf16 in [-1, 1) or fp8 codes of x / FB_FP8_SCALE, in fresh device memory. */
static void *fb_random(size_t n, int fp8, uint64_t *rng) {
    const size_t bytes = n * (fp8 ? 1 : 2);
    uint8_t *host = malloc(bytes);
    void *dev = NULL;
    if (host == NULL || !fb_ok(cudaMalloc(&dev, bytes), "cudaMalloc")) {
        free(host);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        float x = gpu_rand_uniform(rng, -1.f, 1.f);
        if (fp8)
            host[i] = ap_float_to_fp8_e4m3(x / FB_FP8_SCALE);
        else
            ((uint16_t *)host)[i] = ap_float_to_bf16(x);
    }
    int ok = fb_ok(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "fill");
    free(host);
    if (!ok) cudaFree(dev);
    return ok ? dev : NULL;
}

static int32_t *fb_upload_ints(const int32_t *host, size_t n) {
    int32_t *dev = NULL;
    if (!fb_ok(cudaMalloc((void **)&dev, n * 4), "cudaMalloc")) return NULL;
    if (!fb_ok(cudaMemcpy(dev, host, n * 4, cudaMemcpyHostToDevice), "ints")) return NULL;
    return dev;
}

/* Median ms of fb_runs calls of fn(ctx, set), each between two events, sets rotated
 * (bench_event_median). */
static double fb_time(bench_event_fn fn, void *ctx, double *min_ms) {
    return bench_event_median(fn, ctx, FB_SETS, fb_runs, 5, 0, min_ms);
}

static void fb_row(const char *name, const char *status, double ms, double min_ms, double tflops,
                   const char *extra) {
    if (status == NULL)
        printf("%-44s %9.4f ms (min %.4f)  %7.1f TFLOP/s  %s\n", name, ms, min_ms, tflops, extra);
    else
        printf("%-44s not run: %s\n", name, status);
    if (fb_json == NULL) return;
    fprintf(fb_json,
            "%s\n  {\"case\": \"%s\", \"backend\": \"fa_varlen\", \"ok\": %s, \"status\": \"%s\", "
            "\"ms_median\": %.5f, \"ms_min\": %.5f, \"tflops\": %.2f, \"note\": \"%s\"}",
            fb_first_row ? "" : ",", name, status == NULL ? "true" : "false",
            status == NULL ? "ok" : status, ms, min_ms, tflops, extra);
    fb_first_row = 0;
}

/* ---- one prefill case ------------------------------------------------------------------------ */

typedef struct fb_run {
    ap_instance *inst;
    ap_layer layer;
    ap_kv_cache kv[FB_SETS];
    DLTensor q[FB_SETS], k[FB_SETS], v[FB_SETS], out[FB_SETS];
    int64_t q_shape[3], kv_shape[3];
    void *mem[4 * FB_SETS];
    int32_t *dev_ints[6];
    int save_kv, paged;
} fb_run;

static int fb_call(void *ctx, int set) {
    fb_run *r = ctx;
    ap_forward_args a = {.struct_size = sizeof a,
                         .q = &r->q[set],
                         .k = r->paged ? NULL : &r->k[set],
                         .v = r->paged ? NULL : &r->v[set],
                         .out = &r->out[set]};
    r->layer.kv = r->paged ? &r->kv[set] : NULL;
    return ap_instance_forward_extend(r->inst, &r->layer, &a, NULL) == AP_OK;
}

/* Sequence lengths: B of S, or (varlen) 64 of 16..4096 scaled to about 64k tokens. */
static int32_t fb_lengths(const fb_case *c, int32_t *lens, uint64_t *rng) {
    int64_t total = 0;
    for (int32_t i = 0; i < c->batch; i++) {
        lens[i] = c->source == FB_VARLEN ? 16 + (int32_t)gpu_rand_below(rng, 4081) : c->seq;
        total += lens[i];
    }
    if (c->source != FB_VARLEN) return (int32_t)total;
    int64_t scaled = 0;
    for (int32_t i = 0; i < c->batch; i++) {
        int64_t l = (int64_t)llround((double)lens[i] * 65536.0 / (double)total);
        lens[i] = (int32_t)(l < 16 ? 16 : l > 4096 ? 4096 : l);
        scaled += lens[i];
    }
    return (int32_t)scaled;
}

/* The batch: qo_indptr (and kv_indptr: the same rows), or the page table of a shuffled pool. */
static int fb_batch(const fb_case *c, const int32_t *lens, int32_t tokens, fb_run *r, ap_batch *b,
                    int32_t *host[6], uint64_t *rng) {
    const int32_t n = c->batch, page = 16;
    int32_t pages = 0;
    for (int32_t i = 0; i < n; i++) pages += (lens[i] + page - 1) / page;
    host[0] = calloc((size_t)n + 1, 4), host[1] = calloc((size_t)n + 1, 4);
    host[2] = calloc((size_t)pages + 1, 4), host[3] = calloc((size_t)n, 4);
    host[4] = calloc((size_t)n, 4), host[5] = calloc((size_t)tokens + 1, 4);
    for (int32_t p = 0; p < pages; p++) host[2][p] = p;
    for (int32_t p = pages - 1; p > 0; p--) { /* shuffled pages */
        int32_t j = (int32_t)gpu_rand_below(rng, (uint32_t)p + 1), t = host[2][p];
        host[2][p] = host[2][j], host[2][j] = t;
    }
    for (int32_t i = 0; i < n; i++) {
        host[0][i + 1] = host[0][i] + lens[i];
        host[1][i + 1] = host[1][i] + (lens[i] + page - 1) / page;
        host[3][i] = lens[i] - (host[1][i + 1] - host[1][i] - 1) * page;
        host[4][i] = lens[i];
        for (int32_t j = 0; j < lens[i]; j++) host[5][host[0][i] + j] = j;
    }
    int32_t max_len = 0;
    for (int32_t i = 0; i < n; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    const size_t counts[6] = {(size_t)n + 1, (size_t)n + 1, (size_t)pages,
                              (size_t)n,     (size_t)n,     (size_t)tokens};
    for (int i = 0; i < 6; i++)
        if ((r->dev_ints[i] = fb_upload_ints(host[i], counts[i])) == NULL) return 0;
    *b = (ap_batch){.struct_size = sizeof *b,
                    .mode = AP_MODE_EXTEND,
                    .num_seqs = n,
                    .num_tokens = tokens,
                    .max_q_len = max_len,
                    .max_seq_len = max_len,
                    .qo_indptr = r->dev_ints[0],
                    .seq_lens = r->dev_ints[4],
                    .positions = r->dev_ints[5],
                    .qo_indptr_host = host[0],
                    .seq_lens_host = host[4],
                    .positions_host = host[5]};
    if (r->paged) {
        b->num_pages_total = pages;
        b->kv_page_indptr = r->dev_ints[1], b->kv_page_indices = r->dev_ints[2];
        b->kv_last_page_len = r->dev_ints[3];
        b->kv_page_indptr_host = host[1], b->kv_page_indices_host = host[2];
        b->kv_last_page_len_host = host[3];
    } else {
        b->kv_indptr = r->dev_ints[0], b->kv_indptr_host = host[0];
        b->num_kv_tokens = tokens, b->kv_causal = c->causal;
    }
    return pages;
}

static double fb_flops(const fb_case *c, const int32_t *lens) {
    double f = 0;
    for (int32_t i = 0; i < c->batch; i++)
        f += 4.0 * c->hq * c->dim * (double)lens[i] * lens[i] * (c->causal ? 0.5 : 1.0);
    return f;
}

static void fb_free(fb_run *r, int32_t *host[6]) {
    for (size_t i = 0; i < sizeof r->mem / sizeof r->mem[0]; i++) cudaFree(r->mem[i]);
    for (int i = 0; i < 6; i++) cudaFree(r->dev_ints[i]), free(host[i]);
    ap_instance_close(r->inst);
}

/* Allocations of one set: q, out, and k / v rows (ragged) or K / V pages (paged). */
static int fb_set(const fb_case *c, fb_run *r, int set, int32_t tokens, int32_t pages,
                  uint64_t *rng) {
    const size_t kv_elems =
        r->paged ? (size_t)pages * 16 * c->hk * c->dim : (size_t)tokens * c->hk * c->dim;
    void **m = &r->mem[4 * set];
    m[0] = fb_random((size_t)tokens * c->hq * c->dim, 0, rng);
    m[1] = fb_random(kv_elems, c->fp8, rng);
    m[2] = fb_random(kv_elems, c->fp8, rng);
    m[3] = fb_random((size_t)tokens * c->hq * c->dim, 0, rng);
    if (!m[0] || !m[1] || !m[2] || !m[3]) return 0;
    fb_tensor(&r->q[set], r->q_shape, m[0], fb_bf16);
    fb_tensor(&r->out[set], r->q_shape, m[3], fb_bf16);
    fb_tensor(&r->k[set], r->kv_shape, m[1], c->fp8 ? fb_fp8 : fb_bf16);
    fb_tensor(&r->v[set], r->kv_shape, m[2], c->fp8 ? fb_fp8 : fb_bf16);
    r->kv[set] = (ap_kv_cache){.struct_size = sizeof(ap_kv_cache),
                               .layout = AP_KV_LAYOUT_NHD,
                               .dtype = c->fp8 ? AP_DTYPE_FP8_E4M3 : AP_DTYPE_BF16,
                               .page_size = 16,
                               .num_pages = pages,
                               .num_kv_heads = c->hk,
                               .head_dim_qk = c->dim,
                               .head_dim_v = c->dim,
                               .k_pages = m[1],
                               .v_pages = m[2]};
    return 1;
}

static void fb_case_run(ap_registry *reg, const ap_device *dev, const fb_case *c, uint64_t *rng) {
    int32_t lens[64], *host[6] = {0};
    fb_run r;
    memset(&r, 0, sizeof r);
    r.paged = c->source == FB_PAGED;
    const int32_t tokens = fb_lengths(c, lens, rng);
    ap_model m = {.struct_size = sizeof m,
                  .name = "bench",
                  .kind = AP_ATTN_MHA,
                  .num_qo_heads = c->hq,
                  .num_kv_heads = c->hk,
                  .head_dim_qk = c->dim,
                  .head_dim_v = c->dim,
                  .dtype = AP_DTYPE_BF16,
                  .kv_dtype = c->fp8 ? AP_DTYPE_FP8_E4M3 : AP_DTYPE_BF16,
                  .page_size = 16,
                  .num_layers = FB_SETS,
                  .causal = c->causal,
                  .max_batch = c->batch,
                  .max_tokens = tokens,
                  .max_kv_len = c->seq};
    const ap_options o = {.struct_size = sizeof o,
                          .prefix_cache = AP_OPTION_UNSET,
                          .chunked_prefill = AP_OPTION_UNSET,
                          .cuda_graphs = AP_OPTION_UNSET,
                          .extra = fb_extra,
                          .num_extra = fb_num_extra};
    if (ap_instance_open(reg, "fa_varlen", &m, &o, dev, &r.inst) != AP_OK) {
        fb_row(c->name, ap_last_error(), 0, 0, 0, "");
        return;
    }
    ap_batch b;
    const int32_t pages = fb_batch(c, lens, tokens, &r, &b, host, rng);
    r.q_shape[0] = tokens, r.q_shape[1] = c->hq, r.q_shape[2] = c->dim;
    r.kv_shape[0] = tokens, r.kv_shape[1] = c->hk, r.kv_shape[2] = c->dim;
    r.layer = (ap_layer){.struct_size = sizeof r.layer,
                         .sm_scale = 1.0f / sqrtf((float)c->dim),
                         .k_scale = c->fp8 ? FB_FP8_SCALE : 1.f,
                         .v_scale = c->fp8 ? FB_FP8_SCALE : 1.f,
                         .window_left = -1};
    int ok = pages > 0;
    for (int s = 0; s < FB_SETS && ok; s++) ok = fb_set(c, &r, s, tokens, pages, rng);
    if (!ok || ap_instance_init_metadata(r.inst, &b, NULL) != AP_OK) {
        fb_row(c->name, ok ? ap_last_error() : "allocation", 0, 0, 0, "");
        fb_free(&r, host);
        return;
    }
    double min_ms = 0, ms = fb_time(fb_call, &r, &min_ms);
    char note[96];
    snprintf(note, sizeof note, "%d tokens, %s%s", tokens, r.paged ? "paged 16 shuffled" : "ragged",
             c->fp8 ? ", fp8 K/V" : "");
    if (ms > 0)
        fb_row(c->name, NULL, ms, min_ms, fb_flops(c, lens) / (ms * 1e-3) * 1e-12, note);
    else
        fb_row(c->name, ap_last_error(), 0, 0, 0, "");
    fb_free(&r, host);
}

/* ---- the embedding path: skip-KV vs the cached path ----------------------------------------- */

/* Qwen3-Embedding-8B's attention (32 / 8 heads of 128, bf16), FB_EMB_LAYERS layers of 32 x 512
 * tokens: the plan and every layer's forward; skip-KV reads the raw k/v, the cached path writes
 * them into the paged cache (save_kv) and reads them back. */
typedef struct fb_emb {
    ap_instance *inst;
    ap_batch batch;
    ap_layer layers[FB_EMB_LAYERS];
    ap_kv_cache kv[FB_EMB_LAYERS];
    DLTensor q, k, v, out;
    int save_kv;
} fb_emb;

static int fb_emb_call(void *ctx, int set) {
    fb_emb *e = ctx;
    (void)set;
    if (ap_instance_init_metadata(e->inst, &e->batch, NULL) != AP_OK) return 0;
    ap_forward_args a = {.struct_size = sizeof a,
                         .q = &e->q,
                         .k = &e->k,
                         .v = &e->v,
                         .out = &e->out,
                         .save_kv = e->save_kv};
    for (int l = 0; l < FB_EMB_LAYERS; l++)
        if (ap_instance_forward_extend(e->inst, &e->layers[l], &a, NULL) != AP_OK) return 0;
    return 1;
}

/* Cosine similarity of two bf16 device arrays of n elements. */
static double fb_cosine(const void *a, const void *b, size_t n) {
    uint16_t *x = malloc(n * 2), *y = malloc(n * 2);
    double dot = 0, xx = 0, yy = 0;
    if (x != NULL && y != NULL && fb_ok(cudaMemcpy(x, a, n * 2, cudaMemcpyDeviceToHost), "out") &&
        fb_ok(cudaMemcpy(y, b, n * 2, cudaMemcpyDeviceToHost), "out")) {
        for (size_t i = 0; i < n; i++) {
            const double p = ap_bf16_to_float(x[i]), q = ap_bf16_to_float(y[i]);
            dot += p * q, xx += p * p, yy += q * q;
        }
    }
    free(x), free(y);
    return xx > 0 && yy > 0 ? dot / sqrt(xx * yy) : NAN;
}

static int fb_embedding_compare(ap_registry *reg, const ap_device *dev) {
    const fb_case c = {"fav_embedding_skip_kv_vs_cached", FB_PAGED, 128, 32, 8, 32, 512, 1, 0};
    int32_t lens[32], *host[6] = {0};
    fb_run r;
    memset(&r, 0, sizeof r);
    r.paged = 1;
    uint64_t rng = 7;
    const int32_t tokens = fb_lengths(&c, lens, &rng);
    ap_model m = {.struct_size = sizeof m,
                  .name = "Qwen/Qwen3-Embedding-8B",
                  .kind = AP_ATTN_MHA,
                  .num_qo_heads = 32,
                  .num_kv_heads = 8,
                  .head_dim_qk = 128,
                  .head_dim_v = 128,
                  .dtype = AP_DTYPE_BF16,
                  .kv_dtype = AP_DTYPE_BF16,
                  .page_size = 16,
                  .num_layers = FB_EMB_LAYERS,
                  .causal = 1,
                  .embedding = 1,
                  .max_batch = 32,
                  .max_tokens = tokens,
                  .max_kv_len = 512};
    ap_options skip_o = {.struct_size = sizeof skip_o,
                         .prefix_cache = 0,
                         .chunked_prefill = AP_OPTION_UNSET,
                         .cuda_graphs = AP_OPTION_UNSET};
    ap_options cached_o = skip_o;
    cached_o.prefix_cache = 1;
    fb_emb skip = {0}, cached = {0};
    const int32_t pages = fb_batch(&c, lens, tokens, &r, &cached.batch, host, &rng);
    skip.batch = cached.batch;
    skip.batch.kv_page_indptr = skip.batch.kv_page_indices = skip.batch.kv_last_page_len = NULL;
    skip.batch.kv_page_indptr_host = skip.batch.kv_page_indices_host = NULL;
    skip.batch.kv_last_page_len_host = NULL;
    skip.batch.num_pages_total = 0;
    cached.save_kv = 1;
    r.q_shape[0] = tokens, r.q_shape[1] = 32, r.q_shape[2] = 128;
    r.kv_shape[0] = tokens, r.kv_shape[1] = 8, r.kv_shape[2] = 128;
    const size_t q_n = (size_t)tokens * 32 * 128, kv_n = (size_t)tokens * 8 * 128;
    const size_t page_n = (size_t)pages * 16 * 8 * 128;
    void *q = fb_random(q_n, 0, &rng), *k = fb_random(kv_n, 0, &rng), *v = fb_random(kv_n, 0, &rng);
    void *o1 = fb_random(q_n, 0, &rng), *o2 = fb_random(q_n, 0, &rng), *pool[2 * FB_EMB_LAYERS];
    int ok = pages > 0 && q && k && v && o1 && o2 &&
             ap_instance_open(reg, "fa_varlen", &m, &skip_o, dev, &skip.inst) == AP_OK &&
             ap_instance_open(reg, "fa_varlen", &m, &cached_o, dev, &cached.inst) == AP_OK;
    for (int l = 0; l < FB_EMB_LAYERS; l++) {
        pool[2 * l] = ok ? fb_random(page_n, 0, &rng) : NULL;
        pool[2 * l + 1] = ok ? fb_random(page_n, 0, &rng) : NULL;
        ok = ok && pool[2 * l] && pool[2 * l + 1];
        cached.kv[l] = (ap_kv_cache){.struct_size = sizeof(ap_kv_cache),
                                     .dtype = AP_DTYPE_BF16,
                                     .page_size = 16,
                                     .num_pages = pages,
                                     .num_kv_heads = 8,
                                     .head_dim_qk = 128,
                                     .head_dim_v = 128,
                                     .k_pages = pool[2 * l],
                                     .v_pages = pool[2 * l + 1]};
        skip.layers[l] = (ap_layer){.struct_size = sizeof(ap_layer),
                                    .layer_id = l,
                                    .sm_scale = 1.0f / sqrtf(128.f),
                                    .k_scale = 1.f,
                                    .v_scale = 1.f,
                                    .window_left = -1};
        cached.layers[l] = skip.layers[l];
        cached.layers[l].kv = &cached.kv[l];
    }
    fb_emb *both[2] = {&skip, &cached};
    for (int i = 0; i < 2; i++) {
        fb_tensor(&both[i]->q, r.q_shape, q, fb_bf16);
        fb_tensor(&both[i]->k, r.kv_shape, k, fb_bf16);
        fb_tensor(&both[i]->v, r.kv_shape, v, fb_bf16);
        fb_tensor(&both[i]->out, r.q_shape, i == 0 ? o1 : o2, fb_bf16);
    }
    double ms[2] = {-1, -1}, min_ms[2] = {0, 0};
    for (int i = 0; i < 2 && ok; i++) ms[i] = fb_time(fb_emb_call, both[i], &min_ms[i]);
    ok = ok && ms[0] > 0 && ms[1] > 0 && fb_emb_call(&skip, 0) && fb_emb_call(&cached, 0) &&
         fb_ok(cudaDeviceSynchronize(), "embedding");
    const double cosine = ok ? fb_cosine(o1, o2, q_n) : NAN;
    char note[160];
    snprintf(note, sizeof note,
             "per layer, plan included: skip-KV %.1f us, cached %.1f us, saved %.1f us; cosine "
             "%.6f",
             ms[0] * 1e3 / FB_EMB_LAYERS, ms[1] * 1e3 / FB_EMB_LAYERS,
             (ms[1] - ms[0]) * 1e3 / FB_EMB_LAYERS, cosine);
    if (ok)
        fb_row(c.name, NULL, ms[0] / FB_EMB_LAYERS, min_ms[0] / FB_EMB_LAYERS, 0, note);
    else
        fb_row(c.name, ap_last_error(), 0, 0, 0, "");
    void *mem[] = {q, k, v, o1, o2};
    for (int i = 0; i < 5; i++) cudaFree(mem[i]);
    for (int l = 0; l < 2 * FB_EMB_LAYERS && ok; l++) cudaFree(pool[l]);
    ap_instance_close(skip.inst);
    r.inst = cached.inst;
    fb_free(&r, host);
    return ok && cosine > 0.99 ? 0 : 1;
}

/* The case list as peer_torch.py reads it (varlen has no dense peer: its target is ours). */
static void fb_write_list(FILE *to) {
    fprintf(to, "[\n");
    int first = 1;
    for (size_t i = 0; i < sizeof fb_cases / sizeof fb_cases[0]; i++) {
        const fb_case *c = &fb_cases[i];
        if (c->source == FB_VARLEN) continue;
        const double flops =
            4.0 * c->batch * c->hq * c->dim * (double)c->seq * c->seq * (c->causal ? 0.5 : 1.0);
        fprintf(to,
                "%s  {\"case\": \"%s\", \"mode\": \"extend\", \"q_dtype\": \"bf16\", "
                "\"kv_dtype\": \"%s\", \"page_size\": 16, \"head_dim\": %d, \"num_qo_heads\": %d, "
                "\"num_kv_heads\": %d, \"batch\": %d, \"prefix\": 0, \"q_len\": %d, "
                "\"kv_elems\": %lld, \"flops\": %.6e, \"new_tokens\": %lld, \"causal\": %s}",
                first ? "" : ",\n", c->name, c->fp8 ? "fp8_e4m3" : "bf16", c->dim, c->hq, c->hk,
                c->batch, c->seq, (long long)c->batch * c->seq * c->hk * c->dim * 2, flops,
                (long long)c->batch * c->seq, c->causal ? "true" : "false");
        first = 0;
    }
    fprintf(to, "\n]\n");
}

int main(int argc, char **argv) {
    const char *dirs[8], *only = NULL, *json_path = NULL, *list_path = NULL;
    size_t num_dirs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            fb_runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json_path = argv[++i];
        else if (strcmp(argv[i], "--list") == 0 && i + 1 < argc)
            list_path = argv[++i];
        else if (strcmp(argv[i], "--plugin-dir") == 0 && i + 1 < argc && num_dirs < 8)
            dirs[num_dirs++] = argv[++i];
        else if (strcmp(argv[i], "--option") == 0 && i + 1 < argc &&
                 fb_num_extra < FB_MAX_OPTIONS && strchr(argv[i + 1], '=') != NULL) {
            char *kv = argv[++i], *eq = strchr(kv, '=');
            *eq = '\0';
            fb_extra[fb_num_extra++] = (ap_option_kv){kv, eq + 1};
        } else {
            fprintf(stderr, "usage: fav-bench [--runs N] [--only TEXT] [--json FILE] "
                            "[--list FILE] [--option KEY=VALUE]... [--plugin-dir DIR]...\n");
            return 2;
        }
    }
    if (list_path != NULL) {
        FILE *f = fopen(list_path, "w");
        if (f == NULL) return 1;
        fb_write_list(f);
        fclose(f);
        return 0;
    }
    if (fb_runs < 3) fb_runs = 3;
    ap_registry *reg = NULL;
    ap_registry_options ro = {
        .struct_size = sizeof ro, .search_dirs = dirs, .num_search_dirs = num_dirs};
    ap_device dev;
    if (ap_registry_create(&ro, &reg) != AP_OK || ap_registry_scan(reg) != AP_OK ||
        ap_device_query(0, &dev) != AP_OK || dev.unusable_reason[0] != '\0') {
        printf("fav-bench: no registry or no usable GPU: %s\n", ap_last_error());
        return 77;
    }
    if (json_path != NULL && (fb_json = fopen(json_path, "w")) != NULL) fprintf(fb_json, "[");
    printf("fav-bench: fa_varlen on %s, median of %d calls; TFLOP/s = 4 * HQ * D * sum(S^2) "
           "(x 1/2 causal) / median\n",
           dev.name, fb_runs);
    uint64_t rng = 20261125;
    for (size_t i = 0; i < sizeof fb_cases / sizeof fb_cases[0]; i++)
        if (only == NULL || strstr(fb_cases[i].name, only) != NULL)
            fb_case_run(reg, &dev, &fb_cases[i], &rng);
    int rc = 0;
    if (only == NULL || strstr("fav_embedding_skip_kv_vs_cached", only) != NULL)
        rc = fb_embedding_compare(reg, &dev);
    if (fb_json != NULL) fprintf(fb_json, "\n]\n"), fclose(fb_json);
    ap_registry_destroy(reg);
    return rc;
}
