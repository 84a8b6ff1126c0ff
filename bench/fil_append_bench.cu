// fil_append_bench.cu: flashinfer_like's append_kv/1 hook alone: CUDA-event timing and GB/s.
//
// Opens the plugin file directly (no core), calls the hook on random q, k, v (never zeros) with
// shuffled cache slots, rotating among enough input sets that a call does not find its inputs in
// L2, and prints the median time per call and the bytes moved once per second against a
// device-to-device copy measured in the same process. Beside the hook, it times append_rope.cu's
// launch linked in twice (fil_append_variants.cu: fil_append_rope_run_staged, the previous
// kernel; fil_append_rope_run_rows, the plugin's choice), twice each, and checks
// that the two write the same bytes with q rotated in place and three tokens out of range.
// Correctness against cpu_ref is the GPU harness's job (tests/gpu, the append_rope_* cases).
// Usage: fil_append_bench PLUGIN.so [--runs N]
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "backends/flashinfer_like/fil.h"
#include "bench/fil_bench_util.h"
#include "plugin_api.h"

extern "C" ap_status fil_append_rope_run_staged(const fil_append_rope_params *p, void *stream,
                                                ap_msgbuf *msg);
extern "C" ap_status fil_append_rope_run_rows(const fil_append_rope_params *p, void *stream,
                                              ap_msgbuf *msg);
typedef ap_status (*fil_launcher)(const fil_append_rope_params *, void *, ap_msgbuf *);

struct Case {
    const char *name;
    int tokens, hq, hk, dim, rotary, neox, page;
    ap_dtype kv_dtype;
};

static const Case kCases[] = {
    {"decode_t64_bf16", 64, 32, 8, 128, 128, 1, 16, AP_DTYPE_BF16},
    {"decode_t64_fp8", 64, 32, 8, 128, 128, 1, 16, AP_DTYPE_FP8_E4M3},
    {"decode_t64_fp8_gptj64", 64, 32, 8, 128, 64, 0, 16, AP_DTYPE_FP8_E4M3},
    {"prefill_t16384_bf16", 16384, 32, 8, 128, 128, 1, 16, AP_DTYPE_BF16},
    {"prefill_t16384_fp8", 16384, 32, 8, 128, 128, 1, 16, AP_DTYPE_FP8_E4M3},
    {"prefill_t16384_fp8_gptj64", 16384, 32, 8, 128, 64, 0, 16, AP_DTYPE_FP8_E4M3},
};

__global__ static void fill_kernel(__nv_bfloat16 *data, size_t count, unsigned long long seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        data[i] = __float2bfloat16_rn(4.0f * (float)(z >> 40) * (1.0f / 16777216.0f) - 2.0f);
    }
}

static DLTensor tensor(void *data, DLDataTypeCode code, int bits, int ndim, int64_t *shape) {
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.shape = shape;
    t.dtype.code = (uint8_t)code;
    t.dtype.bits = (uint8_t)bits;
    t.dtype.lanes = 1;
    return t;
}

template <typename F> static float median_ms(int runs, F &&call) {
    return fil_bench_time_calls(3, runs, call)[runs / 2];
}

// Runs the staged and the rows launchers on two copies of input set 0 (q rotated in place) into
// two caches poisoned alike, with tokens 1, 2 and 3 out of range (position past the table, slot
// -1, position -5), and counts the bytes that differ: q, k, v and both caches must agree, and
// token 1's q row must be left as it was. Returns the count (0: same).
template <typename P>
static size_t check_same(const fil_append_rope_params &prm, P &&point, const __nv_bfloat16 *qkv,
                         size_t per_set, const std::vector<int32_t> &host, int64_t slots,
                         int max_position) {
    const int64_t tokens = prm.num_tokens;
    const size_t kv_elem = prm.kv_dtype == AP_DTYPE_FP8_E4M3 ? 1 : 2;
    const size_t cache_bytes = (size_t)prm.num_slots * prm.num_kv_heads * prm.head_dim * kv_elem;
    std::vector<int32_t> ints(2 * tokens);
    for (int64_t t = 0; t < tokens; t++) {
        ints[t] = host[t];
        ints[tokens + t] = host[slots + t];
    }
    if (tokens > 3) {
        ints[1] = max_position;
        ints[tokens + 2] = -1;
        ints[3] = -5;
    }
    int32_t *dints;
    CHECK_CUDA(cudaMalloc(&dints, ints.size() * 4));
    CHECK_CUDA(cudaMemcpy(dints, ints.data(), ints.size() * 4, cudaMemcpyHostToDevice));
    std::vector<uint8_t> out[2][3];
    size_t failures = 0;
    char text[512] = "";
    ap_msgbuf msg = {sizeof(ap_msgbuf), text, sizeof text, 0};
    const fil_launcher launchers[2] = {fil_append_rope_run_staged, fil_append_rope_run_rows};
    for (int v = 0; v < 2; v++) {
        __nv_bfloat16 *in;
        void *kc, *vc;
        CHECK_CUDA(cudaMalloc(&in, per_set * 2));
        CHECK_CUDA(cudaMalloc(&kc, cache_bytes));
        CHECK_CUDA(cudaMalloc(&vc, cache_bytes));
        CHECK_CUDA(cudaMemcpy(in, qkv, per_set * 2, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaMemset(kc, 0x5a, cache_bytes));
        CHECK_CUDA(cudaMemset(vc, 0x5a, cache_bytes));
        fil_append_rope_params pp = prm;
        point(pp, in, dints, dints + tokens);
        pp.k_pages = kc;
        pp.v_pages = vc;
        if (launchers[v](&pp, NULL, &msg) != AP_OK) {
            printf("launcher %d: %s\n", v, text);
            failures++;
        }
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaGetLastError());
        out[v][0].resize(per_set * 2);
        out[v][1].resize(cache_bytes);
        out[v][2].resize(cache_bytes);
        CHECK_CUDA(cudaMemcpy(out[v][0].data(), in, per_set * 2, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(out[v][1].data(), kc, cache_bytes, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(out[v][2].data(), vc, cache_bytes, cudaMemcpyDeviceToHost));
        cudaFree(in), cudaFree(kc), cudaFree(vc);
    }
    cudaFree(dints);
    size_t differ = failures, written = 0;
    for (int b = 0; b < 3; b++)
        for (size_t i = 0; i < out[0][b].size(); i++) {
            differ += out[0][b][i] != out[1][b][i];
            written += b > 0 && out[1][b][i] != 0x5a;
        }
    const size_t row = (size_t)prm.num_qo_heads * prm.head_dim * 2; // token 1's q, untouched?
    std::vector<uint8_t> orig(row);
    if (tokens > 3) {
        CHECK_CUDA(
            cudaMemcpy(orig.data(), (const uint8_t *)qkv + row, row, cudaMemcpyDeviceToHost));
        differ += memcmp(orig.data(), out[1][0].data() + row, row) != 0;
    }
    printf("  check staged vs rows: %zu bytes differ, %zu cache bytes written\n", differ, written);
    return differ;
}

static int run_case(const ap_descriptor *desc, const Case &c, const ap_device &dev, int runs,
                    double copy_gbs) {
    const ap_vtable *vt = desc->vtable;
    char text[1024] = "";
    ap_msgbuf msg = {sizeof(ap_msgbuf), text, sizeof text, 0};
    ap_model model;
    memset(&model, 0, sizeof model);
    model.struct_size = sizeof model;
    model.kind = AP_ATTN_MHA;
    model.num_qo_heads = c.hq;
    model.num_kv_heads = c.hk;
    model.head_dim_qk = model.head_dim_v = c.dim;
    model.dtype = AP_DTYPE_BF16;
    model.kv_dtype = c.kv_dtype;
    model.page_size = c.page;
    model.num_layers = 1;
    model.causal = 1;
    model.max_batch = c.tokens;
    model.max_tokens = c.tokens;
    model.max_kv_len = 8192;
    ap_options options;
    memset(&options, 0, sizeof options);
    options.struct_size = sizeof options;
    options.prefix_cache = options.chunked_prefill = options.cuda_graphs = AP_OPTION_UNSET;
    ap_backend *be = NULL;
    if (vt->create(&model, &options, &dev, &be, &msg) != AP_OK) {
        printf("%-28s create refused: %s\n", c.name, text);
        return 1;
    }
    ap_hook_append_kv_v1 hook = (ap_hook_append_kv_v1)vt->get_hook(be, AP_HOOK_APPEND_KV_V1);
    if (hook == NULL) {
        printf("%-28s no append_kv/1 hook\n", c.name);
        vt->destroy(be);
        return 1;
    }
    const size_t kv_elem = c.kv_dtype == AP_DTYPE_FP8_E4M3 ? 1 : 2;
    const size_t q_bytes = (size_t)c.tokens * c.hq * c.dim * 2;
    const size_t k_bytes = (size_t)c.tokens * c.hk * c.dim * 2;
    // bytes moved once: q read + written, k and v read, k and v cache rows written, the int32
    // positions and slots, one cos/sin row per token
    const double bytes = 2.0 * q_bytes + 2.0 * k_bytes + 2.0 * c.tokens * c.hk * c.dim * kv_elem +
                         8.0 * c.tokens + 4.0 * c.tokens * c.rotary;
    const int sets = std::max(1, (int)(256e6 / bytes)); // > 5x the 50 MB L2 across the sets
    const int max_position = 8192;
    const int64_t slots = (int64_t)c.tokens * sets;
    const int pages = (int)((slots + c.page - 1) / c.page);
    __nv_bfloat16 *qkv;
    void *kc, *vc;
    int32_t *ints;
    float *cos_sin;
    const size_t per_set = (q_bytes + 2 * k_bytes) / 2; // elements
    CHECK_CUDA(cudaMalloc(&qkv, per_set * 2 * sets));
    CHECK_CUDA(cudaMalloc(&kc, (size_t)pages * c.page * c.hk * c.dim * kv_elem));
    CHECK_CUDA(cudaMalloc(&vc, (size_t)pages * c.page * c.hk * c.dim * kv_elem));
    CHECK_CUDA(cudaMalloc(&ints, (size_t)2 * slots * sizeof(int32_t)));
    CHECK_CUDA(cudaMalloc(&cos_sin, (size_t)max_position * c.rotary * sizeof(float)));
    fill_kernel<<<1024, 256>>>(qkv, per_set * sets, 1234 + c.tokens);
    CHECK_CUDA(cudaGetLastError());
    std::vector<int32_t> host(2 * slots);
    std::vector<int32_t> perm(slots);
    for (int64_t i = 0; i < slots; i++) perm[i] = (int32_t)i;
    srand(7);
    for (int64_t i = slots - 1; i > 0; i--) std::swap(perm[i], perm[rand() % (i + 1)]);
    for (int64_t i = 0; i < slots; i++) {
        host[i] = (int32_t)(rand() % max_position); // positions
        host[slots + i] = perm[i];                  // out_loc
    }
    std::vector<float> table((size_t)max_position * c.rotary);
    for (int p = 0; p < max_position; p++)
        for (int i = 0; i < c.rotary / 2; i++) {
            double angle = p * pow(10000.0, -2.0 * i / c.rotary);
            table[(size_t)p * c.rotary + i] = (float)cos(angle);
            table[(size_t)p * c.rotary + c.rotary / 2 + i] = (float)sin(angle);
        }
    CHECK_CUDA(cudaMemcpy(ints, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(cos_sin, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    ap_kv_cache kv;
    memset(&kv, 0, sizeof kv);
    kv.struct_size = sizeof kv;
    kv.layout = AP_KV_LAYOUT_NHD;
    kv.dtype = c.kv_dtype;
    kv.page_size = c.page;
    kv.num_pages = pages;
    kv.num_kv_heads = c.hk;
    kv.head_dim_qk = kv.head_dim_v = c.dim;
    kv.k_pages = kc;
    kv.v_pages = vc;
    ap_layer layer;
    memset(&layer, 0, sizeof layer);
    layer.struct_size = sizeof layer;
    layer.sm_scale = 0.088f;
    layer.k_scale = 0.0625f;
    layer.v_scale = 0.03125f;
    layer.window_left = -1;
    layer.kv = &kv;
    int64_t q_shape[3] = {c.tokens, c.hq, c.dim}, k_shape[3] = {c.tokens, c.hk, c.dim};
    int64_t t_shape[1] = {c.tokens}, cs_shape[2] = {max_position, c.rotary};
    int failed = 0;
    auto call = [&](int i) {
        __nv_bfloat16 *base = qkv + per_set * (size_t)(i % sets);
        DLTensor q = tensor(base, kDLBfloat, 16, 3, q_shape); // rotated in place
        DLTensor k = tensor(base + q_bytes / 2, kDLBfloat, 16, 3, k_shape);
        DLTensor v = tensor(base + q_bytes / 2 + k_bytes / 2, kDLBfloat, 16, 3, k_shape);
        DLTensor pos = tensor(ints + (size_t)c.tokens * (i % sets), kDLInt, 32, 1, t_shape);
        DLTensor loc = tensor(ints + slots + (size_t)c.tokens * (i % sets), kDLInt, 32, 1, t_shape);
        DLTensor cs = tensor(cos_sin, kDLFloat, 32, 2, cs_shape);
        ap_append_kv_args args = {sizeof args, &q, &q, &k, &v, &pos, &loc, &cs, c.rotary, c.neox};
        if (hook(be, &layer, &args, NULL, &msg) != AP_OK) failed = 1;
    };
    fil_append_rope_params prm;
    memset(&prm, 0, sizeof prm);
    prm.in_dtype = AP_DTYPE_BF16;
    prm.k_pages = kc;
    prm.v_pages = vc;
    prm.kv_dtype = c.kv_dtype;
    prm.positions_stride = prm.out_loc_stride = 1;
    prm.cos_sin = cos_sin;
    prm.max_position = max_position;
    prm.rotary_dim = c.rotary;
    prm.is_neox = c.neox;
    prm.num_qo_heads = c.hq;
    prm.num_kv_heads = c.hk;
    prm.head_dim = c.dim;
    prm.num_slots = (int64_t)pages * c.page;
    prm.num_tokens = c.tokens;
    prm.k_scale = layer.k_scale;
    prm.v_scale = layer.v_scale;
    auto point = [&](fil_append_rope_params &pp, __nv_bfloat16 *base, const int32_t *pos,
                     const int32_t *loc) {
        pp.q = pp.q_out = base;
        pp.k = base + q_bytes / 2;
        pp.v = base + q_bytes / 2 + k_bytes / 2;
        pp.positions = pos;
        pp.out_loc = loc;
    };
    const int mismatch = check_same(prm, point, qkv, per_set, host, slots, max_position);
    if (mismatch) failed = 1;
    float direct[2][2];
    const fil_launcher launchers[2] = {fil_append_rope_run_staged, fil_append_rope_run_rows};
    for (int rep = 0; rep < 2; rep++)
        for (int v = 0; v < 2; v++)
            direct[v][rep] = median_ms(runs, [&](int i) {
                fil_append_rope_params pp = prm;
                point(pp, qkv + per_set * (size_t)(i % sets), ints + (size_t)c.tokens * (i % sets),
                      ints + slots + (size_t)c.tokens * (i % sets));
                if (launchers[v](&pp, NULL, &msg) != AP_OK) failed = 1;
            });
    const float ms = median_ms(runs, call);
    if (failed) printf("%-28s hook failed: %s\n", c.name, text);
    const double gbs = bytes / ms * 1e-6;
    printf("%-26s %s hook %8.2f us %6.0f GB/s (%2.0f%%) | staged %8.2f/%8.2f us %6.0f GB/s | rows "
           "%8.2f/%8.2f us %6.0f GB/s (%2.0f%%) | %8.1f KB\n",
           c.name, failed ? "FAIL" : "ok  ", ms * 1e3, gbs, 100 * gbs / copy_gbs,
           direct[0][0] * 1e3, direct[0][1] * 1e3, bytes / direct[0][0] * 1e-6, direct[1][0] * 1e3,
           direct[1][1] * 1e3, bytes / direct[1][0] * 1e-6,
           100 * bytes / direct[1][0] * 1e-6 / copy_gbs, bytes / 1024);
    vt->destroy(be);
    cudaFree(qkv), cudaFree(kc), cudaFree(vc), cudaFree(ints), cudaFree(cos_sin);
    return failed;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: fil_append_bench PLUGIN.so [--runs N]\n");
        return 2;
    }
    int runs = 200;
    for (int i = 2; i + 1 < argc; i += 2)
        if (strcmp(argv[i], "--runs") == 0) runs = atoi(argv[i + 1]);
    const ap_descriptor *desc = fil_bench_open_plugin(argv[1]);
    if (desc == NULL) return 1;
    cudaDeviceProp prop;
    ap_device dev;
    fil_bench_device(&dev, &prop);
    // the ceiling: a 1 GiB device-to-device copy, bytes read + written
    const size_t copy_bytes = (size_t)1 << 30;
    void *a, *b;
    CHECK_CUDA(cudaMalloc(&a, copy_bytes));
    CHECK_CUDA(cudaMalloc(&b, copy_bytes));
    CHECK_CUDA(cudaMemset(a, 1, copy_bytes));
    const float copy_ms = median_ms(
        20, [&](int) { CHECK_CUDA(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice)); });
    const double copy_gbs = 2.0 * copy_bytes / copy_ms * 1e-6;
    cudaFree(a), cudaFree(b);
    printf("%s, %d SMs; device-to-device copy %.0f GB/s (read + write)\n", prop.name,
           prop.multiProcessorCount, copy_gbs);
    int failures = 0;
    for (const Case &c : kCases) failures += run_case(desc, c, dev, runs, copy_gbs);
    printf("%d case(s) failed\n", failures);
    return failures != 0;
}
