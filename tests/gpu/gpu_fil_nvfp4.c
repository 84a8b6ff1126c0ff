/* gpu_fil_nvfp4.c: flashinfer_like's decode over an NVFP4 KV cache against cpu_ref reading the
 * same bytes: page sizes, groups, head dims, both query dtypes; split-KV sequences (the extend
 * and the append over nvfp4 are tests/gpu/gpu_append.c's and the nvfp4 extend cases'). Exit 0 / 1,
 * 77 skipped. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"
#include "backends/numeric/nvfp4_host.h"
#include "gpu_check.h"
#include "gpu_mem.h"
#include "gpu_rand.h"
#include "gpu_registry.h"
#include "paged_layout.h"

#define NV_TOL 2e-2 /* the brief's bound; both read the same bytes, so the gap is the kernel's */

typedef struct nv_case {
    const char *name;
    ap_dtype q_dtype;
    int32_t head_dim, page_size, num_qo_heads, num_kv_heads;
    const char *seqs; /* decode: prefix:1 per sequence */
    int quick;        /* run under compute-sanitizer */
} nv_case;

static const nv_case nv_cases[] = {
    {"bf16 D128 p16 g4", AP_DTYPE_BF16, 128, 16, 32, 8, "0:1,15:1,16:1,1000:1,4095:1", 1},
    {"f16 D128 p1 g1", AP_DTYPE_F16, 128, 1, 8, 8, "7:1,300:1x3", 1},
    {"bf16 D128 p64 g8 long", AP_DTYPE_BF16, 128, 64, 64, 8, "32767:1,8191:1x3,33:1x4", 0},
    {"bf16 D64 p128 g2", AP_DTYPE_BF16, 64, 128, 16, 8, "127:1,128:1,5000:1x5", 0},
    {"f16 D256 p8 g4", AP_DTYPE_F16, 256, 8, 16, 4, "0:1,17:1,2047:1x3", 0},
    {"bf16 D256 p32 g1", AP_DTYPE_BF16, 256, 32, 4, 4, "9000:1x2,1:1", 0},
    {"f16 D64 p4 g8", AP_DTYPE_F16, 64, 4, 16, 2, "63:1,64:1,65:1,3000:1", 0},
    {"bf16 D128 p2 g7", AP_DTYPE_BF16, 128, 2, 28, 4, "511:1x6", 0},
};

typedef struct nv_ctx {
    ap_registry *registry;
    ap_device gpu, cpu;
    cudaStream_t stream;
} nv_ctx;

static const ap_options nv_no_options = {.struct_size = sizeof(ap_options),
                                         .prefix_cache = AP_OPTION_UNSET,
                                         .chunked_prefill = AP_OPTION_UNSET,
                                         .cuda_graphs = AP_OPTION_UNSET};

/* One case's buffers: the nvfp4 cache (values and scales of K and V), q, out, lse, the CSR. */
typedef struct nv_run {
    gpu_layout layout;
    ap_model model;
    float k_scale, v_scale;
    gpu_buf k, v, ks, vs, q, out, lse, ints;
    size_t q_count;
} nv_run;

/* Every cached row of every sequence quantized from uniform floats (K in +-2, V in +-1) with the
 * layer's global scales; slots nobody uses stay 0xff (scale 0xff is an E4M3 NaN: a read of an
 * unused slot poisons the output). */
static void nv_fill_cache(nv_run *r, const nv_case *c, uint64_t *rng) {
    const gpu_layout *l = &r->layout;
    const size_t row_vals = (size_t)c->head_dim / 2, row_scales = (size_t)c->head_dim / 16;
    float x[AP_NVFP4_BLOCK];
    for (int32_t s = 0; s < l->num_seqs; s++) {
        int32_t len = l->ints[l->off_seq_lens + (size_t)s];
        for (int32_t pos = 0; pos < len; pos++)
            for (int32_t h = 0; h < c->num_kv_heads; h++) {
                size_t row = (size_t)gpu_layout_slot(l, s, pos) * (size_t)c->num_kv_heads + h;
                for (int kv = 0; kv < 2; kv++) {
                    uint8_t *vals = (uint8_t *)(kv ? r->v.host : r->k.host) + row * row_vals;
                    uint8_t *scales = (uint8_t *)(kv ? r->vs.host : r->ks.host) + row * row_scales;
                    float bound = kv ? 1.0f : 2.0f, g = kv ? r->v_scale : r->k_scale;
                    for (size_t b = 0; b < row_scales; b++) {
                        for (int i = 0; i < AP_NVFP4_BLOCK; i++)
                            x[i] = gpu_rand_uniform(rng, -bound, bound);
                        scales[b] = ap_nvfp4_quantize_block(x, g, vals + b * AP_NVFP4_BLOCK / 2);
                    }
                }
            }
    }
}

static ap_status nv_alloc(nv_run *r, const nv_case *c) {
    size_t slots = (size_t)r->layout.num_pages_pool * (size_t)c->page_size;
    size_t rows = slots * (size_t)c->num_kv_heads;
    size_t tokens = (size_t)r->layout.num_tokens;
    r->q_count = tokens * (size_t)c->num_qo_heads * (size_t)c->head_dim;
    gpu_buf *bufs[] = {&r->k, &r->v, &r->ks, &r->vs, &r->q, &r->out, &r->lse, &r->ints};
    size_t bytes[] = {rows * (size_t)c->head_dim / 2,
                      rows * (size_t)c->head_dim / 2,
                      rows * (size_t)c->head_dim / 16,
                      rows * (size_t)c->head_dim / 16,
                      r->q_count * 2,
                      r->q_count * 2,
                      tokens * (size_t)c->num_qo_heads * 4,
                      r->layout.num_ints * 4};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        ap_status st = gpu_buf_alloc(bufs[i], bytes[i], 1);
        if (st != AP_OK) return st;
        memset(bufs[i]->host, GPU_POISON_BYTE, bytes[i]);
    }
    return AP_OK;
}

static void nv_free(nv_run *r) {
    gpu_buf *bufs[] = {&r->k, &r->v, &r->ks, &r->vs, &r->q, &r->out, &r->lse, &r->ints};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu_buf_free(bufs[i]);
    gpu_layout_free(&r->layout);
}

/* One forward (init_metadata first) on the GPU copies (gpu 1) or the host blocks (gpu 0). */
static ap_status nv_forward(const nv_ctx *ctx, nv_run *r, const nv_case *c, ap_instance *inst,
                            int gpu, ap_forward_mode mode, int save_kv, void *out, void *lse) {
    ap_kv_cache kv;
    gpu_layout_kv_cache(&r->layout, AP_DTYPE_NVFP4, c->num_kv_heads, c->head_dim,
                        gpu ? r->k.target : r->k.host, gpu ? r->v.target : r->v.host, &kv);
    kv.k_block_scales = gpu ? r->ks.target : r->ks.host;
    kv.v_block_scales = gpu ? r->vs.target : r->vs.host;
    ap_layer layer = {.struct_size = sizeof layer,
                      .sm_scale = 1.0f / sqrtf((float)c->head_dim),
                      .k_scale = r->k_scale,
                      .v_scale = r->v_scale,
                      .window_left = -1,
                      .kv = &kv};
    int64_t t = r->layout.num_tokens;
    gpu_tensor q, o, l, kv_new;
    gpu_tensor_make(&q, gpu ? r->q.target : r->q.host, c->q_dtype, gpu, 3, t, c->num_qo_heads,
                    c->head_dim);
    gpu_tensor_make(&kv_new, gpu ? r->q.target : r->q.host, c->q_dtype, gpu, 3, t, c->num_kv_heads,
                    c->head_dim); /* q's bytes: refused before any read */
    gpu_tensor_make(&o, out, c->q_dtype, gpu, 3, t, c->num_qo_heads, c->head_dim);
    gpu_tensor_make(&l, lse, AP_DTYPE_F32, gpu, 2, t, c->num_qo_heads, 0);
    ap_forward_args args = {.struct_size = sizeof args,
                            .q = &q.dl,
                            .k = save_kv ? &kv_new.dl : NULL,
                            .v = save_kv ? &kv_new.dl : NULL,
                            .out = &o.dl,
                            .lse = &l.dl,
                            .save_kv = save_kv};
    ap_batch batch;
    gpu_layout_batch(&r->layout, mode, gpu ? (const int32_t *)r->ints.target : NULL, &batch);
    void *stream = gpu ? (void *)ctx->stream : NULL;
    ap_status st = ap_instance_init_metadata(inst, &batch, stream);
    if (st != AP_OK) return st;
    st = ap_instance_forward_decode(inst, &layer, &args, stream);
    if (st == AP_OK && gpu && cudaStreamSynchronize(ctx->stream) != cudaSuccess) return AP_ERR_CUDA;
    return st;
}

static int nv_compare(const nv_case *c, nv_run *r, const void *out_ref, const float *lse_ref) {
    size_t rows = (size_t)r->layout.num_tokens * (size_t)c->num_qo_heads;
    gpu_diff o = gpu_compare(c->q_dtype, r->out.host, out_ref, r->q_count, (size_t)c->head_dim);
    gpu_diff l = gpu_compare(AP_DTYPE_F32, r->lse.host, lse_ref, rows, 1);
    int pass = o.rel_l2 < NV_TOL && o.row_rel_l2 < NV_TOL && o.unwritten == 0 && o.nonfinite == 0 &&
               o.ref_bad == 0 && l.rel_l2 < 1e-3 && l.nonfinite == 0 && l.ref_bad == 0;
    printf("%s  %-28s out rel L2 %.2e (worst row %.2e), lse %.2e, unwritten %zu, non-finite %zu\n",
           pass ? "PASS" : "FAIL", c->name, o.rel_l2, o.row_rel_l2, l.rel_l2, o.unwritten,
           o.nonfinite);
    return !pass;
}

/* Plugin kv_spec: nvfp4 packs two values a byte and one scale byte per 16. */
static int nv_spec_ok(ap_instance *inst, const nv_case *c) {
    ap_kv_spec spec = {.struct_size = sizeof spec};
    size_t rows = (size_t)c->page_size * (size_t)c->num_kv_heads;
    if (ap_instance_kv_spec(inst, &spec) == AP_OK &&
        spec.k_bytes_per_page == rows * (size_t)c->head_dim / 2 &&
        spec.v_bytes_per_page == spec.k_bytes_per_page &&
        spec.scale_bytes_per_page == rows * (size_t)c->head_dim / 16)
        return 1;
    printf("FAIL  %-28s kv_spec %zu/%zu/%zu bytes per page\n", c->name, spec.k_bytes_per_page,
           spec.v_bytes_per_page, spec.scale_bytes_per_page);
    return 0;
}

static void nv_fill_q(nv_run *r, const nv_case *c, uint64_t *rng) {
    for (size_t i = 0; i < r->q_count; i++)
        gpu_elem_store(c->q_dtype, r->q.host, i, gpu_rand_uniform(rng, -2.0f, 2.0f));
}

/* Open both backends on the case's model; 0 when either cannot (printed). */
static int nv_open(const nv_ctx *ctx, nv_run *r, const nv_case *c, ap_instance **fil,
                   ap_instance **ref) {
    if (ap_instance_open(ctx->registry, "cpu_ref", &r->model, &nv_no_options, &ctx->cpu, ref) !=
            AP_OK ||
        ap_instance_open(ctx->registry, "flashinfer_like", &r->model, &nv_no_options, &ctx->gpu,
                         fil) != AP_OK) {
        printf("FAIL  %-28s open: %s\n", c->name, ap_last_error());
        return 0;
    }
    return nv_spec_ok(*fil, c);
}

static int nv_case_run(const nv_ctx *ctx, const nv_case *c, uint64_t seed) {
    uint64_t rng = seed;
    nv_run r = {.k_scale = 0.f};
    ap_instance *fil = NULL, *ref = NULL;
    gpu_seq *seqs = NULL;
    int32_t num_seqs = 0;
    int fails = 1;
    void *out_ref = NULL;
    float *lse_ref = NULL;
    if (gpu_seqs_parse(c->seqs, &seqs, &num_seqs) != AP_OK ||
        gpu_layout_build(seqs, num_seqs, c->page_size, num_seqs + 2, &rng, &r.layout) != AP_OK)
        goto out;
    /* non-power-of-two global scales near amax / (6 * 448), as a calibrated layer has */
    r.k_scale = gpu_rand_uniform(&rng, 0.0006f, 0.0009f);
    r.v_scale = gpu_rand_uniform(&rng, 0.0003f, 0.0005f);
    gpu_layout_model(&r.layout, c->q_dtype, AP_DTYPE_NVFP4, c->num_qo_heads, c->num_kv_heads,
                     c->head_dim, &r.model);
    r.model.name = "gpu-nvfp4";
    if (!nv_open(ctx, &r, c, &fil, &ref) || nv_alloc(&r, c) != AP_OK) goto out;
    nv_fill_cache(&r, c, &rng);
    nv_fill_q(&r, c, &rng);
    memcpy(r.ints.host, r.layout.ints, r.ints.bytes);
    out_ref = malloc(r.out.bytes);
    lse_ref = malloc(r.lse.bytes);
    if (out_ref == NULL || lse_ref == NULL) goto out;
    memset(out_ref, GPU_POISON_BYTE, r.out.bytes);
    memset(lse_ref, GPU_POISON_BYTE, r.lse.bytes);
    gpu_buf *up[] = {&r.k, &r.v, &r.ks, &r.vs, &r.q, &r.out, &r.lse, &r.ints};
    for (size_t i = 0; i < sizeof up / sizeof up[0]; i++)
        if (gpu_buf_upload(up[i]) != AP_OK) goto out;
    if (nv_forward(ctx, &r, c, ref, 0, AP_MODE_DECODE, 0, out_ref, lse_ref) != AP_OK ||
        nv_forward(ctx, &r, c, fil, 1, AP_MODE_DECODE, 0, r.out.target, r.lse.target) != AP_OK) {
        printf("FAIL  %-28s forward: %s\n", c->name, ap_last_error());
        goto out;
    }
    if (gpu_buf_download(&r.out) != AP_OK || gpu_buf_download(&r.lse) != AP_OK) goto out;
    fails = nv_compare(c, &r, out_ref, lse_ref);
out:
    if (fails && r.layout.ints == NULL) printf("FAIL  %-28s bad batch\n", c->name);
    free(out_ref);
    free(lse_ref);
    free(seqs);
    if (fil != NULL) ap_instance_close(fil);
    if (ref != NULL) ap_instance_close(ref);
    nv_free(&r);
    return fails;
}

static int nv_setup(int argc, char **argv, nv_ctx *ctx) {
    const char *dirs[4];
    size_t num_dirs = 0;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--plugin-dir") == 0 && num_dirs < 4) dirs[num_dirs++] = argv[++i];
    ap_registry_options options = {
        .struct_size = sizeof options, .search_dirs = dirs, .num_search_dirs = num_dirs};
    if (ap_registry_create(&options, &ctx->registry) != AP_OK ||
        ap_registry_scan(ctx->registry) != AP_OK) {
        fprintf(stderr, "registry: %s\n", ap_last_error());
        return 1;
    }
    /* the backend, the reference and the device, each said apart when missing */
    int code = gpu_backend_present(ctx->registry, "flashinfer_like");
    if (code < 0) code = gpu_reference_present(ctx->registry);
    if (code < 0) code = gpu_device_usable(&ctx->gpu);
    if (code >= 0) return code;
    ap_device_cpu(&ctx->cpu, "");
    if (cudaSetDevice(ctx->gpu.ordinal) != cudaSuccess ||
        cudaStreamCreate(&ctx->stream) != cudaSuccess) {
        fprintf(stderr, "cannot start CUDA on device %d\n", ctx->gpu.ordinal);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    nv_ctx ctx = {0};
    int quick = 0;
    uint64_t seed = 0x6e76667034ull;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
    }
    int rc = nv_setup(argc, argv, &ctx);
    if (rc != 0) {
        if (ctx.registry != NULL) ap_registry_destroy(ctx.registry);
        return rc;
    }
    printf("seed %#llx\n", (unsigned long long)seed);
    int fails = 0, runs = 0;
    for (size_t i = 0; i < sizeof nv_cases / sizeof nv_cases[0]; i++) {
        if (quick && !nv_cases[i].quick) continue;
        fails += nv_case_run(&ctx, &nv_cases[i], seed + i) != 0;
        runs++;
    }
    printf("%d of %d nvfp4 decode cases passed\n", runs - fails, runs);
    cudaStreamDestroy(ctx.stream);
    ap_registry_destroy(ctx.registry);
    return fails == 0 ? 0 : 1;
}
