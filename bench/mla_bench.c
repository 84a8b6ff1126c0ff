/* mla_bench.c: mla-bench, trtllm_mla timed through the core API the way a host calls it:
 * absorbed decode (and MTP) over a shuffled paged latent cache, the prefix-chunk pack, the
 * fused MLA append, and the MHA-form prefill (ragged K/V, qk 192 / v 128). CUDA events, warm-up, median of --runs; inputs rotated past the L2.
 *   mla-bench [--runs N] [--json FILE] [--plugin-dir DIR]... */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"
#include "backends/numeric/host_numeric.h"
#include "bench/bench_fill.h"
#include "tests/common/test_model.h"
#include "tests/gpu/gpu_rand.h"

#define MB_L2_FLUSH (200ull << 20) /* rotate input sets until a pass reads this much */
#define MB_MAX_SETS 8

static int mb_runs = 100;
static FILE *mb_json;
static int mb_first_row = 1;
static const char *mb_only; /* --only TEXT: the cases whose name contains it */

static int mb_skip(const char *name) {
    return mb_only != NULL && strstr(name, mb_only) == NULL;
}

static int mb_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    return 0;
}

static void mb_tensor(DLTensor *t, int64_t *shape, void *data, DLDataType dt, int ndim) {
    memset(t, 0, sizeof *t);
    t->data = data;
    t->device.device_type = kDLCUDA;
    t->ndim = ndim;
    t->dtype = dt;
    t->shape = shape;
}

static const DLDataType mb_bf16 = {kDLBfloat, 16, 1}, mb_f32 = {kDLFloat, 32, 1},
                        mb_i32 = {kDLInt, 32, 1}, mb_fp8 = {AP_DL_FLOAT8_E4M3FN, 8, 1};

/* Fill n bytes of device memory with random bf16 in [-1, 1) (or random fp8 codes). */
static int mb_fill(void *dev, size_t bytes, int fp8, uint64_t *rng) {
    size_t n = fp8 ? bytes : bytes / 2;
    uint8_t *host = malloc(bytes);
    if (host == NULL) return 0;
    for (size_t i = 0; i < n; i++) {
        float x = gpu_rand_uniform(rng, -1.f, 1.f);
        if (fp8)
            host[i] = ap_float_to_fp8_e4m3(x * 100.f);
        else
            ((uint16_t *)host)[i] = ap_float_to_bf16(x);
    }
    int ok = mb_ok(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "fill");
    free(host);
    return ok;
}

/* Median ms of `runs` calls of fn(set), timed one by one with events, sets rotated. With `sleep`,
 * each call is enqueued behind ~1.3 ms of GPU sleep, so the host's cost of the call (core checks,
 * glue, launches) is hidden as in FlashInfer's fi_bench.py; without, the GPU is idle when the call
 * starts and the timing counts that cost (bench_event_median). */
static double mb_time(bench_event_fn fn, void *ctx, int sets, double *min_ms, int sleep) {
    return bench_event_median(fn, ctx, sets, mb_runs, 10 + sets, sleep ? BENCH_SLEEP_CYCLES : 0,
                              min_ms);
}

/* Mean ms per call of `calls` back-to-back calls (the small pack: host launch cost included). */
static double mb_time_loop(bench_event_fn fn, void *ctx, int calls) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 200; i++) fn(ctx, 0);
    cudaDeviceSynchronize();
    cudaEventRecord(e0, 0);
    for (int i = 0; i < calls; i++)
        if (!fn(ctx, 0)) return -1;
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms / calls;
}

static void mb_row(const char *kind, const char *name, double ms, double min_ms, double gbps,
                   double tflops) {
    printf("%-6s %-46s %9.4f ms (min %.4f)  %8.1f GB/s  %7.1f TFLOP/s\n", kind, name, ms, min_ms,
           gbps, tflops);
    if (mb_json != NULL) {
        fprintf(mb_json,
                "%s\n  {\"kind\": \"%s\", \"name\": \"%s\", \"ms\": %.5f, \"min_ms\": %.5f, "
                "\"GBps\": %.1f, \"TFLOPs\": %.2f}",
                mb_first_row ? "" : ",", kind, name, ms, min_ms, gbps, tflops);
        mb_first_row = 0;
    }
    fflush(stdout);
}

/* ---- decode ----------------------------------------------------------------------------------- */

typedef struct mb_decode {
    ap_instance *inst;
    int B, L, H, q_len, sets;
    ap_dtype kv;
    void *cache[MB_MAX_SETS];
    void *q, *qr, *out, *lse;
    int32_t *ints;
    int64_t sq[3], sr[3], so[3], sl[2];
    DLTensor tq, tr, to, tl;
    ap_kv_cache kvc[MB_MAX_SETS];
    ap_layer layer[MB_MAX_SETS];
    ap_batch batch;
    ap_forward_args args;
} mb_decode;

static int mb_decode_call(void *ctx, int set) {
    mb_decode *d = ctx;
    ap_status st = d->q_len == 1 ? ap_instance_forward_decode(d->inst, &d->layer[set], &d->args, 0)
                                 : ap_instance_forward_extend(d->inst, &d->layer[set], &d->args, 0);
    if (st != AP_OK) fprintf(stderr, "forward: %s\n", ap_last_error());
    return st == AP_OK;
}

/* DeepSeek-V3's MLA model (tests/common/test_model.h) with a case's heads, cache, page size and
 * token budget; one layer, sequences up to 65536 tokens. */
static ap_model mb_model(int32_t heads, ap_dtype kv_dtype, int32_t page_size, int32_t max_tokens) {
    ap_model m = ap_test_mla_model("deepseek-ai/DeepSeek-V3", heads);
    m.kv_dtype = kv_dtype;
    m.page_size = page_size;
    m.num_layers = 1;
    m.max_tokens = max_tokens;
    m.max_kv_len = 65536;
    return m;
}

/* stages > 0: option decode_stages forced; sleep: each timed call behind a GPU sleep (the host's
 * cost of the call hidden, as FlashInfer's timing does), a row of its own named "... sleep".
 * long_len > 0: sequence 0 is that long, the others L (a skewed batch, "... long N");
 * schedule: option decode_schedule (NULL: unset), named in the row. */
static void mb_decode_case(ap_registry *reg, const ap_device *dev, int B, int L, int H, int page,
                           ap_dtype kvd, int q_len, int stages, int sleep, int long_len,
                           const char *schedule, uint64_t *rng) {
    mb_decode d;
    memset(&d, 0, sizeof d);
    d.B = B, d.L = L, d.H = H, d.q_len = q_len, d.kv = kvd;
    ap_model m = mb_model(H, kvd, page, 16384);
    char name[96];
    snprintf(name, sizeof name, "decode B%d L%d H%d page%d %s", B, L, H, page,
             kvd == AP_DTYPE_FP8_E4M3 ? "fp8" : "bf16");
    if (q_len > 1)
        snprintf(name, sizeof name, "decode B%d L%d H%d page%d %s MTP q%d", B, L, H, page,
                 kvd == AP_DTYPE_FP8_E4M3 ? "fp8" : "bf16", q_len);
    if (long_len > 0)
        snprintf(name + strlen(name), sizeof name - strlen(name), " long %d", long_len);
    if (schedule != NULL)
        snprintf(name + strlen(name), sizeof name - strlen(name), " %s", schedule);
    if (stages > 0) snprintf(name + strlen(name), sizeof name - strlen(name), " %dstage", stages);
    if (sleep) snprintf(name + strlen(name), sizeof name - strlen(name), " sleep");
    if (mb_skip(name)) return;
    char stages_text[8];
    snprintf(stages_text, sizeof stages_text, "%d", stages);
    ap_option_kv forced[2];
    size_t num_forced = 0;
    if (stages > 0) forced[num_forced++] = (ap_option_kv){"decode_stages", stages_text};
    if (schedule != NULL) forced[num_forced++] = (ap_option_kv){"decode_schedule", schedule};
    ap_options opts = {.struct_size = sizeof opts,
                       .prefix_cache = AP_OPTION_UNSET,
                       .chunked_prefill = AP_OPTION_UNSET,
                       .cuda_graphs = AP_OPTION_UNSET,
                       .extra = forced,
                       .num_extra = num_forced};
    if (ap_instance_open(reg, "trtllm_mla", &m, &opts, dev, &d.inst) != AP_OK) {
        printf("%s: open: %s\n", name, ap_last_error());
        return;
    }
    const int pages_per = L / page, T = B * q_len;
    const int long_pages = long_len > 0 ? long_len / page : pages_per; /* sequence 0's */
    const int pages_all = long_pages + (B - 1) * pages_per;
    const size_t elem = kvd == AP_DTYPE_FP8_E4M3 ? 1 : 2;
    const size_t set_bytes = (size_t)pages_all * page * 576 * elem;
    d.sets = (int)((MB_L2_FLUSH + set_bytes - 1) / set_bytes);
    if (d.sets > MB_MAX_SETS) d.sets = MB_MAX_SETS;
    if (d.sets < 1) d.sets = 1;
    int ok = 1;
    for (int s = 0; s < d.sets && ok; s++)
        ok = mb_ok(cudaMalloc(&d.cache[s], set_bytes), "cache") &&
             mb_fill(d.cache[s], set_bytes, elem == 1, rng);
    ok = ok && mb_ok(cudaMalloc(&d.q, (size_t)T * H * 512 * 2), "q") &&
         mb_ok(cudaMalloc(&d.qr, (size_t)T * H * 64 * 2), "q") &&
         mb_ok(cudaMalloc(&d.out, (size_t)T * H * 512 * 2), "out") &&
         mb_ok(cudaMalloc(&d.lse, (size_t)T * H * 4), "lse") &&
         mb_fill(d.q, (size_t)T * H * 512 * 2, 0, rng) &&
         mb_fill(d.qr, (size_t)T * H * 64 * 2, 0, rng);
    /* batch arrays: pages shuffled */
    int n_ints = (B + 1) * 2 + pages_all + 2 * B + T;
    int32_t *h = calloc((size_t)n_ints, 4);
    int32_t *qo = h, *pi = qo + B + 1, *idx = pi + B + 1, *last = idx + pages_all, *lens = last + B,
            *pos = lens + B;
    for (int i = 0; i <= B; i++)
        qo[i] = i * q_len, pi[i] = i == 0 ? 0 : long_pages + (i - 1) * pages_per;
    for (int i = 0; i < pages_all; i++) idx[i] = i;
    for (int i = pages_all - 1; i > 0; i--) {
        int j = (int)gpu_rand_below(rng, (uint32_t)i + 1), t = idx[i];
        idx[i] = idx[j], idx[j] = t;
    }
    for (int i = 0; i < B; i++) {
        last[i] = page, lens[i] = i == 0 ? long_pages * page : L;
        for (int j = 0; j < q_len; j++) pos[i * q_len + j] = lens[i] - q_len + j;
    }
    ok = ok && mb_ok(cudaMalloc((void **)&d.ints, (size_t)n_ints * 4), "ints") &&
         mb_ok(cudaMemcpy(d.ints, h, (size_t)n_ints * 4, cudaMemcpyHostToDevice), "ints");
    if (!ok) goto out;
    int32_t *g = d.ints;
    d.batch = (ap_batch){.struct_size = sizeof(ap_batch),
                         .mode = q_len == 1 ? AP_MODE_DECODE : AP_MODE_EXTEND,
                         .num_seqs = B,
                         .num_tokens = T,
                         .max_q_len = q_len,
                         .max_seq_len = lens[0] > L ? lens[0] : L,
                         .num_pages_total = pages_all,
                         .qo_indptr = g,
                         .kv_page_indptr = g + B + 1,
                         .kv_page_indices = g + 2 * (B + 1),
                         .kv_last_page_len = g + 2 * (B + 1) + pages_all,
                         .seq_lens = g + 2 * (B + 1) + pages_all + B,
                         .positions = g + 2 * (B + 1) + pages_all + 2 * B,
                         .qo_indptr_host = qo,
                         .kv_page_indptr_host = pi,
                         .kv_page_indices_host = idx,
                         .kv_last_page_len_host = last,
                         .seq_lens_host = lens,
                         .positions_host = pos};
    for (int s = 0; s < d.sets; s++) {
        d.kvc[s] = (ap_kv_cache){.struct_size = sizeof(ap_kv_cache),
                                 .layout = AP_KV_LAYOUT_NHD,
                                 .dtype = kvd,
                                 .page_size = page,
                                 .num_pages = pages_all,
                                 .num_kv_heads = 1,
                                 .head_dim_qk = 576,
                                 .head_dim_v = 512,
                                 .k_pages = d.cache[s]};
        d.layer[s] = (ap_layer){.struct_size = sizeof(ap_layer),
                                .sm_scale = 0.0723f,
                                .k_scale = 0.01f,
                                .v_scale = 0.01f,
                                .window_left = -1,
                                .kv = &d.kvc[s]};
    }
    d.sq[0] = T, d.sq[1] = H, d.sq[2] = 512;
    d.sr[0] = T, d.sr[1] = H, d.sr[2] = 64;
    d.so[0] = T, d.so[1] = H, d.so[2] = 512;
    d.sl[0] = T, d.sl[1] = H;
    mb_tensor(&d.tq, d.sq, d.q, mb_bf16, 3);
    mb_tensor(&d.tr, d.sr, d.qr, mb_bf16, 3);
    mb_tensor(&d.to, d.so, d.out, mb_bf16, 3);
    mb_tensor(&d.tl, d.sl, d.lse, mb_f32, 2);
    d.args = (ap_forward_args){.struct_size = sizeof(ap_forward_args),
                               .q = &d.tq,
                               .out = &d.to,
                               .lse = &d.tl,
                               .q_rope = &d.tr};
    if (ap_instance_init_metadata(d.inst, &d.batch, 0) != AP_OK) {
        printf("%s: plan: %s\n", name, ap_last_error());
        goto out;
    }
    double mn = 0, ms = mb_time(mb_decode_call, &d, d.sets, &mn, sleep);
    if (ms > 0) {
        const double tokens = (double)pages_all * page; /* every length is whole pages */
        double bytes = tokens * 576 * elem;
        double flops = (double)q_len * H * tokens * (576 + 512) * 2;
        mb_row("decode", name, ms, mn, bytes / (ms * 1e6), flops / (ms * 1e9));
    }
out:
    free(h);
    for (int s = 0; s < d.sets; s++) cudaFree(d.cache[s]);
    cudaFree(d.q), cudaFree(d.qr), cudaFree(d.out), cudaFree(d.lse), cudaFree(d.ints);
    ap_instance_close(d.inst);
}

/* ---- pack ------------------------------------------------------------------------------------- */

typedef struct mb_pack {
    ap_instance *inst;
    DLTensor kn, pe, v, ko, vo;
    int64_t skn[3], spe[2], sv[3], sko[3], svo[3];
    ap_pack_kv_args args;
} mb_pack;

static int mb_pack_call(void *ctx, int set) {
    (void)set;
    mb_pack *p = ctx;
    ap_status st = ap_instance_pack_prefix_chunk_kv(p->inst, &p->args, 0);
    if (st != AP_OK) fprintf(stderr, "pack: %s\n", ap_last_error());
    return st == AP_OK;
}

static void mb_pack_case(ap_registry *reg, const ap_device *dev, int T, int H, uint64_t *rng) {
    mb_pack p;
    memset(&p, 0, sizeof p);
    char name[96];
    snprintf(name, sizeof name, "pack s=%d H%d (128/64/128) bf16->fp8", T, H);
    if (mb_skip(name)) return;
    ap_model m = mb_model(H, AP_DTYPE_BF16, 64, 16384);
    if (ap_instance_open(reg, "trtllm_mla", &m, NULL, dev, &p.inst) != AP_OK) {
        printf("pack: open: %s\n", ap_last_error());
        return;
    }
    void *kn = NULL, *pe = NULL, *v = NULL, *ko = NULL, *vo = NULL;
    size_t nkn = (size_t)T * H * 128;
    int ok = mb_ok(cudaMalloc(&kn, nkn * 2), "kn") && mb_ok(cudaMalloc(&v, nkn * 2), "v") &&
             mb_ok(cudaMalloc(&pe, (size_t)T * 64 * 2), "pe") &&
             mb_ok(cudaMalloc(&ko, (size_t)T * H * 192), "ko") &&
             mb_ok(cudaMalloc(&vo, nkn), "vo") && mb_fill(kn, nkn * 2, 0, rng) &&
             mb_fill(v, nkn * 2, 0, rng) && mb_fill(pe, (size_t)T * 64 * 2, 0, rng);
    if (ok) {
        p.skn[0] = T, p.skn[1] = H, p.skn[2] = 128;
        p.spe[0] = T, p.spe[1] = 64;
        p.sv[0] = T, p.sv[1] = H, p.sv[2] = 128;
        p.sko[0] = T, p.sko[1] = H, p.sko[2] = 192;
        p.svo[0] = T, p.svo[1] = H, p.svo[2] = 128;
        mb_tensor(&p.kn, p.skn, kn, mb_bf16, 3);
        mb_tensor(&p.pe, p.spe, pe, mb_bf16, 2);
        mb_tensor(&p.v, p.sv, v, mb_bf16, 3);
        mb_tensor(&p.ko, p.sko, ko, mb_fp8, 3);
        mb_tensor(&p.vo, p.svo, vo, mb_fp8, 3);
        p.args = (ap_pack_kv_args){.struct_size = sizeof(ap_pack_kv_args),
                                   .k_nope = &p.kn,
                                   .k_pe = &p.pe,
                                   .v = &p.v,
                                   .k_out = &p.ko,
                                   .v_out = &p.vo,
                                   .k_scale = 0.02f,
                                   .v_scale = 0.03f};
        double bytes = (double)T * H * 128 * 2 * 2 + (double)T * 64 * 2 + (double)T * H * 320;
        double mn = 0, ms;
        if (T <= 64) {
            ms = mb_time_loop(mb_pack_call, &p, 2000);
            mn = ms;
        } else {
            ms = mb_time(mb_pack_call, &p, 1, &mn, 0);
        }
        if (ms > 0) mb_row("pack", name, ms, mn, bytes / (ms * 1e6), 0);
    }
    cudaFree(kn), cudaFree(pe), cudaFree(v), cudaFree(ko), cudaFree(vo);
    ap_instance_close(p.inst);
}

/* ---- MHA-form prefill --------------------------------------------------------------------------- */

/* B sequences of S new tokens over H heads, qk 192 / v 128, the ragged K/V source: causal over
 * the new tokens' own K/V (kv_indptr = qo_indptr), or a packed prefix chunk of S keys without a
 * mask. Planned once (init_metadata), forward_extend timed. TFLOP/s count 2 * H * S * S * 320
 * per sequence, halved when causal (as the torch peer counts it). */
typedef struct mb_prefill {
    ap_instance *inst;
    ap_layer layer;
    ap_forward_args args;
    DLTensor q, k, v, out, lse;
    int64_t sq[3], sk[3], sv[3], so[3], sl[2];
} mb_prefill;

static int mb_prefill_call(void *ctx, int set) {
    (void)set;
    mb_prefill *p = ctx;
    ap_status st = ap_instance_forward_extend(p->inst, &p->layer, &p->args, 0);
    if (st != AP_OK) fprintf(stderr, "prefill: %s\n", ap_last_error());
    return st == AP_OK;
}

static int mb_prefill_batch(int B, int S, int causal, int32_t *dev_arrays[3], int32_t *host[3],
                            ap_batch *batch) {
    for (int a = 0; a < 3; a++) {
        host[a] = malloc(sizeof(int32_t) * (size_t)(B + 1));
        if (host[a] == NULL ||
            !mb_ok(cudaMalloc((void **)&dev_arrays[a], sizeof(int32_t) * (size_t)(B + 1)),
                   "batch array"))
            return 0;
    }
    for (int i = 0; i <= B; i++) host[0][i] = host[1][i] = i * S; /* qo, kv */
    for (int i = 0; i < B; i++) host[2][i] = causal ? S : 2 * S;  /* seq_lens */
    for (int a = 0; a < 3; a++)
        if (!mb_ok(cudaMemcpy(dev_arrays[a], host[a], sizeof(int32_t) * (size_t)(B + 1),
                              cudaMemcpyHostToDevice),
                   "batch upload"))
            return 0;
    *batch = (ap_batch){.struct_size = sizeof(ap_batch),
                        .mode = AP_MODE_EXTEND,
                        .num_seqs = B,
                        .num_tokens = B * S,
                        .max_q_len = S,
                        .max_seq_len = host[2][0],
                        .qo_indptr = dev_arrays[0],
                        .seq_lens = dev_arrays[2],
                        .qo_indptr_host = host[0],
                        .seq_lens_host = host[2],
                        .kv_indptr = dev_arrays[1],
                        .kv_indptr_host = host[1],
                        .num_kv_tokens = B * S,
                        .kv_causal = causal};
    return 1;
}

static void mb_prefill_case(ap_registry *reg, const ap_device *dev, int B, int S, int H,
                            ap_dtype kvd, int causal, uint64_t *rng) {
    char name[96];
    const int fp8 = kvd == AP_DTYPE_FP8_E4M3;
    snprintf(name, sizeof name, "MLA prefill B%d S%d H%d qk192/v128 %s%s", B, S, H,
             causal ? "causal" : "chunk", fp8 ? " fp8kv" : "");
    if (mb_skip(name)) return;
    mb_prefill p;
    memset(&p, 0, sizeof p);
    ap_model m = mb_model(H, AP_DTYPE_BF16, 64, B * S);
    if (ap_instance_open(reg, "trtllm_mla", &m, NULL, dev, &p.inst) != AP_OK) {
        printf("prefill: open: %s\n", ap_last_error());
        return;
    }
    const int64_t T = (int64_t)B * S;
    const size_t kv_elem = fp8 ? 1 : 2;
    void *q = NULL, *k = NULL, *v = NULL, *out = NULL, *lse = NULL;
    int32_t *arrays[3] = {NULL, NULL, NULL}, *host[3] = {NULL, NULL, NULL};
    ap_batch batch;
    int ok = mb_ok(cudaMalloc(&q, (size_t)T * H * 192 * 2), "q") &&
             mb_ok(cudaMalloc(&k, (size_t)T * H * 192 * kv_elem), "k") &&
             mb_ok(cudaMalloc(&v, (size_t)T * H * 128 * kv_elem), "v") &&
             mb_ok(cudaMalloc(&out, (size_t)T * H * 128 * 2), "out") &&
             mb_ok(cudaMalloc(&lse, (size_t)T * H * 4), "lse") &&
             mb_fill(q, (size_t)T * H * 192 * 2, 0, rng) &&
             mb_fill(k, (size_t)T * H * 192 * kv_elem, fp8, rng) &&
             mb_fill(v, (size_t)T * H * 128 * kv_elem, fp8, rng) &&
             mb_prefill_batch(B, S, causal, arrays, host, &batch);
    if (ok) {
        p.sq[0] = T, p.sq[1] = H, p.sq[2] = 192;
        p.sk[0] = T, p.sk[1] = H, p.sk[2] = 192;
        p.sv[0] = T, p.sv[1] = H, p.sv[2] = 128;
        p.so[0] = T, p.so[1] = H, p.so[2] = 128;
        p.sl[0] = T, p.sl[1] = H;
        mb_tensor(&p.q, p.sq, q, mb_bf16, 3);
        mb_tensor(&p.k, p.sk, k, fp8 ? mb_fp8 : mb_bf16, 3);
        mb_tensor(&p.v, p.sv, v, fp8 ? mb_fp8 : mb_bf16, 3);
        mb_tensor(&p.out, p.so, out, mb_bf16, 3);
        mb_tensor(&p.lse, p.sl, lse, mb_f32, 2);
        p.layer = (ap_layer){.struct_size = sizeof(ap_layer),
                             .sm_scale = 0.0721688f, /* 1 / sqrt(192) */
                             .k_scale = fp8 ? 0.01f : 1.f,
                             .v_scale = fp8 ? 0.01f : 1.f,
                             .window_left = -1};
        p.args = (ap_forward_args){.struct_size = sizeof(ap_forward_args),
                                   .q = &p.q,
                                   .k = &p.k,
                                   .v = &p.v,
                                   .out = &p.out,
                                   .lse = &p.lse};
        ok = ap_instance_init_metadata(p.inst, &batch, 0) == AP_OK;
        if (!ok) printf("prefill: init_metadata: %s\n", ap_last_error());
    }
    if (ok) {
        double mn, ms = mb_time(mb_prefill_call, &p, 1, &mn, 0);
        const double flops = 2.0 * B * H * (double)S * S * 320 * (causal ? 0.5 : 1.0);
        if (ms > 0) mb_row("prefill", name, ms, mn, 0, flops / (ms * 1e9));
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse);
    for (int a = 0; a < 3; a++) cudaFree(arrays[a]), free(host[a]);
    ap_instance_close(p.inst);
}

/* ---- append ----------------------------------------------------------------------------------- */

typedef struct mb_append {
    ap_instance *inst;
    ap_kv_cache kv;
    ap_layer layer;
    DLTensor k, q, pos, loc, cs;
    int64_t sk[3], sq[3], sp[1], scs[2];
    ap_append_kv_args args;
} mb_append;

static int mb_append_call(void *ctx, int set) {
    (void)set;
    mb_append *a = ctx;
    ap_status st = ap_instance_append_kv(a->inst, &a->layer, &a->args, 0);
    if (st != AP_OK) fprintf(stderr, "append: %s\n", ap_last_error());
    return st == AP_OK;
}

static void mb_append_case(ap_registry *reg, const ap_device *dev, int T, int H, ap_dtype kvd,
                           uint64_t *rng) {
    mb_append a;
    memset(&a, 0, sizeof a);
    char name[96];
    snprintf(name, sizeof name, "append %d tokens H%d q_rope in place, %s cache", T, H,
             kvd == AP_DTYPE_FP8_E4M3 ? "fp8" : "bf16");
    if (mb_skip(name)) return;
    ap_model m = mb_model(H, kvd, 64, 16384);
    if (ap_instance_open(reg, "trtllm_mla", &m, NULL, dev, &a.inst) != AP_OK) {
        printf("append: open: %s\n", ap_last_error());
        return;
    }
    const size_t elem = kvd == AP_DTYPE_FP8_E4M3 ? 1 : 2;
    const int pages = T / 64 + 1, max_pos = 65536;
    void *k = NULL, *q = NULL, *cache = NULL, *cs = NULL;
    int32_t *pos = NULL;
    int ok = mb_ok(cudaMalloc(&k, (size_t)T * 576 * 2), "k") &&
             mb_ok(cudaMalloc(&q, (size_t)T * H * 64 * 2), "q") &&
             mb_ok(cudaMalloc(&cache, (size_t)pages * 64 * 576 * elem), "cache") &&
             mb_ok(cudaMalloc(&cs, (size_t)max_pos * 64 * 4), "cs") &&
             mb_ok(cudaMalloc((void **)&pos, (size_t)T * 8), "pos") &&
             mb_fill(k, (size_t)T * 576 * 2, 0, rng) &&
             mb_fill(q, (size_t)T * H * 64 * 2, 0, rng) &&
             mb_fill(cs, (size_t)max_pos * 64 * 4, 0, rng);
    int32_t *h = malloc((size_t)T * 8);
    for (int t = 0; h && t < T; t++) h[t] = (int32_t)gpu_rand_below(rng, max_pos), h[T + t] = t;
    ok = ok && h && mb_ok(cudaMemcpy(pos, h, (size_t)T * 8, cudaMemcpyHostToDevice), "pos");
    free(h);
    if (ok) {
        a.kv = (ap_kv_cache){.struct_size = sizeof(ap_kv_cache),
                             .layout = AP_KV_LAYOUT_NHD,
                             .dtype = kvd,
                             .page_size = 64,
                             .num_pages = pages,
                             .num_kv_heads = 1,
                             .head_dim_qk = 576,
                             .head_dim_v = 512,
                             .k_pages = cache};
        a.layer = (ap_layer){.struct_size = sizeof(ap_layer),
                             .sm_scale = 0.07f,
                             .k_scale = 0.01f,
                             .v_scale = 0.01f,
                             .window_left = -1,
                             .kv = &a.kv};
        a.sk[0] = T, a.sk[1] = 1, a.sk[2] = 576;
        a.sq[0] = T, a.sq[1] = H, a.sq[2] = 64;
        a.sp[0] = T;
        a.scs[0] = max_pos, a.scs[1] = 64;
        mb_tensor(&a.k, a.sk, k, mb_bf16, 3);
        mb_tensor(&a.q, a.sq, q, mb_bf16, 3);
        mb_tensor(&a.pos, a.sp, pos, mb_i32, 1);
        mb_tensor(&a.loc, a.sp, pos + T, mb_i32, 1);
        mb_tensor(&a.cs, a.scs, cs, mb_f32, 2);
        a.args = (ap_append_kv_args){.struct_size = sizeof(ap_append_kv_args),
                                     .q = &a.q,
                                     .q_out = &a.q,
                                     .k = &a.k,
                                     .positions = &a.pos,
                                     .out_loc = &a.loc,
                                     .cos_sin = &a.cs,
                                     .rotary_dim = 64,
                                     .is_neox = 0};
        /* k read, cache written, q_rope read and written in place (cos_sin rows: L2 traffic) */
        double bytes = (double)T * 576 * (2 + elem) + (double)T * H * 64 * 2 * 2;
        /* per call (the host's checks and launch counted), then GPU time (enqueued behind a
         * sleep, so that cost is hidden, as for the decode's sleep rows) */
        for (int sleep = 0; sleep < 2; sleep++) {
            double mn = 0, ms = mb_time(mb_append_call, &a, 1, &mn, sleep);
            char row[112];
            snprintf(row, sizeof row, "%s%s", name, sleep ? " sleep" : "");
            if (ms > 0) mb_row("append", row, ms, mn, bytes / (ms * 1e6), 0);
        }
    }
    cudaFree(k), cudaFree(q), cudaFree(cache), cudaFree(cs), cudaFree(pos);
    ap_instance_close(a.inst);
}

int main(int argc, char **argv) {
    const char *dirs[8];
    size_t nd = 0;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plugin-dir") == 0 && i + 1 < argc && nd < 8)
            dirs[nd++] = argv[++i];
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            mb_runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            mb_only = argv[++i];
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
        else {
            fprintf(
                stderr,
                "usage: mla-bench [--runs N] [--only TEXT] [--json FILE] [--plugin-dir DIR]...\n");
            return 2;
        }
    }
    if (mb_runs < 10) mb_runs = 10;
    ap_registry_options ro = {.struct_size = sizeof ro, .search_dirs = dirs, .num_search_dirs = nd};
    ap_registry *reg = NULL;
    ap_device dev;
    if (ap_registry_create(&ro, &reg) != AP_OK || ap_registry_scan(reg) != AP_OK ||
        ap_device_query(0, &dev) != AP_OK) {
        fprintf(stderr, "setup: %s\n", ap_last_error());
        return 1;
    }
    if (json != NULL) {
        mb_json = fopen(json, "w");
        if (mb_json != NULL) fprintf(mb_json, "[");
    }
    printf("mla-bench on %s, median of %d\n", dev.name, mb_runs);
    uint64_t rng = 12345;
    mb_prefill_case(reg, &dev, 1, 4096, 128, AP_DTYPE_BF16, 1, &rng);
    mb_prefill_case(reg, &dev, 1, 4096, 128, AP_DTYPE_FP8_E4M3, 1, &rng);
    mb_prefill_case(reg, &dev, 4, 4096, 16, AP_DTYPE_BF16, 1, &rng);
    mb_prefill_case(reg, &dev, 1, 4096, 128, AP_DTYPE_BF16, 0, &rng);
    mb_prefill_case(reg, &dev, 1, 4096, 128, AP_DTYPE_FP8_E4M3, 0, &rng);
    mb_pack_case(reg, &dev, 4096, 128, &rng);
    for (int t = 1; t <= 4; t++) mb_pack_case(reg, &dev, t, 128, &rng);
    mb_append_case(reg, &dev, 16384, 16, AP_DTYPE_FP8_E4M3, &rng);
    mb_append_case(reg, &dev, 16384, 128, AP_DTYPE_BF16, &rng);
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_FP8_E4M3, 1, 0, 0, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 128, 4096, 128, 64, AP_DTYPE_BF16, 1, 0, 0, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 1, 32768, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 64, 4096, 128, 64, AP_DTYPE_BF16, 1, 0, 0, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 64, 4096, 128, 64, AP_DTYPE_BF16, 2, 0, 0, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 128, 4096, 128, 64, AP_DTYPE_FP8_E4M3, 1, 0, 0, 0, NULL, &rng);
    /* the 16-row kernel with the stage count forced (option decode_stages), beside the default */
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_BF16, 1, 2, 0, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_FP8_E4M3, 1, 2, 0, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 1, 32768, 16, 64, AP_DTYPE_BF16, 1, 3, 0, 0, NULL, &rng);
    /* the flat schedule (decode_schedule unset) against the per-sequence split grid: the H16
     * cases and a skewed batch (one sequence of 32768 among 63 of 1024) */
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 0, "split", &rng);
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_FP8_E4M3, 1, 0, 0, 0, "split", &rng);
    mb_decode_case(reg, &dev, 1, 32768, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 0, "split", &rng);
    mb_decode_case(reg, &dev, 64, 1024, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 32768, NULL, &rng);
    mb_decode_case(reg, &dev, 64, 1024, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 32768, "split", &rng);
    mb_decode_case(reg, &dev, 256, 2048, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 256, 2048, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 0, "split", &rng);
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 0, "cut", &rng);
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_FP8_E4M3, 1, 0, 0, 0, "cut", &rng);
    mb_decode_case(reg, &dev, 256, 2048, 16, 64, AP_DTYPE_BF16, 1, 0, 0, 0, "cut", &rng);
    /* the H16 cases timed behind a GPU sleep (FlashInfer's timing: host cost of the call hidden) */
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_BF16, 1, 0, 1, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 128, 4096, 16, 64, AP_DTYPE_FP8_E4M3, 1, 0, 1, 0, NULL, &rng);
    mb_decode_case(reg, &dev, 1, 32768, 16, 64, AP_DTYPE_BF16, 1, 0, 1, 0, NULL, &rng);
    if (mb_json != NULL) {
        fprintf(mb_json, "\n]\n");
        fclose(mb_json);
    }
    ap_registry_destroy(reg);
    return 0;
}
