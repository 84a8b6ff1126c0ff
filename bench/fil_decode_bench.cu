// fil_decode_bench.cu: flashinfer_like decode alone: a float64 spot check, then CUDA-event timing.
//
// Opens the plugin file directly (no core), runs forward_decode over random paged KV caches
// (pages shuffled, several layers rotated so the caches do not fit in L2), checks a few
// sequences of the first call against a float64 CPU reference, and prints the median time and
// the KV bytes read once per second.
// Usage: fil_decode_bench PLUGIN.so [--filter TEXT] [--only NAME,NAME...] [--runs N]
// (--filter: names containing TEXT; --only: exactly these names, for interleaved A/B runs)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "backends/numeric/host_numeric.h"
#include "bench/fil_bench_util.h"
#include "plugin_api.h"

struct Case {
    const char *name;
    int batch, len, hq, hk, dim, page;
    ap_dtype q_dtype, kv_dtype;
    const char *split;        // "auto" or "off"
    const char *warps_per_sm; // decode_warps_per_sm, or NULL for the default
};

static const Case kCases[] = {
    {"b64_l4096", 64, 4096, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", NULL},
    {"b64_l4096_w8", 64, 4096, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", "8"},
    {"b64_l4096_nosplit", 64, 4096, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "off", NULL},
    {"b64_l4096_fp8", 64, 4096, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, "auto", NULL},
    {"b64_l4096_fp8_w8", 64, 4096, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, "auto", "8"},
    {"b1_l8192", 1, 8192, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", NULL},
    {"b1_l8192_fp8", 1, 8192, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, "auto", NULL},
    {"b1_l8192_w8", 1, 8192, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", "8"},
    {"b1_l8192_w2", 1, 8192, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", "2"},
    {"b8_l32768", 8, 32768, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", NULL},
    {"b8_l32768_fp8", 8, 32768, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, "auto", NULL},
    {"b8_l32768_w8", 8, 32768, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", "8"},
    {"b256_l1024", 256, 1024, 32, 8, 128, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", NULL},
    {"b64_l4096_page1", 64, 4096, 32, 8, 128, 1, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", NULL},
    {"b64_l4096_page128", 64, 4096, 32, 8, 128, 128, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", NULL},
    {"b64_l4096_f16_g8", 64, 4096, 64, 8, 128, 32, AP_DTYPE_F16, AP_DTYPE_F16, "auto", NULL},
    {"b64_l4096_fp8_f16", 64, 4096, 32, 8, 128, 16, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, "auto", NULL},
    {"b32_l4096_d64_g1", 32, 4096, 16, 16, 64, 16, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", NULL},
    {"b32_l4096_d256_g2", 32, 4096, 16, 8, 256, 64, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", NULL},
    {"b32_l4096_d256_fp8", 32, 4096, 16, 8, 256, 16, AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, "auto",
     NULL},
    {"b16_l3001_d64_fp8_g7", 16, 3001, 28, 4, 64, 8, AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, "auto",
     NULL},
    {"b3_l77_g3", 3, 77, 6, 2, 128, 4, AP_DTYPE_BF16, AP_DTYPE_BF16, "auto", NULL},
    {"b3_l77_fp8_g3", 3, 77, 6, 2, 128, 4, AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, "auto", "16"},
    {"b2_l999_fp8_d64_split", 2, 999, 16, 2, 64, 2, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, "auto", "16"},
    {"b2_l20000_split_mix", 2, 20000, 8, 1, 64, 64, AP_DTYPE_F16, AP_DTYPE_F16, "auto", "16"},
};

// ---- random fill on the device (counter-based, never zeros) ---------------------------------

__device__ static float uniform_at(unsigned long long seed, size_t i) {
    unsigned long long z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return 2.0f * (float)(z >> 40) * (1.0f / 16777216.0f) - 1.0f;
}

__global__ static void fill_kernel(void *data, size_t count, int kind, float bound,
                                   unsigned long long seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = bound * uniform_at(seed, i);
        if (kind == AP_DTYPE_BF16)
            ((__nv_bfloat16 *)data)[i] = __float2bfloat16_rn(x);
        else if (kind == AP_DTYPE_F16)
            ((__half *)data)[i] = __float2half_rn(x);
        else
            ((unsigned char *)data)[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    }
}

static void fill(void *data, size_t count, ap_dtype dtype, float bound, unsigned long long seed) {
    fill_kernel<<<1024, 256>>>(data, count, (int)dtype, bound, seed);
    CHECK_CUDA(cudaGetLastError());
}

static size_t elem_bytes(ap_dtype d) {
    return d == AP_DTYPE_FP8_E4M3 ? 1 : 2;
}

static double to_double(const void *base, size_t i, ap_dtype d) {
    if (d == AP_DTYPE_BF16) return ap_bf16_to_float(((const uint16_t *)base)[i]);
    if (d == AP_DTYPE_F16) return ap_f16_to_float(((const uint16_t *)base)[i]);
    return ap_fp8_e4m3_to_float(((const uint8_t *)base)[i]);
}

static DLTensor tensor(void *data, ap_dtype d, int ndim, int64_t *shape) {
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCUDA;
    t.device.device_id = 0;
    t.ndim = ndim;
    t.shape = shape;
    t.dtype.lanes = 1;
    t.dtype.bits = d == AP_DTYPE_F32 ? 32 : 16;
    t.dtype.code = d == AP_DTYPE_BF16 ? kDLBfloat : kDLFloat;
    return t;
}

// float64 attention of sequence s, all its query heads, over the host copy of the cache.
static void reference(const Case &c, int s, const std::vector<uint8_t> &q_host,
                      const std::vector<uint8_t> &k_host, const std::vector<uint8_t> &v_host,
                      const std::vector<int32_t> &page_table, int pages_per_seq, float scale,
                      float k_scale, float v_scale, std::vector<double> &out,
                      std::vector<double> &lse) {
    const int group = c.hq / c.hk;
    out.assign((size_t)c.hq * c.dim, 0.0);
    lse.assign(c.hq, 0.0);
    std::vector<double> logits(c.len);
    for (int h = 0; h < c.hq; h++) {
        const int kvh = h / group;
        double mx = -INFINITY;
        for (int j = 0; j < c.len; j++) {
            int64_t slot =
                (int64_t)page_table[(size_t)s * pages_per_seq + j / c.page] * c.page + j % c.page;
            size_t row = ((size_t)slot * c.hk + kvh) * c.dim;
            double dot = 0;
            for (int d = 0; d < c.dim; d++)
                dot += to_double(q_host.data(), ((size_t)s * c.hq + h) * c.dim + d, c.q_dtype) *
                       to_double(k_host.data(), row + d, c.kv_dtype) * k_scale;
            logits[j] = dot * scale;
            mx = std::max(mx, logits[j]);
        }
        double den = 0;
        for (int j = 0; j < c.len; j++) den += exp(logits[j] - mx);
        for (int j = 0; j < c.len; j++) {
            int64_t slot =
                (int64_t)page_table[(size_t)s * pages_per_seq + j / c.page] * c.page + j % c.page;
            size_t row = ((size_t)slot * c.hk + kvh) * c.dim;
            double p = exp(logits[j] - mx) / den;
            for (int d = 0; d < c.dim; d++)
                out[(size_t)h * c.dim + d] +=
                    p * to_double(v_host.data(), row + d, c.kv_dtype) * v_scale;
        }
        lse[h] = mx + log(den);
    }
}

struct Plugin {
    const ap_descriptor *desc;
};

static int run_case(const Plugin &plugin, const Case &c, const ap_device &dev, int runs) {
    const ap_vtable *vt = plugin.desc->vtable;
    char text[2048];
    ap_msgbuf msg = {sizeof(ap_msgbuf), text, sizeof text, 0};
    text[0] = 0;
    ap_model model;
    memset(&model, 0, sizeof model);
    model.struct_size = sizeof model;
    model.name = c.name;
    model.kind = AP_ATTN_MHA;
    model.num_qo_heads = c.hq;
    model.num_kv_heads = c.hk;
    model.head_dim_qk = model.head_dim_v = c.dim;
    model.dtype = c.q_dtype;
    model.kv_dtype = c.kv_dtype;
    model.page_size = c.page;
    model.num_layers = 1;
    model.causal = 1;
    model.max_batch = c.batch;
    model.max_tokens = c.batch;
    model.max_kv_len = c.len;
    ap_option_kv extra[2] = {{"split_kv", c.split}, {"decode_warps_per_sm", c.warps_per_sm}};
    ap_options options;
    memset(&options, 0, sizeof options);
    options.struct_size = sizeof options;
    options.prefix_cache = options.chunked_prefill = options.cuda_graphs = AP_OPTION_UNSET;
    options.extra = extra;
    options.num_extra = c.warps_per_sm != NULL ? 2 : 1;
    ap_backend *be = NULL;
    if (vt->create(&model, &options, &dev, &be, &msg) != AP_OK) {
        printf("%-22s create refused: %s\n", c.name, text);
        return 1;
    }
    // pages: each sequence ceil(len/page) pages drawn from a shuffled pool with spares
    const int pps = (c.len + c.page - 1) / c.page;
    const int pool = c.batch * pps + 7;
    std::vector<int32_t> perm(pool);
    for (int i = 0; i < pool; i++) perm[i] = i;
    unsigned long long rng = 12345;
    for (int i = pool - 1; i > 0; i--) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        std::swap(perm[i], perm[(int)((rng >> 33) % (unsigned long long)(i + 1))]);
    }
    std::vector<int32_t> indptr(c.batch + 1), last(c.batch), lens(c.batch), qo(c.batch + 1);
    for (int i = 0; i <= c.batch; i++) indptr[i] = i * pps, qo[i] = i;
    for (int i = 0; i < c.batch; i++) last[i] = c.len - (pps - 1) * c.page, lens[i] = c.len;
    std::vector<int32_t> table(perm.begin(), perm.begin() + (size_t)c.batch * pps);
    int32_t *d_ints;
    const size_t nints = (c.batch + 1) * 2 + c.batch * 2 + table.size();
    CHECK_CUDA(cudaMalloc(&d_ints, nints * 4));
    int32_t *d_qo = d_ints, *d_indptr = d_qo + c.batch + 1, *d_last = d_indptr + c.batch + 1;
    int32_t *d_lens = d_last + c.batch, *d_table = d_lens + c.batch;
    CHECK_CUDA(cudaMemcpy(d_qo, qo.data(), qo.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_indptr, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_last, last.data(), last.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));

    const size_t cache_elems = (size_t)pool * c.page * c.hk * c.dim;
    const size_t cache_bytes = cache_elems * elem_bytes(c.kv_dtype);
    const double kv_read = 2.0 * c.batch * (double)c.len * c.hk * c.dim * elem_bytes(c.kv_dtype);
    int layers = (int)std::min<double>(16.0, std::max(1.0, ceil(400e6 / kv_read)));
    std::vector<void *> kc(layers), vc(layers);
    for (int l = 0; l < layers; l++) {
        CHECK_CUDA(cudaMalloc(&kc[l], cache_bytes));
        CHECK_CUDA(cudaMalloc(&vc[l], cache_bytes));
        fill(kc[l], cache_elems, c.kv_dtype, c.kv_dtype == AP_DTYPE_FP8_E4M3 ? 8.f : 1.f, 100 + l);
        fill(vc[l], cache_elems, c.kv_dtype, c.kv_dtype == AP_DTYPE_FP8_E4M3 ? 8.f : 1.f, 200 + l);
    }
    const size_t q_elems = (size_t)c.batch * c.hq * c.dim;
    void *d_q, *d_out;
    float *d_lse;
    CHECK_CUDA(cudaMalloc(&d_q, q_elems * 2));
    CHECK_CUDA(cudaMalloc(&d_out, q_elems * 2));
    CHECK_CUDA(cudaMalloc(&d_lse, (size_t)c.batch * c.hq * 4));
    fill(d_q, q_elems, c.q_dtype, 1.f, 7);
    CHECK_CUDA(cudaMemset(d_out, 0xff, q_elems * 2)); // NaN poison
    CHECK_CUDA(cudaMemset(d_lse, 0xff, (size_t)c.batch * c.hq * 4));

    ap_batch batch;
    memset(&batch, 0, sizeof batch);
    batch.struct_size = sizeof batch;
    batch.mode = AP_MODE_DECODE;
    batch.num_seqs = batch.num_tokens = c.batch;
    batch.max_q_len = 1;
    batch.max_seq_len = c.len;
    batch.num_pages_total = (int32_t)table.size();
    batch.qo_indptr = d_qo, batch.kv_page_indptr = d_indptr, batch.kv_page_indices = d_table;
    batch.kv_last_page_len = d_last, batch.seq_lens = d_lens;
    batch.qo_indptr_host = qo.data(), batch.kv_page_indptr_host = indptr.data();
    batch.kv_page_indices_host = table.data(), batch.kv_last_page_len_host = last.data();
    batch.seq_lens_host = lens.data();
    if (vt->init_metadata(be, &batch, NULL, &msg) != AP_OK) {
        printf("%-22s init_metadata failed: %s\n", c.name, text);
        return 1;
    }
    int64_t q_shape[3] = {c.batch, c.hq, c.dim}, lse_shape[2] = {c.batch, c.hq};
    DLTensor tq = tensor(d_q, c.q_dtype, 3, q_shape), tout = tensor(d_out, c.q_dtype, 3, q_shape);
    DLTensor tlse = tensor(d_lse, AP_DTYPE_F32, 2, lse_shape);
    ap_forward_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.q = &tq, args.out = &tout, args.lse = &tlse;
    const float k_scale = c.kv_dtype == AP_DTYPE_FP8_E4M3 ? 0.05f : 1.f;
    const float v_scale = c.kv_dtype == AP_DTYPE_FP8_E4M3 ? 0.11f : 1.f;
    std::vector<ap_kv_cache> kv(layers);
    std::vector<ap_layer> layer(layers);
    for (int l = 0; l < layers; l++) {
        kv[l] = ap_kv_cache{sizeof(ap_kv_cache),
                            AP_KV_LAYOUT_NHD,
                            c.kv_dtype,
                            c.page,
                            pool,
                            c.hk,
                            c.dim,
                            c.dim,
                            kc[l],
                            vc[l],
                            NULL,
                            NULL};
        layer[l] = ap_layer{
            sizeof(ap_layer), l, 1.f / sqrtf((float)c.dim), 0.f, k_scale, v_scale, -1, &kv[l]};
    }
    // correctness: layer 0, a few sequences against float64
    if (vt->forward_decode(be, &layer[0], &args, NULL, &msg) != AP_OK) {
        printf("%-22s forward_decode failed: %s\n", c.name, text);
        return 1;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint8_t> q_host(q_elems * 2), out_host(q_elems * 2), k_host(cache_bytes),
        v_host(cache_bytes);
    std::vector<float> lse_host((size_t)c.batch * c.hq);
    CHECK_CUDA(cudaMemcpy(q_host.data(), d_q, q_elems * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(out_host.data(), d_out, q_elems * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(lse_host.data(), d_lse, lse_host.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(k_host.data(), kc[0], cache_bytes, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(v_host.data(), vc[0], cache_bytes, cudaMemcpyDeviceToHost));
    size_t unwritten = 0;
    for (size_t i = 0; i < q_elems; i++)
        if (!std::isfinite(to_double(out_host.data(), i, c.q_dtype))) unwritten++;
    for (float x : lse_host)
        if (!std::isfinite(x)) unwritten++;
    const int check_seqs[3] = {0, c.batch / 2, c.batch - 1};
    double err2 = 0, ref2 = 0, lse_err = 0;
    std::vector<double> ro, rl;
    for (int k = 0; k < 3; k++) {
        int s = check_seqs[k];
        reference(c, s, q_host, k_host, v_host, table, pps, 1.f / sqrtf((float)c.dim), k_scale,
                  v_scale, ro, rl);
        for (int h = 0; h < c.hq; h++) {
            for (int d = 0; d < c.dim; d++) {
                double got =
                    to_double(out_host.data(), ((size_t)s * c.hq + h) * c.dim + d, c.q_dtype);
                double want = ro[(size_t)h * c.dim + d];
                err2 += (got - want) * (got - want);
                ref2 += want * want;
            }
            lse_err = std::max(lse_err, fabs(lse_host[(size_t)s * c.hq + h] - rl[h]));
        }
    }
    const double rel = sqrt(err2 / ref2);
    const bool ok = unwritten == 0 && rel < 1e-2 && lse_err < 1e-2;

    // timing: warm up, then one event pair per call, rotating the layers
    int failed_calls = 0;
    const std::vector<float> ms = fil_bench_time_calls(5, runs, [&](int i) {
        if (vt->forward_decode(be, &layer[i % layers], &args, NULL, &msg) != AP_OK) failed_calls++;
    });
    if (failed_calls > 0) {
        printf("%-22s forward_decode failed: %s\n", c.name, text);
        return 1;
    }
    const double med = ms[runs / 2];
    printf("%-22s %s rel_l2 %.2e lse_err %.1e unwritten %zu | %8.4f ms (min %.4f) %7.1f GB/s "
           "%9.0f tok/s\n",
           c.name, ok ? "PASS" : "FAIL", rel, lse_err, unwritten, med, (double)ms[0],
           kv_read / med * 1e-6, c.batch / med * 1e3);
    vt->destroy(be);
    for (int l = 0; l < layers; l++) cudaFree(kc[l]), cudaFree(vc[l]);
    cudaFree(d_q), cudaFree(d_out), cudaFree(d_lse), cudaFree(d_ints);
    return ok ? 0 : 1;
}

// Whether `name` is one of the comma-separated names in `list`.
static bool name_listed(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; *p != '\0';) {
        const char *comma = strchr(p, ',');
        const size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        if (comma == NULL) break;
        p = comma + 1;
    }
    return false;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: fil_decode_bench PLUGIN.so [--filter TEXT] [--only NAME,NAME...] "
                        "[--runs N]\n");
        return 2;
    }
    const char *filter = NULL, *only = NULL;
    int runs = 50;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--filter") == 0) filter = argv[i + 1];
        if (strcmp(argv[i], "--only") == 0) only = argv[i + 1];
        if (strcmp(argv[i], "--runs") == 0) runs = atoi(argv[i + 1]);
    }
    const ap_descriptor *desc = fil_bench_open_plugin(argv[1]);
    if (desc == NULL) return 1;
    cudaDeviceProp prop;
    ap_device dev;
    fil_bench_device(&dev, &prop);
    printf("%s, %d SMs; plugin %s %s, archs:", prop.name, prop.multiProcessorCount, desc->name,
           desc->version);
    for (size_t i = 0; i < desc->caps->num_archs; i++)
        printf(" %d/%d", desc->caps->archs[i].sm, (int)desc->caps->archs[i].kind);
    printf("\n");
    Plugin plugin = {desc};
    int failures = 0;
    for (const Case &c : kCases)
        if ((filter == NULL || strstr(c.name, filter) != NULL) &&
            (only == NULL || name_listed(only, c.name)))
            failures += run_case(plugin, c, dev, runs);
    printf("%d failure(s)\n", failures);
    return failures != 0;
}
