/* mha_bench.c: trtllm_mha's decode through the core API, timed with CUDA events: bf16 / fp8 /
 * nvfp4 caches on the shapes (H32/8 D128, page 16), 4-token MTP against 1-token decode,
 * and a whole decode step of 32 layers (Llama-3-8B shape) eager vs captured in a CUDA graph.
 * Decode GB/s counts the K+V bytes (nvfp4: values and block scales) read once. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnplug.h"
#include "bench_fill.h"
#include "tests/gpu/gpu_mem.h"
#include "tests/gpu/paged_layout.h"

#define MB_LAYERS_MAX 32

typedef struct mb_case {
    const char *name;
    ap_dtype kv;
    int32_t batch, prefix, q_len, layers; /* layers > 1: the graph step */
    int32_t hq, hk;                       /* query and KV heads */
    int32_t long_prefix; /* > 0: the first sequence's prefix instead (a skewed batch) */
} mb_case;

/* One layer's cache (its own memory, so a pass over the layers is not served from L2). */
typedef struct mb_layer {
    void *k, *v, *ks, *vs;
} mb_layer;

typedef struct mb_state {
    gpu_layout layout;
    ap_model model;
    ap_instance *inst;
    mb_layer layers[MB_LAYERS_MAX];
    int32_t num_layers;
    size_t value_bytes, scale_bytes;
    void *q, *out;
    int32_t *ints;
    cudaStream_t stream;
} mb_state;

static double mb_now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int mb_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* --option KEY=VALUE: trtllm_mha's own options (e.g. nvfp4_keys_m=off), for every case. */
#define MB_OPTIONS_MAX 4
static ap_option_kv mb_extra[MB_OPTIONS_MAX];
static size_t mb_num_extra;

static ap_status mb_forward(mb_state *s, int layer) {
    const ap_model *m = &s->model;
    const int fp = m->kv_dtype == AP_DTYPE_FP8_E4M3, fp4 = m->kv_dtype == AP_DTYPE_NVFP4;
    ap_kv_cache kv;
    gpu_layout_kv_cache(&s->layout, m->kv_dtype, m->num_kv_heads, m->head_dim_qk,
                        s->layers[layer].k, s->layers[layer].v, &kv);
    kv.k_block_scales = s->layers[layer].ks;
    kv.v_block_scales = s->layers[layer].vs;
    ap_layer l = {.struct_size = sizeof l,
                  .layer_id = layer,
                  .sm_scale = 1.0f / sqrtf((float)m->head_dim_qk),
                  .k_scale = fp ? 1.f / 64 : (fp4 ? 1.f / 6 : 1.f),
                  .v_scale = fp ? 1.f / 64 : (fp4 ? 1.f / 6 : 1.f),
                  .window_left = -1,
                  .kv = &kv};
    gpu_tensor q, o;
    const int64_t t = s->layout.num_tokens;
    gpu_tensor_make(&q, s->q, m->dtype, 1, 3, t, m->num_qo_heads, m->head_dim_qk);
    gpu_tensor_make(&o, s->out, m->dtype, 1, 3, t, m->num_qo_heads, m->head_dim_qk);
    ap_forward_args a = {.struct_size = sizeof a, .q = &q.dl, .out = &o.dl};
    if (s->layout.max_q_len > 1) return ap_instance_forward_extend(s->inst, &l, &a, s->stream);
    return ap_instance_forward_decode(s->inst, &l, &a, s->stream);
}

static ap_status mb_setup(ap_registry *reg, const ap_device *dev, const mb_case *c, mb_state *s) {
    char spec[96];
    if (c->long_prefix > 0)
        snprintf(spec, sizeof spec, "%d:%d,%d:%dx%d", c->long_prefix, c->q_len, c->prefix, c->q_len,
                 c->batch - 1);
    else
        snprintf(spec, sizeof spec, "%d:%dx%d", c->prefix, c->q_len, c->batch);
    gpu_seq *seqs = NULL;
    int32_t n = 0;
    uint64_t rng = 0x1234;
    if (gpu_seqs_parse(spec, &seqs, &n) != AP_OK) return AP_ERR_INVALID_ARGUMENT;
    ap_status st = gpu_layout_build(seqs, n, 16, 0, &rng, &s->layout);
    free(seqs);
    if (st != AP_OK) return st;
    const int32_t hq = c->hq, hk = c->hk;
    gpu_layout_model(&s->layout, AP_DTYPE_BF16, c->kv, hq, hk, 128, &s->model);
    s->model.name = "bench";
    s->model.num_layers = c->layers;
    s->num_layers = c->layers;
    const ap_options opts = {.struct_size = sizeof opts,
                             .prefix_cache = AP_OPTION_UNSET,
                             .chunked_prefill = AP_OPTION_UNSET,
                             .cuda_graphs = AP_OPTION_UNSET,
                             .extra = mb_extra,
                             .num_extra = mb_num_extra};
    st = ap_instance_open(reg, "trtllm_mha", &s->model, &opts, dev, &s->inst);
    if (st != AP_OK) return st;
    const size_t rows = (size_t)s->layout.num_pages_pool * 16 * hk;
    const int fp4 = c->kv == AP_DTYPE_NVFP4;
    s->value_bytes = rows * (fp4 ? 64 : 128 * gpu_dtype_bytes(c->kv));
    s->scale_bytes = fp4 ? rows * 8 : 0;
    const ap_dtype fill = c->kv == AP_DTYPE_BF16 ? AP_DTYPE_BF16 : AP_DTYPE_FP8_E4M3;
    const size_t fill_elems = s->value_bytes / (fill == AP_DTYPE_BF16 ? 2 : 1);
    for (int l = 0; l < c->layers; l++) {
        mb_layer *y = &s->layers[l];
        GPU_CHECK(cudaMalloc(&y->k, s->value_bytes));
        GPU_CHECK(cudaMalloc(&y->v, s->value_bytes));
        GPU_CHECK(
            (cudaError_t)bench_fill_random(y->k, fill_elems, fill, 2.f, 11 + 4 * l, s->stream));
        GPU_CHECK(
            (cudaError_t)bench_fill_random(y->v, fill_elems, fill, 2.f, 12 + 4 * l, s->stream));
        if (fp4) {
            GPU_CHECK(cudaMalloc(&y->ks, s->scale_bytes));
            GPU_CHECK(cudaMalloc(&y->vs, s->scale_bytes));
            GPU_CHECK(cudaMemset(y->ks, 0x30, s->scale_bytes)); /* e4m3 0.5 */
            GPU_CHECK(cudaMemset(y->vs, 0x30, s->scale_bytes));
        }
    }
    const size_t q_bytes = (size_t)s->layout.num_tokens * hq * 128 * 2;
    GPU_CHECK(cudaMalloc(&s->q, q_bytes));
    GPU_CHECK(cudaMalloc(&s->out, q_bytes));
    GPU_CHECK((cudaError_t)bench_fill_random(s->q, q_bytes / 2, AP_DTYPE_BF16, 2.f, 7, s->stream));
    GPU_CHECK(cudaMalloc((void **)&s->ints, s->layout.num_ints * sizeof(int32_t)));
    GPU_CHECK(cudaMemcpy(s->ints, s->layout.ints, s->layout.num_ints * sizeof(int32_t),
                         cudaMemcpyHostToDevice));
    ap_batch b;
    gpu_layout_batch(&s->layout, c->q_len > 1 ? AP_MODE_EXTEND : AP_MODE_DECODE, s->ints, &b);
    st = ap_instance_init_metadata(s->inst, &b, s->stream);
    if (st == AP_OK) GPU_CHECK(cudaStreamSynchronize(s->stream));
    return st;
}

static void mb_free(mb_state *s) {
    for (int l = 0; l < s->num_layers; l++) {
        cudaFree(s->layers[l].k);
        cudaFree(s->layers[l].v);
        cudaFree(s->layers[l].ks);
        cudaFree(s->layers[l].vs);
    }
    cudaFree(s->q);
    cudaFree(s->out);
    cudaFree(s->ints);
    ap_instance_close(s->inst);
    gpu_layout_free(&s->layout);
}

/* Median of `runs` event-timed calls, each over all layers in turn (one call = one layer). */
static ap_status mb_time_layers(mb_state *s, int runs, double *median_ms) {
    cudaEvent_t a, b;
    double *ms = malloc(sizeof(double) * runs);
    GPU_CHECK(cudaEventCreate(&a));
    GPU_CHECK(cudaEventCreate(&b));
    for (int w = 0; w < 5; w++)
        if (mb_forward(s, w % s->num_layers) != AP_OK) return AP_ERR_CUDA;
    for (int r = 0; r < runs; r++) {
        GPU_CHECK(cudaEventRecord(a, s->stream));
        if (mb_forward(s, r % s->num_layers) != AP_OK) return AP_ERR_CUDA;
        GPU_CHECK(cudaEventRecord(b, s->stream));
        GPU_CHECK(cudaEventSynchronize(b));
        float t = 0;
        GPU_CHECK(cudaEventElapsedTime(&t, a, b));
        ms[r] = t;
    }
    qsort(ms, runs, sizeof(double), mb_cmp);
    *median_ms = ms[runs / 2];
    free(ms);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return AP_OK;
}

/* The graph step: every layer's forward captured once; eager step vs replay (events), host
 * time of cudaGraphLaunch, and the layers' kernels timed one by one (their sum). */
static ap_status mb_graph_step(mb_state *s, int runs) {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    cudaEvent_t a, b;
    GPU_CHECK(cudaEventCreate(&a));
    GPU_CHECK(cudaEventCreate(&b));
    if (ap_instance_cuda_graph_prepare(s->inst, s->layout.num_seqs, s->stream) != AP_OK)
        return AP_ERR_UNSUPPORTED;
    GPU_CHECK(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < s->num_layers; l++) mb_forward(s, l);
    GPU_CHECK(cudaStreamEndCapture(s->stream, &g));
    GPU_CHECK(cudaGraphInstantiate(&exec, g, 0));
    double eager = 1e30, graph = 1e30, launch = 1e30, sum = 0;
    for (int r = 0; r < runs; r++) {
        float t = 0;
        GPU_CHECK(cudaEventRecord(a, s->stream));
        for (int l = 0; l < s->num_layers; l++) mb_forward(s, l);
        GPU_CHECK(cudaEventRecord(b, s->stream));
        GPU_CHECK(cudaEventSynchronize(b));
        GPU_CHECK(cudaEventElapsedTime(&t, a, b));
        eager = t < eager ? t : eager;
        GPU_CHECK(cudaEventRecord(a, s->stream));
        double h0 = mb_now_us();
        GPU_CHECK(cudaGraphLaunch(exec, s->stream));
        double h1 = mb_now_us();
        GPU_CHECK(cudaEventRecord(b, s->stream));
        GPU_CHECK(cudaEventSynchronize(b));
        GPU_CHECK(cudaEventElapsedTime(&t, a, b));
        graph = t < graph ? t : graph;
        launch = h1 - h0 < launch ? h1 - h0 : launch;
    }
    for (int l = 0; l < s->num_layers; l++) {
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            float t = 0;
            GPU_CHECK(cudaEventRecord(a, s->stream));
            mb_forward(s, l);
            GPU_CHECK(cudaEventRecord(b, s->stream));
            GPU_CHECK(cudaEventSynchronize(b));
            GPU_CHECK(cudaEventElapsedTime(&t, a, b));
            best = t < best ? t : best;
        }
        sum += best;
    }
    printf("  graph step: %d layers: eager %.3f ms, graph %.3f ms (%.2fx), host launch %.1f us, "
           "kernels' sum %.3f ms: graph / sum %.3f\n",
           s->num_layers, eager, graph, eager / graph, launch, sum, graph / sum);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    return AP_OK;
}

static const mb_case mb_cases[] = {
    {"decode_b64_l4096_bf16", AP_DTYPE_BF16, 64, 4095, 1, 4, 32, 8, 0},
    {"decode_b64_l4096_fp8", AP_DTYPE_FP8_E4M3, 64, 4095, 1, 8, 32, 8, 0},
    {"decode_b64_l4096_nvfp4", AP_DTYPE_NVFP4, 64, 4095, 1, 8, 32, 8, 0},
    {"decode_b1_l8192_bf16", AP_DTYPE_BF16, 1, 8191, 1, 8, 32, 8, 0},
    {"decode_b1_l8192_fp8", AP_DTYPE_FP8_E4M3, 1, 8191, 1, 8, 32, 8, 0},
    {"decode_b1_l8192_nvfp4", AP_DTYPE_NVFP4, 1, 8191, 1, 8, 32, 8, 0},
    {"decode_b8_l32768_bf16", AP_DTYPE_BF16, 8, 32767, 1, 4, 32, 8, 0},
    {"decode_b8_l32768_fp8", AP_DTYPE_FP8_E4M3, 8, 32767, 1, 8, 32, 8, 0},
    {"decode_b8_l32768_nvfp4", AP_DTYPE_NVFP4, 8, 32767, 1, 8, 32, 8, 0},
    {"decode_b256_l1024_bf16", AP_DTYPE_BF16, 256, 1023, 1, 4, 32, 8, 0},
    {"decode_b256_l1024_fp8", AP_DTYPE_FP8_E4M3, 256, 1023, 1, 8, 32, 8, 0},
    {"decode_b256_l1024_nvfp4", AP_DTYPE_NVFP4, 256, 1023, 1, 8, 32, 8, 0},
    {"mtp4_b64_l4096_bf16", AP_DTYPE_BF16, 64, 4092, 4, 4, 32, 8, 0},
    /* 5 and 8 new tokens: 20 and 32 rows per KV head, which option short_extend's auto runs on
     * the kit's prefill (plan.c); --option short_extend=decode times the decode kernel */
    {"mtp5_b16_l8192_bf16", AP_DTYPE_BF16, 16, 8187, 5, 4, 32, 8, 0},
    {"mtp8_b4_l8192_bf16", AP_DTYPE_BF16, 4, 8184, 8, 4, 32, 8, 0},
    {"mtp8_b16_l8192_bf16", AP_DTYPE_BF16, 16, 8184, 8, 4, 32, 8, 0},
    {"mtp8_b64_l4096_bf16", AP_DTYPE_BF16, 64, 4088, 8, 4, 32, 8, 0},
    /* skewed: one sequence of 32768 among 63 of 1024 (the split grid's CTAs of the long one hold
     * their SMs for its whole length; the flat schedule spreads it) */
    {"skew_b64_l1024_one32768_bf16", AP_DTYPE_BF16, 64, 1023, 1, 4, 32, 8, 32767},
    {"skew_b64_l1024_one32768_fp8", AP_DTYPE_FP8_E4M3, 64, 1023, 1, 8, 32, 8, 32767},
    {"graph_step_b1_l1024_bf16", AP_DTYPE_BF16, 1, 1023, 1, 32, 32, 8, 0},
    {"graph_step_b64_l4096_bf16", AP_DTYPE_BF16, 64, 4095, 1, 32, 32, 8, 0},
    /* Layout probes: one KV head (H4/1, the same group and bytes as B64 H32/8), so a head's rows
     * of a page are contiguous, as in an HND cache: what the NHD row stride costs. */
    {"probe_hk1_b512_l4096_bf16", AP_DTYPE_BF16, 512, 4095, 1, 4, 4, 1, 0},
    {"probe_hk1_b512_l4096_fp8", AP_DTYPE_FP8_E4M3, 512, 4095, 1, 8, 4, 1, 0},
    {"probe_hk1_b512_l4096_nvfp4", AP_DTYPE_NVFP4, 512, 4095, 1, 8, 4, 1, 0},
};

int main(int argc, char **argv) {
    const char *dirs[8];
    size_t nd = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plugin-dir") == 0 && i + 1 < argc && nd < 8)
            dirs[nd++] = argv[++i];
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--option") == 0 && i + 1 < argc &&
                 mb_num_extra < MB_OPTIONS_MAX && strchr(argv[i + 1], '=') != NULL) {
            char *kv = argv[++i], *eq = strchr(kv, '=');
            *eq = '\0';
            mb_extra[mb_num_extra++] = (ap_option_kv){kv, eq + 1};
        } else {
            fprintf(stderr, "usage: mha-bench [--plugin-dir DIR]... [--only TEXT] "
                            "[--option KEY=VALUE]...\n");
            return 2;
        }
    }
    ap_registry_options ro = {.struct_size = sizeof ro, .search_dirs = dirs, .num_search_dirs = nd};
    ap_registry *reg = NULL;
    ap_device dev;
    if (ap_registry_create(&ro, &reg) != AP_OK) return 1;
    ap_registry_scan(reg);
    if (ap_device_query(0, &dev) != AP_OK || dev.unusable_reason[0] != '\0') return 77;
    printf("mha-bench: trtllm_mha on %s (H32/8 D128 page 16, bf16 q)", dev.name);
    for (size_t i = 0; i < mb_num_extra; i++)
        printf("%s %s=%s", i == 0 ? ", options" : ",", mb_extra[i].key, mb_extra[i].value);
    printf("\n");
    for (size_t i = 0; i < sizeof mb_cases / sizeof mb_cases[0]; i++) {
        const mb_case *c = &mb_cases[i];
        if (only != NULL && strstr(c->name, only) == NULL) continue;
        mb_state s;
        memset(&s, 0, sizeof s);
        if (cudaStreamCreate(&s.stream) != cudaSuccess) return 1;
        ap_status st = mb_setup(reg, &dev, c, &s);
        double ms = 0;
        if (st == AP_OK && c->layers < MB_LAYERS_MAX) st = mb_time_layers(&s, 60, &ms);
        if (st != AP_OK) {
            printf("%-28s failed: %s: %s\n", c->name, ap_status_name(st), ap_last_error());
        } else if (c->layers < MB_LAYERS_MAX) {
            const double bytes = (double)c->batch * (c->prefix + c->q_len) * c->hk * 2 *
                                 (c->kv == AP_DTYPE_NVFP4 ? 72.0 : 128.0 * gpu_dtype_bytes(c->kv));
            printf("%-28s %.4f ms  %7.1f GB/s  %9.0f tok/s\n", c->name, ms, bytes / ms / 1e6,
                   (double)c->batch * c->q_len / (ms / 1e3));
        } else {
            printf("%s:\n", c->name);
            if (mb_graph_step(&s, 20) != AP_OK) printf("  graph step failed\n");
        }
        mb_free(&s);
        cudaStreamDestroy(s.stream);
    }
    ap_registry_destroy(reg);
    return 0;
}
