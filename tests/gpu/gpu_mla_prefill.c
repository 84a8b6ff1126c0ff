/* gpu_mla_prefill.c: trtllm_mla's MHA-form prefill (ragged K/V, qk 192 / v 128, on the kit's
 * prefill kernel) against cpu_ref: causal over the new tokens, non-causal prefix chunks, bf16
 * and fp8 K/V, heads 16 and 128, ragged lengths, sequences the chunk does not reach. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/numeric/host_numeric.h"
#include "gpu_mla.h"
#include "gpu_rand.h"

#define MP_DQK 192
#define MP_DV 128
#define MP_MAX_SEQS 6

typedef struct mp_case {
    const char *name;
    int32_t heads;
    ap_dtype kv_dtype; /* bf16 or fp8_e4m3 (scaled) */
    int32_t causal;    /* kv_causal */
    int32_t num_seqs;
    int32_t q_lens[MP_MAX_SEQS];
    int32_t kv_lens[MP_MAX_SEQS]; /* causal: >= q_len (aligned to the end); chunk: any, 0 too */
    int quick;
} mp_case;

/* name, heads, kv dtype, causal, seqs, q_lens, kv_lens, quick */
static const mp_case mp_cases[] = {
    {"mla-prefill-causal-bf16-h16-1/17/300/1000",
     16,
     AP_DTYPE_BF16,
     1,
     4,
     {1, 17, 300, 1000},
     {1, 17, 300, 1000},
     1},
    {"mla-prefill-causal-bf16-h16-prefix",
     16,
     AP_DTYPE_BF16,
     1,
     3,
     {17, 300, 1},
     {90, 333, 1000},
     0},
    {"mla-prefill-causal-bf16-h128-1/17/300",
     128,
     AP_DTYPE_BF16,
     1,
     3,
     {1, 17, 300},
     {1, 17, 300},
     1},
    {"mla-prefill-causal-fp8-h16-1/17/300/1000",
     16,
     AP_DTYPE_FP8_E4M3,
     1,
     4,
     {1, 17, 300, 1000},
     {1, 17, 300, 1000},
     1},
    {"mla-prefill-causal-fp8-h128-17/300", 128, AP_DTYPE_FP8_E4M3, 1, 2, {17, 300}, {17, 300}, 0},
    {"mla-prefill-chunk-bf16-h16-empty-seqs",
     16,
     AP_DTYPE_BF16,
     0,
     5,
     {1, 17, 300, 1000, 17},
     {1000, 0, 300, 17, 0},
     1},
    {"mla-prefill-chunk-fp8-h16-empty-seqs",
     16,
     AP_DTYPE_FP8_E4M3,
     0,
     5,
     {1, 17, 300, 1000, 17},
     {1000, 0, 300, 17, 0},
     1},
    {"mla-prefill-chunk-bf16-h128",
     128,
     AP_DTYPE_BF16,
     0,
     4,
     {17, 100, 1, 5},
     {0, 300, 1000, 1},
     1},
    {"mla-prefill-chunk-fp8-h128",
     128,
     AP_DTYPE_FP8_E4M3,
     0,
     4,
     {17, 100, 1, 5},
     {0, 300, 1000, 1},
     0},
    {"mla-prefill-chunk-bf16-h16-all-empty", 16, AP_DTYPE_BF16, 0, 2, {17, 300}, {0, 0}, 0},
};

/* One case's host data (inputs in the dtypes the forward reads) and the batch arrays. */
typedef struct mp_data {
    const mp_case *c;
    int32_t qo[MP_MAX_SEQS + 1], kv[MP_MAX_SEQS + 1], seq_lens[MP_MAX_SEQS];
    int64_t T, KV, H;
    uint16_t *q;    /* [T][H][192] bf16 */
    void *k, *v;    /* [KV][H][192] / [KV][H][128], bf16 or fp8 bytes */
    size_t kv_elem; /* 2 or 1 */
    float k_scale, v_scale;
} mp_data;

static void mp_data_free(mp_data *d) {
    free(d->q);
    free(d->k);
    free(d->v);
}

/* Random values in [-1, 1] (K and V stored / scale in fp8, so the scales are exercised). */
static void mp_fill(void *dst, size_t n, ap_dtype dtype, float scale, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) {
        const float x = gpu_rand_uniform(rng, -1.f, 1.f);
        if (dtype == AP_DTYPE_FP8_E4M3)
            ((uint8_t *)dst)[i] = ap_float_to_fp8_e4m3(x / scale);
        else
            ((uint16_t *)dst)[i] = mt_bf16(x);
    }
}

static int mp_data_make(const mp_case *c, uint64_t *rng, mp_data *d) {
    memset(d, 0, sizeof *d);
    d->c = c;
    d->H = c->heads;
    for (int i = 0; i < c->num_seqs; i++) {
        d->qo[i + 1] = d->qo[i] + c->q_lens[i];
        d->kv[i + 1] = d->kv[i] + c->kv_lens[i];
        d->seq_lens[i] = c->causal ? c->kv_lens[i] : c->kv_lens[i] + c->q_lens[i];
    }
    d->T = d->qo[c->num_seqs];
    d->KV = d->kv[c->num_seqs];
    const int fp8 = c->kv_dtype == AP_DTYPE_FP8_E4M3;
    d->kv_elem = fp8 ? 1 : 2;
    d->k_scale = fp8 ? 1.f / 256.f : 1.f;
    d->v_scale = fp8 ? 1.f / 300.f : 1.f;
    d->q = malloc((size_t)d->T * d->H * MP_DQK * 2);
    d->k = malloc((size_t)(d->KV > 0 ? d->KV : 1) * d->H * MP_DQK * d->kv_elem);
    d->v = malloc((size_t)(d->KV > 0 ? d->KV : 1) * d->H * MP_DV * d->kv_elem);
    if (d->q == NULL || d->k == NULL || d->v == NULL) return 0;
    /* q scaled so the logits (sm_scale 1/sqrt(192)) spread over a few units */
    for (size_t i = 0; i < (size_t)d->T * d->H * MP_DQK; i++)
        d->q[i] = mt_bf16(gpu_rand_uniform(rng, -2.f, 2.f));
    mp_fill(d->k, (size_t)d->KV * d->H * MP_DQK, c->kv_dtype, d->k_scale, rng);
    mp_fill(d->v, (size_t)d->KV * d->H * MP_DV, c->kv_dtype, d->v_scale, rng);
    return 1;
}

/* The batch over `qo` / `kv` / `seq_lens` (device or host pointers) with host mirrors. */
static ap_batch mp_batch(const mp_data *d, const int32_t *qo, const int32_t *kv,
                         const int32_t *seq_lens) {
    int32_t max_q = 0, max_seq = 0;
    for (int i = 0; i < d->c->num_seqs; i++) {
        max_q = d->c->q_lens[i] > max_q ? d->c->q_lens[i] : max_q;
        max_seq = d->seq_lens[i] > max_seq ? d->seq_lens[i] : max_seq;
    }
    return (ap_batch){.struct_size = sizeof(ap_batch),
                      .mode = AP_MODE_EXTEND,
                      .num_seqs = d->c->num_seqs,
                      .num_tokens = (int32_t)d->T,
                      .max_q_len = max_q,
                      .max_seq_len = max_seq,
                      .qo_indptr = qo,
                      .seq_lens = seq_lens,
                      .qo_indptr_host = d->qo,
                      .seq_lens_host = d->seq_lens,
                      .kv_indptr = kv,
                      .kv_indptr_host = d->kv,
                      .num_kv_tokens = (int32_t)d->KV,
                      .kv_causal = d->c->causal};
}

/* Plans and runs one forward of `d` on `inst` over the given (host or device) buffers. */
static ap_status mp_forward(ap_instance *inst, const mp_data *d, const ap_batch *batch, void *q,
                            void *k, void *v, void *out, float *lse, int on_device,
                            cudaStream_t stream) {
    mt_tensor tq, tk, tv, to, tl;
    mt_tensor_make(&tq, q, AP_DTYPE_BF16, on_device, 3, (int64_t[]){d->T, d->H, MP_DQK}, NULL);
    mt_tensor_make(&tk, k, d->c->kv_dtype, on_device, 3, (int64_t[]){d->KV, d->H, MP_DQK}, NULL);
    mt_tensor_make(&tv, v, d->c->kv_dtype, on_device, 3, (int64_t[]){d->KV, d->H, MP_DV}, NULL);
    mt_tensor_make(&to, out, AP_DTYPE_BF16, on_device, 3, (int64_t[]){d->T, d->H, MP_DV}, NULL);
    mt_tensor_make(&tl, lse, AP_DTYPE_F32, on_device, 2, (int64_t[]){d->T, d->H}, NULL);
    ap_layer layer = {.struct_size = sizeof layer,
                      .sm_scale = 1.f / sqrtf((float)MP_DQK),
                      .k_scale = d->k_scale,
                      .v_scale = d->v_scale,
                      .window_left = -1};
    ap_forward_args a = {.struct_size = sizeof a,
                         .q = &tq.dl,
                         .k = &tk.dl,
                         .v = &tv.dl,
                         .out = &to.dl,
                         .lse = &tl.dl};
    ap_status st = ap_instance_init_metadata(inst, batch, stream);
    if (st == AP_OK) st = ap_instance_forward_extend(inst, &layer, &a, stream);
    return st;
}

/* cpu_ref's out (as double) and lse on the same inputs. */
static int mp_reference(mt_ctx *ctx, const mp_data *d, double *out, float *lse) {
    ap_model model = mt_mla_model((int32_t)d->H, 64, AP_DTYPE_BF16);
    ap_instance *ref = NULL;
    if (ap_instance_open(ctx->registry, "cpu_ref", &model, NULL, &ctx->cpu, &ref) != AP_OK) {
        printf("      cpu_ref: %s\n", ap_last_error());
        return 0;
    }
    const size_t n = (size_t)d->T * d->H * MP_DV;
    uint16_t *o16 = malloc(n * 2);
    ap_batch b = mp_batch(d, d->qo, d->kv, d->seq_lens);
    int ok = o16 != NULL && mp_forward(ref, d, &b, d->q, d->k, d->v, o16, lse, 0, NULL) == AP_OK;
    if (!ok) printf("      cpu_ref failed: %s\n", ap_last_error());
    for (size_t i = 0; ok && i < n; i++) out[i] = mt_bf16_f(o16[i]);
    free(o16);
    ap_instance_close(ref);
    return ok;
}

/* Our out and lse against the reference: rel L2 of out, and of lse over the rows that saw a key;
 * a row that saw none must have out exactly 0 and lse -inf. Returns the worst error. */
static double mp_compare(const mp_data *d, const uint16_t *out, const float *lse,
                         const double *want_out, const float *want_lse, size_t *bad,
                         double *lse_err) {
    const size_t rows = (size_t)d->T * d->H, n = rows * MP_DV;
    double *got = malloc(n * sizeof(double));
    double *gl = malloc(rows * sizeof(double)), *wl = malloc(rows * sizeof(double));
    if (got == NULL || gl == NULL || wl == NULL) {
        free(got), free(gl), free(wl);
        *bad = n;
        return INFINITY;
    }
    size_t finite = 0;
    *bad = 0;
    for (size_t i = 0; i < n; i++) got[i] = mt_bf16_f(out[i]);
    for (size_t r = 0; r < rows; r++) {
        if (isinf(want_lse[r]) && want_lse[r] < 0) {
            int zero = lse[r] == -INFINITY;
            for (size_t e = 0; e < MP_DV; e++) zero = zero && got[r * MP_DV + e] == 0.0;
            *bad += !zero;
            continue;
        }
        gl[finite] = lse[r];
        wl[finite++] = want_lse[r];
    }
    size_t bad_out = 0, bad_lse = 0;
    const double err = mt_rel_l2(got, want_out, n, &bad_out);
    *lse_err = finite > 0 ? mt_rel_l2(gl, wl, finite, &bad_lse) : 0.0;
    *bad += bad_out + bad_lse;
    free(got), free(gl), free(wl);
    return err;
}

/* Device copies of one case's inputs and poisoned outputs. */
typedef struct mp_dev {
    void *q, *k, *v, *out;
    float *lse;
    int32_t *qo, *kv, *seq_lens;
} mp_dev;

static void mp_dev_free(mp_dev *g) {
    void *all[] = {g->q, g->k, g->v, g->out, g->lse, g->qo, g->kv, g->seq_lens};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cudaFree(all[i]);
}

static int mp_dev_make(const mp_data *d, mp_dev *g) {
    const size_t qb = (size_t)d->T * d->H * MP_DQK * 2, ob = (size_t)d->T * d->H * MP_DV * 2;
    const size_t kb = (size_t)d->KV * d->H * MP_DQK * d->kv_elem;
    const size_t vb = (size_t)d->KV * d->H * MP_DV * d->kv_elem;
    const size_t ib = (size_t)(d->c->num_seqs + 1) * sizeof(int32_t);
    memset(g, 0, sizeof *g);
    g->q = mt_dev_alloc(qb), g->k = mt_dev_alloc(kb), g->v = mt_dev_alloc(vb);
    g->out = mt_dev_alloc(ob), g->lse = mt_dev_alloc((size_t)d->T * d->H * 4);
    g->qo = mt_dev_alloc(ib), g->kv = mt_dev_alloc(ib), g->seq_lens = mt_dev_alloc(ib);
    return g->q && g->k && g->v && g->out && g->lse && g->qo && g->kv && g->seq_lens &&
           mt_upload(g->q, d->q, qb) && (kb == 0 || mt_upload(g->k, d->k, kb)) &&
           (vb == 0 || mt_upload(g->v, d->v, vb)) && mt_upload(g->qo, d->qo, ib) &&
           mt_upload(g->kv, d->kv, ib) &&
           mt_upload(g->seq_lens, d->seq_lens, ib - sizeof(int32_t)) &&
           mt_cuda_ok(cudaMemset(g->out, 0xff, ob), "poison out") &&
           mt_cuda_ok(cudaMemset(g->lse, 0xff, (size_t)d->T * d->H * 4), "poison lse");
}

static void mp_case_run(mt_ctx *ctx, const mp_case *c, uint64_t seed) {
    char detail[256] = "";
    mp_data d;
    mp_dev g;
    memset(&g, 0, sizeof g);
    uint64_t rng = seed;
    ap_instance *inst = NULL;
    double *want = NULL;
    float *want_lse = NULL, *lse = NULL;
    uint16_t *out = NULL;
    int ok = mp_data_make(c, &rng, &d);
    const size_t n_rows = (size_t)d.T * d.H, n_out = n_rows * MP_DV;
    if (ok) {
        want = malloc(n_out * sizeof(double));
        want_lse = malloc(n_rows * sizeof(float));
        lse = malloc(n_rows * sizeof(float));
        out = malloc(n_out * 2);
        ok = want && want_lse && lse && out && mp_reference(ctx, &d, want, want_lse);
        if (!ok) snprintf(detail, sizeof detail, "no reference");
    }
    ap_model model = mt_mla_model(c->heads, 64, AP_DTYPE_BF16);
    if (ok &&
        ap_instance_open(ctx->registry, MT_BACKEND, &model, NULL, &ctx->device, &inst) != AP_OK) {
        snprintf(detail, sizeof detail, "open: %s", ap_last_error());
        ok = 0;
    }
    ok = ok && mp_dev_make(&d, &g);
    if (ok) {
        ap_batch b = mp_batch(&d, g.qo, g.kv, g.seq_lens);
        ap_status st = mp_forward(inst, &d, &b, g.q, g.k, g.v, g.out, g.lse, 1, ctx->stream);
        if (st != AP_OK) snprintf(detail, sizeof detail, "forward: %s", ap_last_error());
        ok = st == AP_OK && mt_cuda_ok(cudaStreamSynchronize(ctx->stream), "sync") &&
             mt_download(out, g.out, n_out * 2) && mt_download(lse, g.lse, n_rows * 4);
    }
    if (ok) {
        size_t bad = 0;
        double lse_err = 0.0;
        const double err = mp_compare(&d, out, lse, want, want_lse, &bad, &lse_err);
        const double tol = c->kv_dtype == AP_DTYPE_FP8_E4M3 ? 5e-2 : 1e-2;
        ok = bad == 0 && err < tol && lse_err < 1e-3;
        snprintf(detail, sizeof detail, "rel L2 out %.2e lse %.2e, %zu bad (T %lld, KV %lld)", err,
                 lse_err, bad, (long long)d.T, (long long)d.KV);
    }
    mt_verdict(ctx, c->name, ok, detail);
    ap_instance_close(inst);
    mp_dev_free(&g);
    mp_data_free(&d);
    free(want), free(want_lse), free(lse), free(out);
}

void mt_run_prefill_cases(mt_ctx *ctx, uint64_t seed) {
    for (size_t i = 0; i < sizeof mp_cases / sizeof mp_cases[0]; i++) {
        if (!mt_selected(ctx, mp_cases[i].name, mp_cases[i].quick)) continue;
        mp_case_run(ctx, &mp_cases[i], seed + i);
    }
}

/* --cpu-only: cpu_ref accepts every case's batch and tensors (the core's checks of the ragged
 * source), gives -inf exactly for rows without keys, and finite values elsewhere. */
void mt_run_prefill_selfcheck(mt_ctx *ctx, uint64_t seed) {
    for (size_t i = 0; i < sizeof mp_cases / sizeof mp_cases[0]; i++) {
        const mp_case *c = &mp_cases[i];
        if (!mt_selected(ctx, c->name, 1)) continue;
        uint64_t rng = seed + i;
        mp_data d;
        int ok = mp_data_make(c, &rng, &d);
        const size_t rows = (size_t)d.T * d.H;
        double *out = malloc(rows * MP_DV * sizeof(double));
        float *lse = malloc(rows * sizeof(float));
        ok = ok && out && lse && mp_reference(ctx, &d, out, lse);
        size_t bad = 0;
        for (int s = 0; ok && s < c->num_seqs; s++)
            for (size_t r = (size_t)d.qo[s] * d.H; r < (size_t)d.qo[s + 1] * d.H; r++) {
                const int empty = c->kv_lens[s] == 0;
                bad += empty ? !(isinf(lse[r]) && lse[r] < 0) : !isfinite(lse[r]);
                for (size_t e = 0; e < MP_DV; e++)
                    bad += empty ? out[r * MP_DV + e] != 0.0 : !isfinite(out[r * MP_DV + e]);
            }
        char detail[96];
        snprintf(detail, sizeof detail, "cpu_ref: %zu bad of %zu rows", bad, rows);
        mt_verdict(ctx, c->name, ok && bad == 0, detail);
        free(out);
        free(lse);
        mp_data_free(&d);
    }
}
