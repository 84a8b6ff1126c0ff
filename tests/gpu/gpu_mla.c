/* gpu_mla.c: gpu-mla, trtllm_mla checked on the GPU against cpu_ref and a float64 reference:
 * absorbed decode and MTP extend (pages 32/64, bf16/fp8, heads 16..128, mixed lengths, strided
 * queries, split-KV), CUDA-graph replay, (gpu_mla_hooks.c) the pack, append and merge hooks, and
 * (gpu_mla_prefill.c) the MHA-form prefill on the kit's prefill kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/numeric/host_numeric.h"
#include "gpu_mla.h"
#include "gpu_rand.h"
#include "gpu_registry.h"
#include "tests/common/test_model.h"

/* ---- shared helpers -------------------------------------------------------------------------- */

void mt_tensor_make(mt_tensor *t, void *data, ap_dtype dtype, int on_device, int ndim,
                    const int64_t *shape, const int64_t *strides) {
    memset(t, 0, sizeof *t);
    t->dl.data = data;
    t->dl.device.device_type = on_device ? kDLCUDA : kDLCPU;
    t->dl.device.device_id = 0;
    t->dl.ndim = ndim;
    switch (dtype) {
        case AP_DTYPE_BF16: t->dl.dtype = (DLDataType){kDLBfloat, 16, 1}; break;
        case AP_DTYPE_F16: t->dl.dtype = (DLDataType){kDLFloat, 16, 1}; break;
        case AP_DTYPE_F32: t->dl.dtype = (DLDataType){kDLFloat, 32, 1}; break;
        case AP_DTYPE_FP8_E4M3: t->dl.dtype = (DLDataType){AP_DL_FLOAT8_E4M3FN, 8, 1}; break;
        default: t->dl.dtype = (DLDataType){kDLInt, 32, 1}; break;
    }
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->dl.shape = t->shape;
    if (strides != NULL) {
        for (int i = 0; i < ndim; i++) t->strides[i] = strides[i];
        t->dl.strides = t->strides;
    }
}

ap_model mt_mla_model(int32_t heads, int32_t page_size, ap_dtype kv_dtype) {
    ap_model m = ap_test_mla_model("deepseek-ai/DeepSeek-V3", heads);
    m.kv_dtype = kv_dtype;
    m.page_size = page_size;
    m.num_layers = 1;
    m.max_kv_len = 65536;
    return m;
}

int mt_cuda_ok(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return 1;
    printf("CUDA error in %s: %s\n", what, cudaGetErrorString(err));
    return 0;
}

void *mt_dev_alloc(size_t bytes) {
    void *p = NULL;
    if (!mt_cuda_ok(cudaMalloc(&p, bytes > 0 ? bytes : 16), "cudaMalloc")) return NULL;
    return p;
}

int mt_upload(void *dev, const void *host, size_t bytes) {
    return mt_cuda_ok(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "upload");
}

int mt_download(void *host, const void *dev, size_t bytes) {
    return mt_cuda_ok(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "download");
}

uint16_t mt_bf16(float x) {
    return ap_float_to_bf16(x);
}

float mt_bf16_f(uint16_t x) {
    return ap_bf16_to_float(x);
}

/* NaN anywhere (an unwritten, poisoned element) counts as bad and makes the error infinite. */
double mt_rel_l2(const double *got, const double *want, size_t n, size_t *bad) {
    double num = 0, den = 0;
    *bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) && got[i] != want[i]) (*bad)++;
        double d = got[i] - want[i];
        if (isfinite(d)) num += d * d;
        if (isfinite(want[i])) den += want[i] * want[i];
    }
    if (*bad > 0) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int mt_selected(const mt_ctx *ctx, const char *name, int quick_case) {
    if (ctx->filter != NULL && strstr(name, ctx->filter) == NULL) return 0;
    return !ctx->quick || quick_case;
}

void mt_verdict(mt_ctx *ctx, const char *name, int ok, const char *detail) {
    printf("%s  %-46s %s\n", ok ? "PASS" : "FAIL", name, detail);
    fflush(stdout);
    if (ok)
        ctx->passed++;
    else
        ctx->failed++;
}

/* ---- decode / MTP ---------------------------------------------------------------------------- */

typedef struct mt_decode_case {
    const char *name;
    int32_t heads, page_size;
    ap_dtype kv_dtype;
    int32_t num_seqs;
    int32_t lens[8];   /* seq_lens; with num_seqs > 8 the lengths are drawn in 1..lens[0] */
    int32_t q_lens[8]; /* query tokens per sequence (0 = 1); cycled past 8 */
    int strided;       /* q_nope and q_rope as views into one [T][H][640] buffer */
    int split_off;     /* option split_kv: off */
    int graph;         /* also capture the decode in a CUDA graph and replay it */
    int quick;
    int stages;     /* option decode_stages: 0 unset (3 for 16-row kernels), or 2 / 3 forced */
    int split_grid; /* option decode_schedule: 1 split (the per-sequence split grid), 2 cut */
} mt_decode_case;

/* name, heads, page, kv dtype, seqs, lens, q_lens, strided, split_off, graph, quick, stages,
 * split_grid */
// clang-format off
static const mt_decode_case mt_decode_cases[] = {
    {"mla-decode-bf16-h16-p64-mixed", 16, 64, AP_DTYPE_BF16, 5, {1, 63, 64, 65, 5000}, {0}, 1, 0, 0, 0, 0, 0},
    {"mla-decode-bf16-h128-p32-mixed", 128, 32, AP_DTYPE_BF16, 5, {1, 63, 64, 65, 5000}, {0}, 1, 0, 0, 0, 0, 0},
    {"mla-decode-bf16-h16-p32-mixed", 16, 32, AP_DTYPE_BF16, 5, {1, 63, 64, 65, 5000}, {0}, 1, 0, 0, 0, 0, 0},
    {"mla-decode-fp8-h16-p32-mixed", 16, 32, AP_DTYPE_FP8_E4M3, 5, {1, 63, 64, 65, 5000}, {0}, 1, 0, 0, 0, 0, 0},
    {"mla-decode-fp8-h128-p64-mixed", 128, 64, AP_DTYPE_FP8_E4M3, 5, {65, 1, 5000, 64, 63}, {0}, 0, 0, 0, 0, 0, 0},
    {"mla-decode-bf16-h16-b1-l32768-split", 16, 64, AP_DTYPE_BF16, 1, {32768}, {0}, 0, 0, 0, 0, 0, 0},
    {"mla-decode-bf16-h64-p64-nosplit", 64, 64, AP_DTYPE_BF16, 3, {100, 3000, 1}, {0}, 1, 1, 0, 0, 0, 0},
    {"mla-decode-bf16-h32-b40-random", 32, 32, AP_DTYPE_BF16, 40, {2000}, {0}, 0, 0, 0, 0, 0, 0},
    {"mla-decode-fp8-h128-b150-random", 128, 64, AP_DTYPE_FP8_E4M3, 150, {700}, {0}, 0, 0, 0, 0, 0, 0},
    {"mla-mtp-bf16-h128-q1to4", 128, 64, AP_DTYPE_BF16, 5, {4, 63, 64, 65, 5000}, {1, 2, 3, 4, 2}, 1, 0, 0, 0, 0, 0},
    {"mla-mtp-fp8-h16-q2", 16, 32, AP_DTYPE_FP8_E4M3, 4, {2, 65, 300, 4097}, {2, 2, 2, 2}, 1, 0, 0, 0, 0, 0},
    {"mla-mtp-bf16-h16-q4-split", 16, 64, AP_DTYPE_BF16, 2, {4, 9000}, {4, 4}, 0, 0, 0, 0, 0, 0},
    {"mla-decode-bf16-h16-graph", 16, 64, AP_DTYPE_BF16, 6, {1, 63, 64, 65, 5000, 777}, {0}, 1, 0, 1, 0, 0, 0},
    {"mla-decode-fp8-h128-graph", 128, 32, AP_DTYPE_FP8_E4M3, 3, {10, 3000, 129}, {0}, 0, 0, 1, 0, 0, 0},
    /* bf16, 128 heads (the wgmma kernel): 300 CTAs, more than the SMs (no split, random
     * lengths), and captured in a graph */
    {"mla-decode-bf16-h128-b150-random", 128, 64, AP_DTYPE_BF16, 150, {700}, {0}, 1, 0, 0, 0, 0, 0},
    {"mla-decode-bf16-h128-p64-graph", 128, 64, AP_DTYPE_BF16, 3, {10, 3000, 129}, {0}, 0, 0, 1, 0, 0, 0},
    /* decode_stages forced: the 16-row kernel with two stages (Q in shared memory), or three */
    {"mla-decode-bf16-h16-p64-mixed-2stage", 16, 64, AP_DTYPE_BF16, 5, {1, 63, 64, 65, 5000}, {0}, 1, 0, 0, 0, 2, 0},
    {"mla-decode-fp8-h16-p32-mixed-2stage", 16, 32, AP_DTYPE_FP8_E4M3, 5, {65, 1, 5000, 64, 63}, {0}, 0, 0, 1, 0, 2, 0},
    /* fp8 16 rows, 3 stages (fragment-converted K/V) without splits: the direct output stores */
    {"mla-decode-fp8-h16-p64-nosplit", 16, 64, AP_DTYPE_FP8_E4M3, 6, {1, 63, 64, 65, 5000, 777}, {0}, 1, 1, 0, 0, 0, 0},
    {"mla-decode-bf16-h16-b1-l32768-split-3stage", 16, 64, AP_DTYPE_BF16, 1, {32768}, {0}, 0, 0, 0, 0, 3, 0},
    /* splits of 2 and 3 tiles on the 3-stage kernel (its prologue issues a third tile, the loop
     * none in its first step): 66 splits over 125 / 132 tiles of two pages of 32; 132 over 396
     * tiles, the last one 59 rows (fp8) */
    {"mla-decode-bf16-h16-b2-p32-split-2tiles", 16, 32, AP_DTYPE_BF16, 2, {8000, 8447}, {0}, 1, 0, 0, 0, 0, 0},
    {"mla-decode-fp8-h16-b1-split-3tiles", 16, 64, AP_DTYPE_FP8_E4M3, 1, {25339}, {0}, 0, 0, 0, 0, 0, 0},
    /* the flat schedule (the default where a sequence's rows fit one CTA) over more sequences
     * than SMs, random lengths; a skewed batch (one long sequence among short ones, the case it
     * is for); fp8 MTP (the 64-row kernel, rows 64); short sequences that it runs whole (one
     * sequence per CTA at a time); and the split grid it replaced, forced */
    {"mla-decode-bf16-h16-b200-random-flat", 16, 64, AP_DTYPE_BF16, 200, {3000}, {0}, 1, 0, 0, 0, 0, 0},
    {"mla-decode-fp8-h16-b150-random-flat", 16, 32, AP_DTYPE_FP8_E4M3, 150, {2500}, {0}, 0, 0, 1, 0, 0, 0},
    {"mla-decode-bf16-h16-skew-flat", 16, 64, AP_DTYPE_BF16, 8, {20000, 1, 63, 64, 65, 5000, 3, 130}, {0}, 0, 0, 1, 0, 0, 0},
    {"mla-mtp-fp8-h16-q4-b140-flat", 16, 64, AP_DTYPE_FP8_E4M3, 140, {1500}, {4, 1, 3, 2, 4, 4, 1, 2}, 1, 0, 0, 0, 0, 0},
    {"mla-decode-bf16-h16-b250-short-whole", 16, 64, AP_DTYPE_BF16, 250, {100}, {0}, 1, 0, 1, 0, 0, 0},
    {"mla-decode-bf16-h16-b250-short-cut", 16, 64, AP_DTYPE_BF16, 250, {100}, {0}, 0, 0, 0, 0, 0, 2},
    {"mla-decode-bf16-h16-p64-mixed-splitgrid", 16, 64, AP_DTYPE_BF16, 5, {1, 63, 64, 65, 5000}, {0}, 1, 0, 0, 0, 0, 1},
    {"mla-decode-fp8-h16-b1-l32768-splitgrid", 16, 64, AP_DTYPE_FP8_E4M3, 1, {32768}, {0}, 0, 0, 1, 0, 0, 1},
    /* the quick subset, run under compute-sanitizer */
    {"quick-mla-decode-bf16-h16-p64", 16, 64, AP_DTYPE_BF16, 4, {1, 63, 65, 300}, {0}, 0, 0, 0, 1, 0, 0},
    {"quick-mla-decode-fp8-h128-p32", 128, 32, AP_DTYPE_FP8_E4M3, 3, {1, 65, 200}, {0}, 0, 0, 1, 1, 0, 0},
    {"quick-mla-mtp-bf16-h16-q2", 16, 64, AP_DTYPE_BF16, 3, {2, 64, 131}, {2, 1, 2}, 0, 0, 0, 1, 0, 0},
    {"quick-mla-decode-bf16-h64-b1-split", 64, 64, AP_DTYPE_BF16, 1, {1000}, {0}, 0, 0, 0, 1, 0, 0},
    {"quick-mla-decode-bf16-h16-2stage", 16, 64, AP_DTYPE_BF16, 5, {1, 63, 65, 300, 129}, {0}, 1, 0, 1, 1, 2, 0},
    {"quick-mla-decode-fp8-h16-split", 16, 32, AP_DTYPE_FP8_E4M3, 1, {700}, {0}, 0, 0, 0, 1, 0, 0},
    {"quick-mla-decode-bf16-h16-split-2tiles", 16, 64, AP_DTYPE_BF16, 1, {16833}, {0}, 0, 0, 1, 1, 0, 0},
    {"quick-mla-decode-bf16-h16-b150-flat", 16, 64, AP_DTYPE_BF16, 150, {300}, {0}, 0, 0, 1, 1, 0, 0},
    {"quick-mla-decode-fp8-h16-b200-short-whole-flat", 16, 32, AP_DTYPE_FP8_E4M3, 200, {120}, {0}, 0, 0, 0, 1, 0, 0},
    {"quick-mla-mtp-fp8-h16-q4-b40-flat", 16, 32, AP_DTYPE_FP8_E4M3, 40, {400}, {4, 2}, 0, 0, 0, 1, 0, 0},
    {"quick-mla-decode-fp8-h16-2stage", 16, 64, AP_DTYPE_FP8_E4M3, 3, {1, 200, 64}, {0}, 1, 0, 0, 1, 2, 0},
};
// clang-format on

/* One decode case's host data: batch arrays, cache, queries; device copies. */
typedef struct mt_decode_data {
    const mt_decode_case *c;
    ap_model model;
    int32_t num_seqs, num_tokens, max_q_len, max_len, num_pages;
    int32_t *qo_indptr, *page_indptr, *page_indices, *last_len, *seq_lens, *positions, *q_lens;
    uint8_t *cache; /* [pages][page][576] of the cache dtype */
    size_t cache_bytes, elem;
    uint16_t *q; /* [T][H][qw] */
    int64_t qw;  /* 640 strided (nope at 0, rope at 576); 512 dense (with q_rope_dense) */
    uint16_t *q_rope_dense;
    float kv_scale, sm_scale;
    double *ref_out, *ref_lse;
} mt_decode_data;

static void mt_decode_data_free(mt_decode_data *d) {
    free(d->qo_indptr);
    free(d->page_indptr);
    free(d->page_indices);
    free(d->last_len);
    free(d->seq_lens);
    free(d->positions);
    free(d->q_lens);
    free(d->cache);
    free(d->q);
    free(d->q_rope_dense);
    free(d->ref_out);
    free(d->ref_lse);
}

static int mt_decode_data_make(const mt_decode_case *c, uint64_t *rng, mt_decode_data *d) {
    memset(d, 0, sizeof *d);
    d->c = c;
    d->model = mt_mla_model(c->heads, c->page_size, c->kv_dtype);
    int n = c->num_seqs;
    d->num_seqs = n;
    d->q_lens = calloc((size_t)n, sizeof(int32_t));
    d->seq_lens = calloc((size_t)n, sizeof(int32_t));
    d->qo_indptr = calloc((size_t)n + 1, sizeof(int32_t));
    d->page_indptr = calloc((size_t)n + 1, sizeof(int32_t));
    d->last_len = calloc((size_t)n, sizeof(int32_t));
    if (!d->q_lens || !d->seq_lens || !d->qo_indptr || !d->page_indptr || !d->last_len) return 0;
    for (int i = 0; i < n; i++) {
        int ql = c->q_lens[i % 8] > 0 ? c->q_lens[i % 8] : 1;
        int len = n > 8 ? 1 + (int)gpu_rand_below(rng, (uint32_t)c->lens[0]) : c->lens[i];
        if (len < ql) len = ql;
        d->q_lens[i] = ql;
        d->seq_lens[i] = len;
        d->qo_indptr[i + 1] = d->qo_indptr[i] + ql;
        int pages = (len + c->page_size - 1) / c->page_size;
        d->page_indptr[i + 1] = d->page_indptr[i] + pages;
        d->last_len[i] = len - (pages - 1) * c->page_size;
        if (ql > d->max_q_len) d->max_q_len = ql;
        if (len > d->max_len) d->max_len = len;
    }
    d->num_tokens = d->qo_indptr[n];
    d->num_pages = d->page_indptr[n] + 3; /* a few pages nobody names */
    d->page_indices = calloc((size_t)d->num_pages, sizeof(int32_t));
    d->positions = calloc((size_t)d->num_tokens, sizeof(int32_t));
    if (!d->page_indices || !d->positions) return 0;
    for (int i = 0; i < d->num_pages; i++) d->page_indices[i] = i;
    for (int i = d->num_pages - 1; i > 0; i--) { /* shuffled pages, as an engine's are */
        int j = (int)gpu_rand_below(rng, (uint32_t)i + 1);
        int32_t tmp = d->page_indices[i];
        d->page_indices[i] = d->page_indices[j];
        d->page_indices[j] = tmp;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d->q_lens[i]; j++)
            d->positions[d->qo_indptr[i] + j] = d->seq_lens[i] - d->q_lens[i] + j;
    d->elem = c->kv_dtype == AP_DTYPE_FP8_E4M3 ? 1 : 2;
    d->cache_bytes = (size_t)d->num_pages * c->page_size * 576 * d->elem;
    d->cache = malloc(d->cache_bytes);
    if (d->cache == NULL) return 0;
    d->kv_scale = c->kv_dtype == AP_DTYPE_FP8_E4M3 ? 0.0125f : 1.0f;
    size_t vals = d->cache_bytes / d->elem;
    for (size_t i = 0; i < vals; i++) {
        float x = gpu_rand_uniform(rng, -1.f, 1.f);
        if (d->elem == 1)
            d->cache[i] = ap_float_to_fp8_e4m3(x / d->kv_scale);
        else
            ((uint16_t *)d->cache)[i] = mt_bf16(x);
    }
    /* The rows past each sequence's length in its last page hold NaN: a kernel that reads a
     * whole page (a TMA box) must keep them out of its result, where P's zeros would turn them
     * into NaN (an engine's fresh pages hold anything). */
    for (int i = 0; i < n; i++) {
        const int32_t pages = d->page_indptr[i + 1] - d->page_indptr[i];
        for (int32_t pos = d->seq_lens[i]; pos < pages * c->page_size; pos++) {
            const size_t row = (size_t)d->page_indices[d->page_indptr[i] + pos / c->page_size] *
                                   (size_t)c->page_size +
                               (size_t)(pos % c->page_size);
            for (size_t e = 0; e < 576; e++) {
                if (d->elem == 1)
                    d->cache[row * 576 + e] = 0x7f; /* e4m3 NaN */
                else
                    ((uint16_t *)d->cache)[row * 576 + e] = 0x7fc0; /* bf16 NaN */
            }
        }
    }
    d->qw = c->strided ? 640 : 512;
    size_t qn = (size_t)d->num_tokens * c->heads * (size_t)d->qw;
    d->q = malloc(qn * 2);
    d->q_rope_dense = malloc((size_t)d->num_tokens * c->heads * 64 * 2);
    if (d->q == NULL || d->q_rope_dense == NULL) return 0;
    for (size_t i = 0; i < qn; i++) d->q[i] = mt_bf16(gpu_rand_uniform(rng, -1.f, 1.f));
    for (size_t i = 0; i < (size_t)d->num_tokens * c->heads * 64; i++)
        d->q_rope_dense[i] = mt_bf16(gpu_rand_uniform(rng, -1.f, 1.f));
    d->sm_scale = 1.0f / sqrtf(192.0f);
    return 1;
}

/* Element (t, h, d) of the absorbed query: q_nope for d < 512, q_rope beyond. */
static float mt_q_at(const mt_decode_data *d, int t, int h, int dim) {
    const int64_t row = ((int64_t)t * d->c->heads + h);
    if (dim < 512) return mt_bf16_f(d->q[row * d->qw + dim]);
    if (d->c->strided) return mt_bf16_f(d->q[row * d->qw + 576 + (dim - 512)]); /* 576..639 */
    return mt_bf16_f(d->q_rope_dense[row * 64 + (dim - 512)]);
}

static double mt_cache_at(const mt_decode_data *d, int seq, int pos, int dim) {
    int page = d->page_indices[d->page_indptr[seq] + pos / d->c->page_size];
    size_t idx = ((size_t)page * d->c->page_size + pos % d->c->page_size) * 576 + dim;
    if (d->elem == 1) return (double)ap_fp8_e4m3_to_float(d->cache[idx]) * d->kv_scale;
    return mt_bf16_f(((const uint16_t *)d->cache)[idx]);
}

/* float64 reference: logits over the visible keys, softmax, out = P c, lse = log sum exp. */
static int mt_decode_reference(mt_decode_data *d) {
    const int H = d->c->heads;
    d->ref_out = malloc((size_t)d->num_tokens * H * 512 * sizeof(double));
    d->ref_lse = malloc((size_t)d->num_tokens * H * sizeof(double));
    double *keys = malloc((size_t)d->max_len * 576 * sizeof(double));
    double *logit = malloc((size_t)d->max_len * sizeof(double));
    double q[576];
    if (!d->ref_out || !d->ref_lse || !keys || !logit) {
        free(keys);
        free(logit);
        return 0;
    }
    for (int s = 0; s < d->num_seqs; s++) {
        for (int p = 0; p < d->seq_lens[s]; p++)
            for (int k = 0; k < 576; k++) keys[(size_t)p * 576 + k] = mt_cache_at(d, s, p, k);
        for (int j = 0; j < d->q_lens[s]; j++) {
            int t = d->qo_indptr[s] + j;
            int visible = d->seq_lens[s] - d->q_lens[s] + j + 1;
            for (int h = 0; h < H; h++) {
                for (int k = 0; k < 576; k++) q[k] = mt_q_at(d, t, h, k);
                double mx = -INFINITY;
                for (int p = 0; p < visible; p++) {
                    double acc = 0;
                    for (int k = 0; k < 576; k++) acc += q[k] * keys[(size_t)p * 576 + k];
                    logit[p] = acc * d->sm_scale;
                    if (logit[p] > mx) mx = logit[p];
                }
                double sum = 0;
                for (int p = 0; p < visible; p++) sum += (logit[p] = exp(logit[p] - mx));
                double *o = d->ref_out + ((size_t)t * H + h) * 512;
                for (int k = 0; k < 512; k++) o[k] = 0;
                for (int p = 0; p < visible; p++) {
                    double w = logit[p] / sum;
                    for (int k = 0; k < 512; k++) o[k] += w * keys[(size_t)p * 576 + k];
                }
                d->ref_lse[(size_t)t * H + h] = mx + log(sum);
            }
        }
    }
    free(keys);
    free(logit);
    return 1;
}

/* Device buffers of one decode case and the arguments that name them. */
typedef struct mt_decode_dev {
    void *cache, *q, *q_rope, *out, *lse, *ints;
    int32_t *qo_indptr, *page_indptr, *page_indices, *last_len, *seq_lens, *positions;
    mt_tensor tq, tqr, tout, tlse;
    ap_kv_cache kv;
    ap_layer layer;
    ap_batch batch;
    ap_forward_args args;
    size_t out_bytes, lse_bytes;
} mt_decode_dev;

static void mt_decode_dev_free(mt_decode_dev *g) {
    cudaFree(g->cache);
    cudaFree(g->q);
    cudaFree(g->q_rope);
    cudaFree(g->out);
    cudaFree(g->lse);
    cudaFree(g->ints);
}

static void mt_batch_fill(const mt_decode_data *d, ap_batch *b, const int32_t *const arrays[6]) {
    memset(b, 0, sizeof *b);
    b->struct_size = sizeof *b;
    b->mode = d->max_q_len == 1 ? AP_MODE_DECODE : AP_MODE_EXTEND;
    b->num_seqs = d->num_seqs;
    b->num_tokens = d->num_tokens;
    b->max_q_len = d->max_q_len;
    b->max_seq_len = d->max_len;
    b->num_pages_total = d->page_indptr[d->num_seqs];
    b->qo_indptr = arrays[0];
    b->kv_page_indptr = arrays[1];
    b->kv_page_indices = arrays[2];
    b->kv_last_page_len = arrays[3];
    b->seq_lens = arrays[4];
    b->positions = arrays[5];
    b->qo_indptr_host = d->qo_indptr;
    b->kv_page_indptr_host = d->page_indptr;
    b->kv_page_indices_host = d->page_indices;
    b->kv_last_page_len_host = d->last_len;
    b->seq_lens_host = d->seq_lens;
    b->positions_host = d->positions;
}

static void mt_layer_fill(const mt_decode_data *d, void *pages, ap_kv_cache *kv, ap_layer *layer) {
    memset(kv, 0, sizeof *kv);
    kv->struct_size = sizeof *kv;
    kv->layout = AP_KV_LAYOUT_NHD;
    kv->dtype = d->c->kv_dtype;
    kv->page_size = d->c->page_size;
    kv->num_pages = d->num_pages;
    kv->num_kv_heads = 1;
    kv->head_dim_qk = 576;
    kv->head_dim_v = 512;
    kv->k_pages = pages;
    memset(layer, 0, sizeof *layer);
    layer->struct_size = sizeof *layer;
    layer->sm_scale = d->sm_scale;
    layer->k_scale = d->kv_scale;
    layer->v_scale = d->kv_scale;
    layer->window_left = -1;
    layer->kv = kv;
}

/* q (and q_rope) tensors over `qbase` (and `rbase` when dense), on the device or the host. */
static void mt_query_tensors(const mt_decode_data *d, void *qbase, void *rbase, int on_device,
                             mt_tensor *tq, mt_tensor *tqr) {
    const int64_t T = d->num_tokens, H = d->c->heads;
    if (d->c->strided) {
        const int64_t strides[3] = {H * 640, 640, 1};
        mt_tensor_make(tq, qbase, AP_DTYPE_BF16, on_device, 3, (int64_t[]){T, H, 512}, strides);
        mt_tensor_make(tqr, (uint16_t *)qbase + 576, AP_DTYPE_BF16, on_device, 3,
                       (int64_t[]){T, H, 64}, strides);
    } else {
        mt_tensor_make(tq, qbase, AP_DTYPE_BF16, on_device, 3, (int64_t[]){T, H, 512}, NULL);
        mt_tensor_make(tqr, rbase, AP_DTYPE_BF16, on_device, 3, (int64_t[]){T, H, 64}, NULL);
    }
}

static int mt_decode_dev_make(const mt_decode_data *d, mt_decode_dev *g) {
    memset(g, 0, sizeof *g);
    const int64_t T = d->num_tokens, H = d->c->heads;
    size_t q_bytes = (size_t)T * H * d->qw * 2, r_bytes = (size_t)T * H * 64 * 2;
    g->out_bytes = (size_t)T * H * 512 * 2;
    g->lse_bytes = (size_t)T * H * 4;
    int n = d->num_seqs;
    size_t ints = (size_t)(3 * (n + 1) + 2 * n + d->num_pages + T);
    g->cache = mt_dev_alloc(d->cache_bytes);
    g->q = mt_dev_alloc(q_bytes);
    g->q_rope = mt_dev_alloc(r_bytes);
    g->out = mt_dev_alloc(g->out_bytes);
    g->lse = mt_dev_alloc(g->lse_bytes);
    g->ints = mt_dev_alloc(ints * 4);
    if (!g->cache || !g->q || !g->q_rope || !g->out || !g->lse || !g->ints) return 0;
    int32_t *p = g->ints;
    g->qo_indptr = p, p += n + 1;
    g->page_indptr = p, p += n + 1;
    g->page_indices = p, p += d->num_pages;
    g->last_len = p, p += n;
    g->seq_lens = p, p += n;
    g->positions = p;
    if (!mt_upload(g->cache, d->cache, d->cache_bytes) || !mt_upload(g->q, d->q, q_bytes) ||
        !mt_upload(g->q_rope, d->q_rope_dense, r_bytes) ||
        !mt_upload(g->qo_indptr, d->qo_indptr, (size_t)(n + 1) * 4) ||
        !mt_upload(g->page_indptr, d->page_indptr, (size_t)(n + 1) * 4) ||
        !mt_upload(g->page_indices, d->page_indices, (size_t)d->num_pages * 4) ||
        !mt_upload(g->last_len, d->last_len, (size_t)n * 4) ||
        !mt_upload(g->seq_lens, d->seq_lens, (size_t)n * 4) ||
        !mt_upload(g->positions, d->positions, (size_t)T * 4))
        return 0;
    const int32_t *arrays[6] = {g->qo_indptr, g->page_indptr, g->page_indices,
                                g->last_len,  g->seq_lens,    g->positions};
    mt_batch_fill(d, &g->batch, arrays);
    mt_layer_fill(d, g->cache, &g->kv, &g->layer);
    mt_query_tensors(d, g->q, g->q_rope, 1, &g->tq, &g->tqr);
    mt_tensor_make(&g->tout, g->out, AP_DTYPE_BF16, 1, 3, (int64_t[]){T, H, 512}, NULL);
    mt_tensor_make(&g->tlse, g->lse, AP_DTYPE_F32, 1, 2, (int64_t[]){T, H}, NULL);
    g->args = (ap_forward_args){.struct_size = sizeof(ap_forward_args),
                                .q = &g->tq.dl,
                                .out = &g->tout.dl,
                                .lse = &g->tlse.dl,
                                .q_rope = &g->tqr.dl};
    return 1;
}

static ap_status mt_forward(ap_instance *inst, const mt_decode_data *d, const ap_layer *layer,
                            const ap_forward_args *args, void *stream) {
    return d->max_q_len == 1 ? ap_instance_forward_decode(inst, layer, args, stream)
                             : ap_instance_forward_extend(inst, layer, args, stream);
}

/* Our out/lse (downloaded) as float64 and their errors against `want`. */
static void mt_compare(const mt_decode_data *d, const uint16_t *out, const float *lse,
                       const double *want_out, const double *want_lse, double *err_out,
                       double *err_lse, size_t *bad) {
    size_t n = (size_t)d->num_tokens * d->c->heads;
    double *got = malloc(n * 512 * sizeof(double));
    double *gl = malloc(n * sizeof(double));
    *err_out = *err_lse = INFINITY;
    *bad = n;
    if (got != NULL && gl != NULL) {
        size_t bad_o, bad_l;
        for (size_t i = 0; i < n * 512; i++) got[i] = mt_bf16_f(out[i]);
        for (size_t i = 0; i < n; i++) gl[i] = lse[i];
        *err_out = mt_rel_l2(got, want_out, n * 512, &bad_o);
        *err_lse = mt_rel_l2(gl, want_lse, n, &bad_l);
        *bad = bad_o + bad_l;
    }
    free(got);
    free(gl);
}

/* cpu_ref on the same inputs (host tensors); 0 when it does not serve MLA (yet). */
static int mt_cpu_ref_decode(mt_ctx *ctx, const mt_decode_data *d, double **out, double **lse) {
    ap_instance *ref = NULL;
    if (ap_instance_open(ctx->registry, "cpu_ref", &d->model, NULL, &ctx->cpu, &ref) != AP_OK)
        return 0;
    const int64_t T = d->num_tokens, H = d->c->heads;
    uint16_t *o16 = malloc((size_t)T * H * 512 * 2);
    float *l32 = malloc((size_t)T * H * 4);
    *out = malloc((size_t)T * H * 512 * sizeof(double));
    *lse = malloc((size_t)T * H * sizeof(double));
    int ok = o16 && l32 && *out && *lse;
    if (ok) {
        const int32_t *arrays[6] = {d->qo_indptr, d->page_indptr, d->page_indices,
                                    d->last_len,  d->seq_lens,    d->positions};
        ap_batch b;
        ap_kv_cache kv;
        ap_layer layer;
        mt_tensor tq, tqr, to, tl;
        mt_batch_fill(d, &b, arrays);
        mt_layer_fill(d, d->cache, &kv, &layer);
        mt_query_tensors(d, d->q, d->q_rope_dense, 0, &tq, &tqr);
        mt_tensor_make(&to, o16, AP_DTYPE_BF16, 0, 3, (int64_t[]){T, H, 512}, NULL);
        mt_tensor_make(&tl, l32, AP_DTYPE_F32, 0, 2, (int64_t[]){T, H}, NULL);
        ap_forward_args a = {
            .struct_size = sizeof a, .q = &tq.dl, .out = &to.dl, .lse = &tl.dl, .q_rope = &tqr.dl};
        ok = ap_instance_init_metadata(ref, &b, NULL) == AP_OK &&
             mt_forward(ref, d, &layer, &a, NULL) == AP_OK;
        if (!ok) printf("      cpu_ref failed: %s\n", ap_last_error());
        for (int64_t i = 0; ok && i < T * H * 512; i++) (*out)[i] = mt_bf16_f(o16[i]);
        for (int64_t i = 0; ok && i < T * H; i++) (*lse)[i] = l32[i];
    }
    free(o16);
    free(l32);
    ap_instance_close(ref);
    if (!ok) {
        free(*out);
        free(*lse);
        *out = *lse = NULL;
        return -1;
    }
    return 1;
}

/* Capture the planned forward in a graph, replay it on poisoned outputs: bit-equal to eager. */
static int mt_graph_check(mt_ctx *ctx, ap_instance *inst, const mt_decode_data *d, mt_decode_dev *g,
                          const uint16_t *eager_out, const float *eager_lse, char *detail,
                          size_t size) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int ok = ap_instance_cuda_graph_prepare(inst, d->num_seqs, ctx->stream) == AP_OK;
    if (!ok) snprintf(detail, size, "cuda_graph/1 failed: %s", ap_last_error());
    ok = ok && ap_instance_init_metadata(inst, &g->batch, ctx->stream) == AP_OK;
    ok = ok && mt_cuda_ok(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal),
                          "cudaStreamBeginCapture");
    if (ok) {
        ap_status st = mt_forward(inst, d, &g->layer, &g->args, ctx->stream);
        ok = mt_cuda_ok(cudaStreamEndCapture(ctx->stream, &graph), "cudaStreamEndCapture") &&
             st == AP_OK;
        if (st != AP_OK) snprintf(detail, size, "forward under capture: %s", ap_last_error());
    }
    ok = ok && mt_cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    ok = ok && mt_cuda_ok(cudaMemset(g->out, 0xff, g->out_bytes), "memset") &&
         mt_cuda_ok(cudaMemset(g->lse, 0xff, g->lse_bytes), "memset");
    for (int rep = 0; ok && rep < 2; rep++)
        ok = mt_cuda_ok(cudaGraphLaunch(exec, ctx->stream), "cudaGraphLaunch");
    ok = ok && mt_cuda_ok(cudaStreamSynchronize(ctx->stream), "sync after replay");
    uint16_t *out = malloc(g->out_bytes);
    float *lse = malloc(g->lse_bytes);
    ok = ok && out && lse && mt_download(out, g->out, g->out_bytes) &&
         mt_download(lse, g->lse, g->lse_bytes);
    if (ok &&
        (memcmp(out, eager_out, g->out_bytes) != 0 || memcmp(lse, eager_lse, g->lse_bytes) != 0)) {
        snprintf(detail, size, "graph replay differs from the eager call");
        ok = 0;
    }
    free(out);
    free(lse);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    return ok;
}

static void mt_decode_case_run(mt_ctx *ctx, const mt_decode_case *c, uint64_t seed) {
    mt_decode_data d;
    mt_decode_dev g;
    memset(&g, 0, sizeof g);
    ap_instance *inst = NULL;
    char detail[256] = "";
    int ok = mt_decode_data_make(c, &seed, &d);
    ap_option_kv extra[3];
    size_t num_extra = 0;
    if (c->split_grid)
        extra[num_extra++] =
            (ap_option_kv){"decode_schedule", c->split_grid == 2 ? "cut" : "split"};
    if (c->split_off) extra[num_extra++] = (ap_option_kv){"split_kv", "off"};
    if (c->stages == 3) extra[num_extra++] = (ap_option_kv){"decode_stages", "3"};
    if (c->stages == 2) extra[num_extra++] = (ap_option_kv){"decode_stages", "2"};
    ap_options opts = {.struct_size = sizeof opts,
                       .prefix_cache = AP_OPTION_UNSET,
                       .chunked_prefill = AP_OPTION_UNSET,
                       .cuda_graphs = AP_OPTION_UNSET,
                       .extra = extra,
                       .num_extra = num_extra};
    if (ok && ap_instance_open(ctx->registry, MT_BACKEND, &d.model, &opts, &ctx->device, &inst) !=
                  AP_OK) {
        snprintf(detail, sizeof detail, "open: %s", ap_last_error());
        ok = 0;
    }
    ok = ok && mt_decode_dev_make(&d, &g);
    ok = ok && mt_cuda_ok(cudaMemset(g.out, 0xff, g.out_bytes), "memset") &&
         mt_cuda_ok(cudaMemset(g.lse, 0xff, g.lse_bytes), "memset");
    if (ok && (ap_instance_init_metadata(inst, &g.batch, ctx->stream) != AP_OK ||
               mt_forward(inst, &d, &g.layer, &g.args, ctx->stream) != AP_OK)) {
        snprintf(detail, sizeof detail, "forward: %s", ap_last_error());
        ok = 0;
    }
    ok = ok && mt_cuda_ok(cudaStreamSynchronize(ctx->stream), "sync") &&
         mt_cuda_ok(cudaGetLastError(), "last error");
    uint16_t *out = malloc(g.out_bytes > 0 ? g.out_bytes : 1);
    float *lse = malloc(g.lse_bytes > 0 ? g.lse_bytes : 1);
    ok = ok && out && lse && mt_download(out, g.out, g.out_bytes) &&
         mt_download(lse, g.lse, g.lse_bytes);
    ok = ok && mt_decode_reference(&d);
    if (ok) {
        double eo, el;
        size_t bad;
        const double tol = c->kv_dtype == AP_DTYPE_FP8_E4M3 ? 5e-2 : 1e-2;
        mt_compare(&d, out, lse, d.ref_out, d.ref_lse, &eo, &el, &bad);
        int n = snprintf(detail, sizeof detail, "f64: out %.2e lse %.2e", eo, el);
        ok = bad == 0 && eo < tol && el < 1e-3;
        double *rout = NULL, *rlse = NULL;
        int have = mt_cpu_ref_decode(ctx, &d, &rout, &rlse);
        if (have > 0) {
            mt_compare(&d, out, lse, rout, rlse, &eo, &el, &bad);
            snprintf(detail + n, sizeof detail - (size_t)n, "; cpu_ref: out %.2e lse %.2e", eo, el);
            ok = ok && bad == 0 && eo < tol && el < 1e-3;
        } else {
            snprintf(detail + n, sizeof detail - (size_t)n, "; cpu_ref: %s",
                     have == 0 ? "no MLA (own f64 reference only)" : "FAILED");
            ok = ok && have == 0;
        }
        free(rout);
        free(rlse);
    }
    if (ok && c->graph) {
        char gd[160] = "";
        ok = mt_graph_check(ctx, inst, &d, &g, out, lse, gd, sizeof gd);
        size_t used = strlen(detail);
        snprintf(detail + used, sizeof detail - used, "; graph %s", ok ? "replay == eager" : gd);
    }
    printf("      %s: %d seqs, %d tokens, splits by batch, max len %d\n", c->name, d.num_seqs,
           d.num_tokens, d.max_len);
    mt_verdict(ctx, c->name, ok, detail);
    free(out);
    free(lse);
    ap_instance_close(inst);
    mt_decode_dev_free(&g);
    mt_decode_data_free(&d);
}

/* --cpu-only: the test's own float64 reference against cpu_ref on every decode case, no GPU.
 * It proves the references and the arguments the GPU run builds before any GPU judges them. */
static void mt_decode_selfcheck(mt_ctx *ctx, const mt_decode_case *c, uint64_t seed) {
    mt_decode_data d;
    char detail[200] = "";
    int ok = mt_decode_data_make(c, &seed, &d) && mt_decode_reference(&d);
    double *rout = NULL, *rlse = NULL;
    int have = ok ? mt_cpu_ref_decode(ctx, &d, &rout, &rlse) : -1;
    if (have > 0) {
        size_t n = (size_t)d.num_tokens * c->heads, bad_o, bad_l;
        double eo = mt_rel_l2(rout, d.ref_out, n * 512, &bad_o);
        double el = mt_rel_l2(rlse, d.ref_lse, n, &bad_l);
        snprintf(detail, sizeof detail, "cpu_ref vs f64: out %.2e lse %.2e", eo, el);
        ok = bad_o + bad_l == 0 && eo < 1e-2 && el < 1e-4;
    } else {
        snprintf(detail, sizeof detail, "cpu_ref: %s", have == 0 ? "refused" : "failed");
        ok = 0;
    }
    mt_verdict(ctx, c->name, ok, detail);
    free(rout);
    free(rlse);
    mt_decode_data_free(&d);
}

void mt_run_decode_selfcheck(mt_ctx *ctx, uint64_t seed) {
    for (size_t i = 0; i < sizeof mt_decode_cases / sizeof mt_decode_cases[0]; i++) {
        const mt_decode_case *c = &mt_decode_cases[i];
        if (!mt_selected(ctx, c->name, c->quick)) continue;
        uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
        mt_decode_selfcheck(ctx, c, gpu_rand_next(&s));
    }
}

void mt_run_decode_cases(mt_ctx *ctx, uint64_t seed) {
    for (size_t i = 0; i < sizeof mt_decode_cases / sizeof mt_decode_cases[0]; i++) {
        const mt_decode_case *c = &mt_decode_cases[i];
        if (!mt_selected(ctx, c->name, c->quick)) continue;
        uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
        mt_decode_case_run(ctx, c, gpu_rand_next(&s));
    }
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    mt_ctx ctx = {0};
    const char *dirs[8];
    size_t num_dirs = 0;
    uint64_t seed = 0;
    int have_seed = 0, cpu_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plugin-dir") == 0 && i + 1 < argc && num_dirs < 8)
            dirs[num_dirs++] = argv[++i];
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0), have_seed = 1;
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            ctx.filter = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            ctx.quick = 1;
        else if (strcmp(argv[i], "--cpu-only") == 0)
            cpu_only = 1;
        else {
            fprintf(stderr, "usage: gpu-mla [--quick] [--cpu-only] [--seed N] [--filter TEXT] "
                            "[--plugin-dir DIR]...\n");
            return 2;
        }
    }
    if (!have_seed) seed = gpu_rand_fresh_seed();
    printf("gpu-mla: %s vs cpu_ref, seed %llu\n", MT_BACKEND, (unsigned long long)seed);
    ap_registry_options ro = {
        .struct_size = sizeof ro, .search_dirs = dirs, .num_search_dirs = num_dirs};
    if (ap_registry_create(&ro, &ctx.registry) != AP_OK) {
        fprintf(stderr, "registry: %s\n", ap_last_error());
        return 1;
    }
    ap_registry_scan(ctx.registry);
    /* the backend and the reference, each said apart when missing (gpu_registry.h) */
    int code = gpu_backend_present(ctx.registry, MT_BACKEND);
    if (code < 0) code = gpu_reference_present(ctx.registry);
    if (code >= 0) {
        ap_registry_destroy(ctx.registry);
        return code;
    }
    ap_device_cpu(&ctx.cpu, "");
    if (cpu_only) {
        mt_run_append_selfcheck(&ctx, seed ^ 0x2222);
        mt_run_decode_selfcheck(&ctx, seed ^ 0x4444);
        mt_run_prefill_selfcheck(&ctx, seed ^ 0x5555);
        printf("summary: gpu-mla --cpu-only: %zu passed, %zu failed (seed %llu)\n", ctx.passed,
               ctx.failed, (unsigned long long)seed);
        ap_registry_destroy(ctx.registry);
        return ctx.failed > 0 ? 1 : 0;
    }
    code = gpu_device_usable(&ctx.device);
    if (code >= 0) {
        ap_registry_destroy(ctx.registry);
        return code;
    }
    if (!mt_cuda_ok(cudaSetDevice(0), "cudaSetDevice") ||
        !mt_cuda_ok(cudaStreamCreate(&ctx.stream), "cudaStreamCreate"))
        return 1;
    printf("device: %s, %d SMs\n", ctx.device.name, ctx.device.sm_count);
    mt_run_pack_cases(&ctx, seed ^ 0x1111);
    mt_run_append_cases(&ctx, seed ^ 0x2222);
    mt_run_merge_cases(&ctx, seed ^ 0x3333);
    mt_run_decode_cases(&ctx, seed ^ 0x4444);
    mt_run_prefill_cases(&ctx, seed ^ 0x5555);
    printf("summary: gpu-mla %s: %zu passed, %zu failed (seed %llu)\n", MT_BACKEND, ctx.passed,
           ctx.failed, (unsigned long long)seed);
    cudaStreamDestroy(ctx.stream);
    ap_registry_destroy(ctx.registry);
    return ctx.failed > 0 ? 1 : 0;
}
