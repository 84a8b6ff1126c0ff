/* nvfp4_bench.c: append_kv/1 into bf16 / fp8 / nvfp4 caches and extend over each, timed
 * through the core API (CUDA events, median of --runs), beside a device-to-device copy. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"
#include "bench_fill.h"
#include "gpu_rand.h"

static int nb_runs = 100;
static const char *nb_backend = "flashinfer_like";

/* Median ms of nb_runs calls, each between two events; 10 warm-up calls first. With `sleep`,
 * each call is enqueued behind ~1.3 ms of GPU sleep, so the host's cost of the call (core checks,
 * launch) is hidden and the events time the GPU's work alone (mla-bench's sleep rows;
 * bench_event_median). */
static double nb_time(bench_event_fn fn, void *ctx, double *min_ms, int sleep) {
    return bench_event_median(fn, ctx, 1, nb_runs, 10, sleep ? BENCH_SLEEP_CYCLES : 0, min_ms);
}

static void nb_row(const char *name, double ms, double min_ms, double bytes, double flops) {
    printf("%-58s %9.4f ms (min %.4f)  %8.1f GB/s", name, ms, min_ms, bytes / (ms * 1e6));
    if (flops > 0) printf("  %7.1f TFLOP/s", flops / (ms * 1e9));
    printf("\n");
    fflush(stdout);
}

static void *nb_dev(size_t bytes, uint64_t *rng, int kind) {
    void *d = NULL;
    uint8_t *h = malloc(bytes);
    if (cudaMalloc(&d, bytes) != cudaSuccess || h == NULL) {
        free(h);
        return NULL;
    }
    for (size_t i = 0; i < bytes; i++) {
        uint8_t b = (uint8_t)gpu_rand_next(rng);
        if (kind == 1 && i % 2 == 1) b = (uint8_t)(0x3c + (b & 3)); /* bf16 high byte: ~1..2 */
        if (kind == 2) b = (uint8_t)(0x30 + (b & 15));              /* e4m3 scale bytes */
        if (kind == 3) b &= 0xbf; /* e4m3 values below 2 in magnitude: never NaN */
        h[i] = b;
    }
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

typedef struct nb_copy {
    void *dst, *src;
    size_t bytes;
} nb_copy;

static int nb_copy_call(void *ctx, int set) {
    (void)set; /* one input set */
    nb_copy *c = ctx;
    return cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, 0) == cudaSuccess;
}

static const ap_options nb_options = {.struct_size = sizeof(ap_options),
                                      .prefix_cache = AP_OPTION_UNSET,
                                      .chunked_prefill = AP_OPTION_UNSET,
                                      .cuda_graphs = AP_OPTION_UNSET};

/* The Llama-3-8B layer shape: 32 query heads over 8 KV heads, head dim 128, page 16. */
static ap_model nb_model(ap_dtype kv, int32_t tokens, int32_t batch, int32_t kv_len) {
    return (ap_model){.struct_size = sizeof(ap_model),
                      .name = "nvfp4-bench",
                      .kind = AP_ATTN_MHA,
                      .num_qo_heads = 32,
                      .num_kv_heads = 8,
                      .head_dim_qk = 128,
                      .head_dim_v = 128,
                      .dtype = AP_DTYPE_BF16,
                      .kv_dtype = kv,
                      .page_size = 16,
                      .num_layers = 1,
                      .causal = 1,
                      .max_batch = batch,
                      .max_tokens = tokens,
                      .max_kv_len = kv_len};
}

static const DLDataType nb_i32 = {kDLInt, 32, 1};

static void nb_tensor_dl(DLTensor *t, int64_t *shape, void *data, DLDataType dtype, int ndim) {
    *t = (DLTensor){
        .data = data, .device = {kDLCUDA, 0}, .ndim = ndim, .dtype = dtype, .shape = shape};
}

static void nb_tensor(DLTensor *t, int64_t *shape, void *data, ap_dtype dtype, int ndim) {
    nb_tensor_dl(t, shape, data, ap_dtype_to_dl(dtype), ndim);
}

/* The cache of `pages` pages of the model: values (and nvfp4 block scales), random. */
static int nb_cache(const ap_model *m, ap_instance *inst, int32_t pages, uint64_t *rng,
                    ap_kv_cache *kv) {
    ap_kv_spec spec = {.struct_size = sizeof spec};
    if (ap_instance_kv_spec(inst, &spec) != AP_OK) return 0;
    *kv = (ap_kv_cache){.struct_size = sizeof *kv,
                        .dtype = m->kv_dtype,
                        .page_size = m->page_size,
                        .num_pages = pages,
                        .num_kv_heads = m->num_kv_heads,
                        .head_dim_qk = m->head_dim_qk,
                        .head_dim_v = m->head_dim_v};
    int kind = m->kv_dtype == AP_DTYPE_BF16 ? 1 : m->kv_dtype == AP_DTYPE_FP8_E4M3 ? 3 : 0;
    kv->k_pages = nb_dev(spec.k_bytes_per_page * (size_t)pages, rng, kind);
    kv->v_pages = nb_dev(spec.v_bytes_per_page * (size_t)pages, rng, kind);
    if (spec.scale_bytes_per_page > 0) {
        kv->k_block_scales = nb_dev(spec.scale_bytes_per_page * (size_t)pages, rng, 2);
        kv->v_block_scales = nb_dev(spec.scale_bytes_per_page * (size_t)pages, rng, 2);
    }
    return kv->k_pages != NULL && kv->v_pages != NULL;
}

static void nb_cache_free(ap_kv_cache *kv) {
    cudaFree(kv->k_pages), cudaFree(kv->v_pages);
    cudaFree(kv->k_block_scales), cudaFree(kv->v_block_scales);
}

/* ---- append ---------------------------------------------------------------------------------- */

typedef struct nb_append {
    ap_instance *inst;
    ap_layer layer;
    ap_append_kv_args args;
} nb_append;

static int nb_append_call(void *ctx, int set) {
    (void)set; /* one input set */
    nb_append *a = ctx;
    ap_status st = ap_instance_append_kv(a->inst, &a->layer, &a->args, 0);
    if (st != AP_OK) fprintf(stderr, "append: %s\n", ap_last_error());
    return st == AP_OK;
}

/* Bytes moved once per call: q read and written (rotated in place), k and v read, k and v cache
 * rows written (nvfp4: 0.5 byte a value + 1 scale byte per 16), 8 bytes of position and slot
 * per token, one cos/sin row (rotary_dim floats) per token. */
static double nb_append_bytes(const ap_model *m, int64_t t, int with_q) {
    double per_value = m->kv_dtype == AP_DTYPE_NVFP4      ? 0.5 + 1.0 / 16
                       : m->kv_dtype == AP_DTYPE_FP8_E4M3 ? 1.0
                                                          : 2.0;
    double q = with_q ? (double)t * m->num_qo_heads * m->head_dim_qk * 2 : 0.0;
    double kv_in = (double)t * m->num_kv_heads * m->head_dim_qk * 2 * 2;
    double kv_out = (double)t * m->num_kv_heads * m->head_dim_qk * 2 * per_value;
    return 2 * q + kv_in + kv_out + 8.0 * t + 4.0 * m->head_dim_qk * t;
}

/* with_q 0: no q (the K/V roles alone: what the quantize costs apart from q's rotation). */
static void nb_append_case(ap_registry *reg, const ap_device *dev, int32_t t, ap_dtype kvd,
                           int with_q, uint64_t *rng) {
    ap_model m = nb_model(kvd, t, 1, t);
    nb_append a = {0};
    ap_kv_cache kv;
    char name[96];
    snprintf(name, sizeof name, "append_kv/1 %d tokens 32/8 D128 neox, %s, %s cache", t,
             with_q ? "q in place" : "no q", ap_dtype_str(kvd));
    if (ap_instance_open(reg, nb_backend, &m, &nb_options, dev, &a.inst) != AP_OK) {
        printf("%-58s open: %s\n", name, ap_last_error());
        return;
    }
    int32_t pages = (t + 15) / 16 + 1;
    int64_t qs[3] = {t, 32, 128}, ks[3] = {t, 8, 128}, ps[1] = {t}, cs[2] = {t, 128};
    void *q = nb_dev((size_t)t * 32 * 128 * 2, rng, 1),
         *k = nb_dev((size_t)t * 8 * 128 * 2, rng, 1);
    void *v = nb_dev((size_t)t * 8 * 128 * 2, rng, 1);
    int32_t *ints = malloc(sizeof(int32_t) * 2 * (size_t)t);
    float *table = malloc(sizeof(float) * 128 * (size_t)t);
    for (int32_t i = 0; i < t; i++) ints[i] = i, ints[t + i] = i + 16; /* position, slot */
    for (int64_t i = 0; i < 128 * (int64_t)t; i++) table[i] = (float)cos(0.001 * (double)i);
    void *dints = NULL, *dtable = NULL;
    cudaMalloc(&dints, sizeof(int32_t) * 2 * (size_t)t);
    cudaMalloc(&dtable, sizeof(float) * 128 * (size_t)t);
    cudaMemcpy(dints, ints, sizeof(int32_t) * 2 * (size_t)t, cudaMemcpyHostToDevice);
    cudaMemcpy(dtable, table, sizeof(float) * 128 * (size_t)t, cudaMemcpyHostToDevice);
    DLTensor tq, tk, tv, tp, to, tc;
    if (nb_cache(&m, a.inst, pages, rng, &kv) && q && k && v && dints && dtable) {
        nb_tensor(&tq, qs, q, AP_DTYPE_BF16, 3), nb_tensor(&tk, ks, k, AP_DTYPE_BF16, 3);
        nb_tensor(&tv, ks, v, AP_DTYPE_BF16, 3), nb_tensor_dl(&tp, ps, dints, nb_i32, 1);
        nb_tensor_dl(&to, ps, (int32_t *)dints + t, nb_i32, 1);
        nb_tensor(&tc, cs, dtable, AP_DTYPE_F32, 2);
        a.layer = (ap_layer){.struct_size = sizeof a.layer,
                             .sm_scale = 0.088f,
                             .k_scale = kvd == AP_DTYPE_NVFP4 ? 1.0f / 2688 : 1.0f / 64,
                             .v_scale = kvd == AP_DTYPE_NVFP4 ? 1.0f / 2688 : 1.0f / 64,
                             .window_left = -1,
                             .kv = &kv};
        a.args = (ap_append_kv_args){.struct_size = sizeof a.args,
                                     .q = with_q ? &tq : NULL,
                                     .q_out = with_q ? &tq : NULL,
                                     .k = &tk,
                                     .v = &tv,
                                     .positions = &tp,
                                     .out_loc = &to,
                                     .cos_sin = &tc,
                                     .rotary_dim = 128,
                                     .is_neox = 1};
        /* per call (the host's checks and launch counted), then the GPU's time alone */
        for (int sleep = 0; sleep < 2; sleep++) {
            double mn = 0, ms = nb_time(nb_append_call, &a, &mn, sleep);
            char row[112];
            snprintf(row, sizeof row, "%s%s", name, sleep ? " sleep" : "");
            if (ms > 0) nb_row(row, ms, mn, nb_append_bytes(&m, t, with_q), 0);
        }
        nb_cache_free(&kv);
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(dints), cudaFree(dtable);
    free(ints), free(table);
    ap_instance_close(a.inst);
}

/* ---- extend ---------------------------------------------------------------------------------- */

typedef struct nb_extend {
    ap_instance *inst;
    ap_layer layer;
    ap_forward_args args;
} nb_extend;

static int nb_extend_call(void *ctx, int set) {
    (void)set; /* one input set */
    nb_extend *e = ctx;
    ap_status st = ap_instance_forward_extend(e->inst, &e->layer, &e->args, 0);
    if (st != AP_OK) fprintf(stderr, "extend: %s\n", ap_last_error());
    return st == AP_OK;
}

/* The CSR arrays of `b` sequences alike (prefix cached, q_len new), pages in order: one block
 * [qo_indptr | kv_page_indptr | indices | last_page_len | seq_lens | positions]. */
static int32_t *nb_batch_ints(int32_t b, int32_t prefix, int32_t q_len, int32_t *pages_out,
                              size_t *count) {
    int32_t len = prefix + q_len, per = (len + 15) / 16, pages = b * per, t = b * q_len;
    *count = (size_t)(b + 1) * 2 + (size_t)pages + 2 * (size_t)b + (size_t)t;
    int32_t *ints = malloc(sizeof(int32_t) * *count);
    if (ints == NULL) return NULL;
    int32_t *qo = ints, *kp = qo + b + 1, *ix = kp + b + 1, *last = ix + pages, *sl = last + b;
    int32_t *pos = sl + b;
    for (int32_t i = 0; i <= b; i++) qo[i] = i * q_len, kp[i] = i * per;
    for (int32_t i = 0; i < pages; i++) ix[i] = i;
    for (int32_t i = 0; i < b; i++) {
        last[i] = len - (per - 1) * 16, sl[i] = len;
        for (int32_t j = 0; j < q_len; j++) pos[i * q_len + j] = prefix + j;
    }
    *pages_out = pages;
    return ints;
}

static void nb_batch_of(int32_t *h, int32_t *d, int32_t b, int32_t prefix, int32_t q_len,
                        int32_t pages, ap_batch *out) {
    size_t o_kp = (size_t)b + 1, o_ix = 2 * o_kp, o_last = o_ix + (size_t)pages;
    size_t o_sl = o_last + (size_t)b, o_pos = o_sl + (size_t)b;
    *out = (ap_batch){.struct_size = sizeof *out,
                      .mode = AP_MODE_EXTEND,
                      .num_seqs = b,
                      .num_tokens = b * q_len,
                      .max_q_len = q_len,
                      .max_seq_len = prefix + q_len,
                      .num_pages_total = pages,
                      .qo_indptr = d,
                      .kv_page_indptr = d + o_kp,
                      .kv_page_indices = d + o_ix,
                      .kv_last_page_len = d + o_last,
                      .seq_lens = d + o_sl,
                      .positions = d + o_pos,
                      .qo_indptr_host = h,
                      .kv_page_indptr_host = h + o_kp,
                      .kv_page_indices_host = h + o_ix,
                      .kv_last_page_len_host = h + o_last,
                      .seq_lens_host = h + o_sl,
                      .positions_host = h + o_pos};
}

/* One planned extend over a filled cache (no save_kv: the cache stands for every layer's),
 * timed per layer call. FLOPs: the causal part of 4 * H * D * q_len * kv_len per sequence. */
static void nb_extend_case(ap_registry *reg, const ap_device *dev, int32_t b, int32_t prefix,
                           int32_t q_len, ap_dtype kvd, uint64_t *rng) {
    ap_model m = nb_model(kvd, b * q_len, b, prefix + q_len);
    nb_extend e = {0};
    ap_kv_cache kv = {0};
    char name[96];
    snprintf(name, sizeof name, "extend B%d prefix %d q %d 32/8 D128 causal, %s cache", b, prefix,
             q_len, ap_dtype_str(kvd));
    if (ap_instance_open(reg, nb_backend, &m, &nb_options, dev, &e.inst) != AP_OK) {
        printf("%-58s open: %s\n", name, ap_last_error());
        return;
    }
    int32_t pages = 0, t = b * q_len;
    size_t count = 0;
    int32_t *ints = nb_batch_ints(b, prefix, q_len, &pages, &count);
    int32_t *dints = NULL;
    int64_t qs[3] = {t, 32, 128};
    void *q = nb_dev((size_t)t * 32 * 128 * 2, rng, 1),
         *out = nb_dev((size_t)t * 32 * 128 * 2, rng, 0);
    cudaMalloc((void **)&dints, sizeof(int32_t) * count);
    ap_batch batch;
    DLTensor tq, tout;
    if (ints && dints && q && out && nb_cache(&m, e.inst, pages, rng, &kv)) {
        cudaMemcpy(dints, ints, sizeof(int32_t) * count, cudaMemcpyHostToDevice);
        nb_batch_of(ints, dints, b, prefix, q_len, pages, &batch);
        nb_tensor(&tq, qs, q, AP_DTYPE_BF16, 3), nb_tensor(&tout, qs, out, AP_DTYPE_BF16, 3);
        e.layer = (ap_layer){.struct_size = sizeof e.layer,
                             .sm_scale = 0.088f,
                             .k_scale = kvd == AP_DTYPE_NVFP4 ? 1.0f / 2688 : 1.0f,
                             .v_scale = kvd == AP_DTYPE_NVFP4 ? 1.0f / 2688 : 1.0f,
                             .window_left = -1,
                             .kv = &kv};
        e.args = (ap_forward_args){.struct_size = sizeof e.args, .q = &tq, .out = &tout};
        if (ap_instance_init_metadata(e.inst, &batch, 0) != AP_OK) {
            printf("%-58s plan: %s\n", name, ap_last_error());
        } else {
            double kv_len = prefix + q_len, flops = 0;
            for (int32_t j = 0; j < q_len; j++) flops += kv_len - q_len + j + 1;
            flops *= 4.0 * 32 * 128 * b;
            double mn = 0, ms = nb_time(nb_extend_call, &e, &mn, 0);
            if (ms > 0) nb_row(name, ms, mn, 0, flops);
        }
    }
    nb_cache_free(&kv);
    cudaFree(q), cudaFree(out), cudaFree(dints);
    free(ints);
    ap_instance_close(e.inst);
}

int main(int argc, char **argv) {
    const char *dirs[8];
    size_t num_dirs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plugin-dir") == 0 && i + 1 < argc && num_dirs < 8)
            dirs[num_dirs++] = argv[++i];
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            nb_runs = atoi(argv[++i]) > 0 ? atoi(argv[i]) : nb_runs;
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            nb_backend = argv[++i];
    }
    ap_registry_options ro = {
        .struct_size = sizeof ro, .search_dirs = dirs, .num_search_dirs = num_dirs};
    ap_registry *reg = NULL;
    ap_device dev;
    if (ap_registry_create(&ro, &reg) != AP_OK || ap_registry_scan(reg) != AP_OK ||
        ap_device_query(0, &dev) != AP_OK || dev.unusable_reason[0] != '\0') {
        printf("SKIP: no registry or no usable GPU: %s\n", ap_last_error());
        return 77;
    }
    printf("nvfp4-bench: %s on %s, median of %d calls (CUDA events around each)\n", nb_backend,
           dev.name, nb_runs);
    uint64_t rng = 1;
    nb_copy copy = {NULL, NULL, (size_t)256 << 20};
    cudaMalloc(&copy.dst, copy.bytes), cudaMalloc(&copy.src, copy.bytes);
    double mn = 0, ms = nb_time(nb_copy_call, &copy, &mn, 0);
    nb_row("device-to-device copy 256 MiB (bytes read + written)", ms, mn, 2.0 * copy.bytes, 0);
    cudaFree(copy.dst), cudaFree(copy.src);
    const ap_dtype kinds[3] = {AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, AP_DTYPE_NVFP4};
    for (int i = 0; i < 3; i++) nb_append_case(reg, &dev, 16384, kinds[i], 1, &rng);
    for (int i = 0; i < 3; i++) nb_append_case(reg, &dev, 64, kinds[i], 1, &rng);
    for (int i = 0; i < 3; i += 2) nb_append_case(reg, &dev, 16384, kinds[i], 0, &rng);
    /* bf16, nvfp4 and fp8 caches; then chunks of 4..256 new tokens over 8192 cached, bf16 and
     * fp8 (whether staging an fp8 cache for the Hopper kernel pays for short chunks) */
    const int32_t shapes[2][2] = {{0, 4096}, {8192, 512}};
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 3; i++)
            nb_extend_case(reg, &dev, 4, shapes[s][0], shapes[s][1], kinds[i], &rng);
    for (int32_t q = 4; q <= 256; q *= 2) {
        nb_extend_case(reg, &dev, 4, 8192, q, AP_DTYPE_BF16, &rng);
        nb_extend_case(reg, &dev, 4, 8192, q, AP_DTYPE_FP8_E4M3, &rng);
    }
    ap_registry_destroy(reg);
    return 0;
}
