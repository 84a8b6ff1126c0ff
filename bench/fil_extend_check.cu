// fil_extend_check.cu: flashinfer_like's extend kernel against a CPU reference, and its timing.
//
// Usage: fil_extend_check test | small | tiny [variant] | bench
//   test   every case below against the float64 reference (run twice: bitwise equal)
//   small  the same cases minus the long ones (for compute-sanitizer memcheck)
//   tiny   one short case (for compute-sanitizer racecheck)
//   bench  B4 S4096 H32/8 D128 causal, and B8 prefix 4096 + 512 new, with sampled checks
// Build with -DFIL_EXTEND_VARIANTS to also check and time the other tilings of head dim 128.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/flashinfer_like/extend.h"
#include "bench/fil_bench_util.h"
#include "tests/gpu/gpu_rand.h"

namespace {

struct extend_case {
    std::string name;
    ap_dtype q_dtype, kv_dtype;
    int head_dim, num_qo_heads, num_kv_heads, page_size, causal, tile_rows;
    std::vector<int> q_lens, prefixes;
    int variant = 0; // benchmark builds: FIL_EXTEND_VARIANT for bf16 head dim 128
};

// The tilings a FIL_EXTEND_VARIANTS build offers for bf16 head dim 128 (fil_extend_variants.cu):
// variant id, rows per CTA, and what it is.
struct extend_variant {
    int id, tile_rows;
    const char *what;
};
#ifdef FIL_EXTEND_VARIANTS
const extend_variant kVariants[] = {
    {0, 128, "default: 2 m-tiles/warp, 64-key tiles, 2 stages, page numbers loaded early"},
    {4, 128, "previous default: page lookups between barrier and MMAs (bf16)"},
    {5, 128, "default + o rescaled on every tile, no branch (bf16)"}};
#else
const extend_variant kVariants[] = {{0, 0, "default"}};
#endif

void variant_select(int id) {
    char text[16];
    snprintf(text, sizeof(text), "%d", id);
    setenv("FIL_EXTEND_VARIANT", text, 1);
}

// ---- host element conversions ----------------------------------------------------------------
uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u); // round to nearest even (inputs are finite)
    return (uint16_t)(u >> 16);
}
float bf16_value(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
uint16_t f16_bits(float x) {
    __half h = __float2half_rn(x);
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}
float f16_value(uint16_t b) {
    __half_raw raw;
    raw.x = b;
    return __half2float(__half(raw));
}
uint16_t to_bits(ap_dtype t, float x) {
    return t == AP_DTYPE_BF16 ? bf16_bits(x) : f16_bits(x);
}
float from_bits(ap_dtype t, uint16_t b) {
    return t == AP_DTYPE_BF16 ? bf16_value(b) : f16_value(b);
}

// ---- one batch on the host, with its float view for the reference ---------------------------
struct host_batch {
    int num_seqs = 0, num_tokens = 0, pool_pages = 0, elem_bytes = 2;
    std::vector<int> qo_indptr, page_indptr, page_indices, last_len, kv_len;
    std::vector<uint16_t> q_bits;        // [tokens][H][D]
    std::vector<uint8_t> k_pool, v_pool; // [pool_pages][page][Hkv][D] elements
    std::vector<float> q, k, v;          // float copies, indexed as the bits
    float k_scale = 1.f, v_scale = 1.f, sm_scale = 1.f;
};

// Positions of live cache slots get random values; every other slot holds NaN, so reading one
// with any weight poisons the output.
void batch_fill(const extend_case &ec, uint64_t seed, host_batch &b) {
    uint64_t rng = seed;
    const int H = ec.num_qo_heads, Hkv = ec.num_kv_heads, D = ec.head_dim, P = ec.page_size;
    const bool fp8 = ec.kv_dtype == AP_DTYPE_FP8_E4M3;
    b.num_seqs = (int)ec.q_lens.size();
    b.elem_bytes = fp8 ? 1 : 2;
    b.qo_indptr.assign(1, 0);
    b.page_indptr.assign(1, 0);
    b.last_len.clear();
    b.kv_len.clear();
    for (int i = 0; i < b.num_seqs; ++i) {
        const int kv = ec.prefixes[i] + ec.q_lens[i];
        const int pages = std::max(1, (kv + P - 1) / P);
        b.qo_indptr.push_back(b.qo_indptr.back() + ec.q_lens[i]);
        b.page_indptr.push_back(b.page_indptr.back() + pages);
        b.last_len.push_back(kv - (pages - 1) * P);
        b.kv_len.push_back(kv);
    }
    b.num_tokens = b.qo_indptr.back();
    b.pool_pages = b.page_indptr.back() + 3; // a few pages no sequence owns
    std::vector<int> perm(b.pool_pages);
    for (int i = 0; i < b.pool_pages; ++i) perm[i] = i;
    for (int i = b.pool_pages - 1; i > 0; --i)
        std::swap(perm[i], perm[gpu_rand_below(&rng, (uint32_t)i + 1)]);
    b.page_indices.assign(perm.begin(), perm.begin() + b.page_indptr.back());

    b.q.resize((size_t)b.num_tokens * H * D);
    b.q_bits.resize(b.q.size());
    for (size_t i = 0; i < b.q.size(); ++i) {
        b.q_bits[i] = to_bits(ec.q_dtype, gpu_rand_uniform(&rng, -2.f, 2.f));
        b.q[i] = from_bits(ec.q_dtype, b.q_bits[i]);
    }
    const size_t pool = (size_t)b.pool_pages * P * Hkv * D;
    b.k.assign(pool, NAN);
    b.v.assign(pool, NAN);
    b.k_pool.assign(pool * b.elem_bytes, 0);
    b.v_pool.assign(pool * b.elem_bytes, 0);
    b.k_scale = fp8 ? 0.0125f : 1.f;
    b.v_scale = fp8 ? 0.02f : 1.f;
    b.sm_scale = 1.f / sqrtf((float)D);
    auto store = [&](std::vector<uint8_t> &bytes, std::vector<float> &vals, size_t i, float x,
                     float scale) {
        if (fp8) {
            __nv_fp8_e4m3 e(x / scale);
            memcpy(&bytes[i], &e, 1);
            vals[i] = (float)e * scale;
        } else {
            const uint16_t bits = to_bits(ec.kv_dtype, x);
            memcpy(&bytes[2 * i], &bits, 2);
            vals[i] = from_bits(ec.kv_dtype, bits);
        }
    };
    const uint16_t nan16 = ec.kv_dtype == AP_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
    for (size_t i = 0; i < pool; ++i) { // NaN everywhere first
        if (fp8) {
            b.k_pool[i] = b.v_pool[i] = 0x7f;
        } else {
            memcpy(&b.k_pool[2 * i], &nan16, 2);
            memcpy(&b.v_pool[2 * i], &nan16, 2);
        }
    }
    for (int s = 0; s < b.num_seqs; ++s)
        for (int p = 0; p < b.kv_len[s]; ++p) {
            const int page = b.page_indices[b.page_indptr[s] + p / P];
            const size_t row = ((size_t)page * P + p % P) * Hkv;
            for (size_t e = row * D; e < (row + Hkv) * D; ++e) {
                store(b.k_pool, b.k, e, gpu_rand_uniform(&rng, -1.f, 1.f), b.k_scale);
                store(b.v_pool, b.v, e, gpu_rand_uniform(&rng, -1.f, 1.f), b.v_scale);
            }
        }
}

// Reference output row (float64) of new token j of sequence s, query head h; returns the LSE.
double reference_row(const extend_case &ec, const host_batch &b, int s, int j, int h,
                     std::vector<double> &out) {
    const int H = ec.num_qo_heads, Hkv = ec.num_kv_heads, D = ec.head_dim, P = ec.page_size;
    const int kvh = h / (H / Hkv);
    const int q_len = b.qo_indptr[s + 1] - b.qo_indptr[s];
    const int limit = ec.causal ? b.kv_len[s] - q_len + j + 1 : b.kv_len[s];
    const float *q = &b.q[((size_t)(b.qo_indptr[s] + j) * H + h) * D];
    std::vector<double> logits(limit);
    double mx = -INFINITY;
    for (int p = 0; p < limit; ++p) {
        const int page = b.page_indices[b.page_indptr[s] + p / P];
        const float *k = &b.k[(((size_t)page * P + p % P) * Hkv + kvh) * D];
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += (double)q[d] * k[d];
        logits[p] = dot * b.sm_scale;
        mx = std::max(mx, logits[p]);
    }
    out.assign(D, 0.0);
    double sum = 0;
    for (int p = 0; p < limit; ++p) {
        const double w = exp(logits[p] - mx);
        sum += w;
        const int page = b.page_indices[b.page_indptr[s] + p / P];
        const float *v = &b.v[(((size_t)page * P + p % P) * Hkv + kvh) * D];
        for (int d = 0; d < D; ++d) out[d] += w * v[d];
    }
    for (int d = 0; d < D; ++d) out[d] /= sum;
    return mx + log(sum);
}

// ---- the batch on the device ------------------------------------------------------------------
struct device_batch {
    void *q = nullptr, *out = nullptr, *k = nullptr, *v = nullptr, *items = nullptr;
    float *lse = nullptr;
    int *qo_indptr = nullptr, *page_indptr = nullptr, *page_indices = nullptr, *last_len = nullptr;
    std::vector<uint8_t> items_host;
    fil_extend_plan plan{};
};

template <typename T> T *upload(const std::vector<T> &host) {
    T *dev = nullptr;
    CHECK_CUDA(cudaMalloc(&dev, std::max<size_t>(host.size(), 1) * sizeof(T)));
    if (!host.empty())
        CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return dev;
}

bool plan_setup(const extend_case &ec, const host_batch &b, device_batch &d);

bool device_setup(const extend_case &ec, const host_batch &b, bool with_lse, device_batch &d) {
    d.q = upload(b.q_bits);
    d.k = upload(b.k_pool);
    d.v = upload(b.v_pool);
    d.qo_indptr = upload(b.qo_indptr);
    d.page_indptr = upload(b.page_indptr);
    d.page_indices = upload(b.page_indices);
    d.last_len = upload(b.last_len);
    const size_t out_elems = (size_t)std::max(b.num_tokens, 1) * ec.num_qo_heads * ec.head_dim;
    CHECK_CUDA(cudaMalloc(&d.out, out_elems * 2));
    if (with_lse)
        CHECK_CUDA(cudaMalloc(&d.lse, (size_t)std::max(b.num_tokens, 1) * ec.num_qo_heads * 4));
    return plan_setup(ec, b, d);
}

// (Re)builds the plan of an uploaded batch for ec.tile_rows.
bool plan_setup(const extend_case &ec, const host_batch &b, device_batch &d) {
    if (d.items) CHECK_CUDA(cudaFree(d.items));
    const size_t bytes = fil_extend_plan_bytes(b.num_tokens, b.num_seqs, ec.head_dim,
                                               ec.num_qo_heads, ec.num_kv_heads);
    d.items_host.resize(bytes);
    CHECK_CUDA(cudaMalloc(&d.items, std::max<size_t>(bytes, 16)));
    fil_extend_plan_args pa{};
    pa.num_seqs = b.num_seqs;
    pa.qo_indptr_host = b.qo_indptr.data();
    pa.kv_page_indptr_host = b.page_indptr.data();
    pa.kv_last_page_len_host = b.last_len.data();
    pa.page_size = ec.page_size;
    pa.head_dim = ec.head_dim;
    pa.num_qo_heads = ec.num_qo_heads;
    pa.num_kv_heads = ec.num_kv_heads;
    pa.causal = ec.causal;
    pa.tile_rows = ec.tile_rows;
    pa.host_scratch = d.items_host.data();
    pa.device_buffer = d.items;
    pa.buffer_bytes = bytes;
    char text[512] = "";
    ap_msgbuf msg = {sizeof(ap_msgbuf), text, sizeof(text), 0};
    ap_status st = fil_extend_plan_build(&pa, nullptr, &d.plan, &msg);
    if (st != AP_OK) {
        printf("  plan failed (%d): %s\n", (int)st, text);
        return false;
    }
    return true;
}

fil_attn_params device_params(const extend_case &ec, const host_batch &b, const device_batch &d) {
    fil_attn_params p{};
    p.q = d.q;
    p.out = d.out;
    p.lse = d.lse;
    p.q_dtype = ec.q_dtype;
    p.num_seqs = b.num_seqs;
    p.num_tokens = b.num_tokens;
    p.num_qo_heads = ec.num_qo_heads;
    p.sm_scale = b.sm_scale;
    p.causal = ec.causal;
    p.qo_indptr = d.qo_indptr;
    p.kv.k_pages = d.k;
    p.kv.v_pages = d.v;
    p.kv.kv_dtype = ec.kv_dtype;
    p.kv.page_size = ec.page_size;
    p.kv.num_kv_heads = ec.num_kv_heads;
    p.kv.head_dim = ec.head_dim;
    p.kv.k_scale = b.k_scale;
    p.kv.v_scale = b.v_scale;
    p.kv.kv_page_indptr = d.page_indptr;
    p.kv.kv_page_indices = d.page_indices;
    p.kv.kv_last_page_len = d.last_len;
    return p;
}

void device_free(device_batch &d) {
    void *ptrs[] = {d.q,           d.out,          d.k,       d.v, d.items, d.lse, d.qo_indptr,
                    d.page_indptr, d.page_indices, d.last_len};
    for (void *p : ptrs) CHECK_CUDA(cudaFree(p));
}

bool run_once(const extend_case &ec, const host_batch &b, device_batch &d,
              std::vector<uint16_t> &out, std::vector<float> &lse) {
    const size_t n = (size_t)b.num_tokens * ec.num_qo_heads;
    CHECK_CUDA(cudaMemset(d.out, 0xff, std::max<size_t>(n, 1) * ec.head_dim * 2)); // NaN
    if (d.lse) CHECK_CUDA(cudaMemset(d.lse, 0xff, std::max<size_t>(n, 1) * 4));
    fil_attn_params p = device_params(ec, b, d);
    char text[512] = "";
    ap_msgbuf msg = {sizeof(ap_msgbuf), text, sizeof(text), 0};
    ap_status st = fil_extend_run(&p, &d.plan, nullptr, &msg);
    if (st != AP_OK) {
        printf("  run failed (%d): %s\n", (int)st, text);
        return false;
    }
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    out.resize(n * ec.head_dim);
    lse.resize(n);
    if (n > 0) {
        CHECK_CUDA(cudaMemcpy(out.data(), d.out, out.size() * 2, cudaMemcpyDeviceToHost));
        if (d.lse) CHECK_CUDA(cudaMemcpy(lse.data(), d.lse, n * 4, cudaMemcpyDeviceToHost));
    }
    return true;
}

// Compares rows (token t of sequence s, head h) of `out` with the reference: relative L2 error
// over the rows, the largest LSE error, and whether any element was left unwritten (NaN).
struct row_error {
    double err2 = 0, ref2 = 0, lse_max = 0;
    long nan_count = 0;
};
void compare_row(const extend_case &ec, const host_batch &b, int s, int j, int h,
                 const std::vector<uint16_t> &out, const std::vector<float> &lse, bool with_lse,
                 row_error &e) {
    std::vector<double> ref;
    const double ref_lse = reference_row(ec, b, s, j, h, ref);
    const size_t row = (size_t)(b.qo_indptr[s] + j) * ec.num_qo_heads + h;
    for (int d = 0; d < ec.head_dim; ++d) {
        const float got = from_bits(ec.q_dtype, out[row * ec.head_dim + d]);
        if (std::isnan(got)) ++e.nan_count;
        e.err2 += (got - ref[d]) * (got - ref[d]);
        e.ref2 += ref[d] * ref[d];
    }
    if (with_lse) {
        if (std::isnan(lse[row])) ++e.nan_count;
        e.lse_max = std::max(e.lse_max, std::fabs(lse[row] - ref_lse));
    }
}

bool check_case(const extend_case &ec, uint64_t seed) {
    variant_select(ec.variant);
    host_batch b;
    batch_fill(ec, seed, b);
    device_batch d;
    const bool with_lse = true;
    bool ok = device_setup(ec, b, with_lse, d);
    std::vector<uint16_t> out1, out2;
    std::vector<float> lse1, lse2;
    ok = ok && run_once(ec, b, d, out1, lse1) && run_once(ec, b, d, out2, lse2);
    if (ok) {
        row_error e;
        for (int s = 0; s < b.num_seqs; ++s)
            for (int j = 0; j < b.qo_indptr[s + 1] - b.qo_indptr[s]; ++j)
                for (int h = 0; h < ec.num_qo_heads; ++h)
                    compare_row(ec, b, s, j, h, out1, lse1, with_lse, e);
        const double rel = sqrt(e.err2 / std::max(e.ref2, 1e-30));
        const bool same = out1 == out2 && memcmp(lse1.data(), lse2.data(), lse1.size() * 4) == 0;
        ok = e.nan_count == 0 && rel < 1e-2 && e.lse_max < 1e-3 && same;
        printf("%-4s %-34s rows %6d items %4d  rel_l2 %.2e  lse_err %.1e  nan %ld  repeat %s\n",
               ok ? "ok" : "FAIL", ec.name.c_str(), b.num_tokens * ec.num_qo_heads,
               d.plan.num_items, rel, e.lse_max, e.nan_count, same ? "same" : "DIFFERS");
    } else {
        printf("FAIL %s (seed %llu)\n", ec.name.c_str(), (unsigned long long)seed);
    }
    device_free(d);
    return ok;
}

std::vector<extend_case> test_cases(bool small) {
    const ap_dtype BF = AP_DTYPE_BF16, F16 = AP_DTYPE_F16, E4 = AP_DTYPE_FP8_E4M3;
    std::vector<extend_case> cases = {
        {"bf16 d128 g4 p16 causal mixed",
         BF,
         BF,
         128,
         8,
         2,
         16,
         1,
         0,
         {1, 77, 300, 0, 129},
         {0, 45, 0, 10, 1000}},
        {"f16 d64 g1 p1 causal", F16, F16, 64, 4, 4, 1, 1, 0, {33, 200, 1}, {7, 0, 500}},
        {"bf16 d256 g8 p128 causal", BF, BF, 256, 16, 2, 128, 1, 0, {150, 5, 1}, {130, 0, 1}},
        {"bf16+fp8 d128 g3 p32 causal", BF, E4, 128, 6, 2, 32, 1, 0, {100, 1, 64}, {37, 64, 0}},
        {"f16+fp8 d64 g5 p8 noncausal", F16, E4, 64, 10, 2, 8, 0, 0, {70, 3}, {10, 0}},
        {"bf16 d128 g6 p64 noncausal", BF, BF, 128, 12, 2, 64, 0, 0, {65, 1}, {0, 300}},
        {"f16+fp8 d256 g2 p2 causal", F16, E4, 256, 4, 2, 2, 1, 0, {90}, {3}},
        {"bf16 d128 g7 p4 causal", BF, BF, 128, 7, 1, 4, 1, 0, {40, 19}, {17, 0}},
        {"f16 d128 g1 p16 causal", F16, F16, 128, 2, 2, 16, 1, 0, {257}, {31}},
        {"bf16+fp8 d256 g1 p16 noncausal", BF, E4, 256, 2, 2, 16, 0, 0, {45}, {70}},
        {"bf16 d128 g2 p3 causal", BF, BF, 128, 4, 2, 3, 1, 0, {0, 95, 1}, {4, 11, 2}},
        {"f16 d64 g8 p5 causal", F16, F16, 64, 8, 1, 5, 1, 0, {37, 2}, {0, 9}},
    };
    if (!small) {
        cases.push_back({"bf16 d128 g4 p16 causal long",
                         BF,
                         BF,
                         128,
                         8,
                         2,
                         16,
                         1,
                         0,
                         {1000, 1, 513},
                         {0, 2000, 777}});
        cases.push_back({"bf16 d64 g2 p32 causal long", BF, BF, 64, 4, 2, 32, 1, 0, {700}, {300}});
    }
    const size_t base = cases.size();
    for (size_t i = 0; i < base; ++i) {
        if (cases[i].head_dim != 128) continue;
        for (const extend_variant &var : kVariants) {
            if (var.id == 0) continue;
            if (cases[i].q_dtype != AP_DTYPE_BF16 || cases[i].kv_dtype != AP_DTYPE_BF16)
                continue; // the variants are built for bf16 only
            extend_case v = cases[i];
            v.variant = var.id;
            v.tile_rows = var.tile_rows;
            v.name += " [v" + std::to_string(var.id) + "]";
            cases.push_back(v);
        }
    }
    return cases;
}

bool plan_rejects_bad_batches() {
    // A last page longer than the page, and more new tokens than cached ones.
    int qo[] = {0, 5}, pages[] = {0, 1}, last_bad[] = {17}, last_short[] = {3};
    std::vector<uint8_t> scratch(4096);
    fil_extend_plan_args pa{};
    pa.num_seqs = 1;
    pa.qo_indptr_host = qo;
    pa.kv_page_indptr_host = pages;
    pa.page_size = 16;
    pa.head_dim = 128;
    pa.num_qo_heads = 8;
    pa.num_kv_heads = 2;
    pa.causal = 1;
    pa.host_scratch = scratch.data();
    pa.device_buffer = scratch.data(); // never reached: the checks come first
    pa.buffer_bytes = scratch.size();
    fil_extend_plan plan{};
    char text[256] = "";
    ap_msgbuf msg = {sizeof(ap_msgbuf), text, sizeof(text), 0};
    pa.kv_last_page_len_host = last_bad;
    const bool bad1 = fil_extend_plan_build(&pa, nullptr, &plan, &msg) == AP_ERR_SHAPE_MISMATCH;
    pa.kv_last_page_len_host = last_short;
    const bool bad2 = fil_extend_plan_build(&pa, nullptr, &plan, &msg) == AP_ERR_SHAPE_MISMATCH;
    msg.length = 0;
    const bool bad3 = fil_extend_check_config(96, AP_DTYPE_BF16, AP_DTYPE_F16, 9, 1, 16, &msg) ==
                      AP_ERR_UNSUPPORTED;
    printf("%-4s plan and config refuse bad input (%s)\n", bad1 && bad2 && bad3 ? "ok" : "FAIL",
           text);
    return bad1 && bad2 && bad3;
}

// ---- timing -----------------------------------------------------------------------------------
// Times fil_extend_run over `sets` input sets (rotated, together larger than L2) for every tile
// variant built, after checking sampled rows of set 0 against the reference.
void bench_shape(extend_case ec, const char *label, int sets, double flops, uint64_t seed) {
    std::vector<host_batch> hb(sets);
    std::vector<device_batch> db(sets);
    for (int i = 0; i < sets; ++i) {
        batch_fill(ec, seed + i, hb[i]);
        if (!device_setup(ec, hb[i], false, db[i])) return;
    }
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    for (const extend_variant &var : kVariants) {
        if (var.id != 0 && (ec.head_dim != 128 || ec.num_kv_heads == ec.num_qo_heads))
            continue; // the other tilings are timed on the GQA head-dim-128 shapes only
        if (var.id != 0 && (ec.q_dtype != AP_DTYPE_BF16 || ec.kv_dtype != AP_DTYPE_BF16)) continue;
        variant_select(var.id);
        ec.tile_rows = var.id == 0 ? 0 : var.tile_rows; // 0: what the head dim is built with
        for (int i = 0; i < sets; ++i)
            if (!plan_setup(ec, hb[i], db[i])) return;
        std::vector<uint16_t> out;
        std::vector<float> lse;
        if (!run_once(ec, hb[0], db[0], out, lse)) return;
        uint64_t rng = seed * 7 + 1;
        row_error e;
        long unwritten = 0;
        for (size_t i = 0; i < out.size(); ++i)
            unwritten += std::isnan(from_bits(ec.q_dtype, out[i]));
        for (int r = 0; r < 96; ++r) {
            const int s = (int)gpu_rand_below(&rng, hb[0].num_seqs);
            const int q_len = hb[0].qo_indptr[s + 1] - hb[0].qo_indptr[s];
            const int j = r % 8 == 0 ? q_len - 1 : (int)gpu_rand_below(&rng, q_len);
            compare_row(ec, hb[0], s, j, (int)gpu_rand_below(&rng, ec.num_qo_heads), out, lse,
                        false, e);
        }
        const double rel = sqrt(e.err2 / e.ref2);
        std::vector<float> ms;
        for (int it = 0; it < 70; ++it) {
            device_batch &d = db[it % sets];
            fil_attn_params p = device_params(ec, hb[it % sets], d);
            CHECK_CUDA(cudaEventRecord(start));
            ap_status st = fil_extend_run(&p, &d.plan, nullptr, nullptr);
            CHECK_CUDA(cudaEventRecord(stop));
            CHECK_CUDA(cudaEventSynchronize(stop));
            CHECK_CUDA(cudaGetLastError());
            if (st != AP_OK) return;
            float t;
            CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
            if (it >= 10) ms.push_back(t); // the first ten are warm-up
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        printf("%-4s %-38s v%d rows %3d  median %7.3f ms (min %.3f max %.3f) %6.1f TFLOP/s  "
               "sampled rel_l2 %.2e unwritten %ld\n",
               rel < 1e-2 && unwritten == 0 ? "ok" : "FAIL", label, var.id, db[0].plan.tile_rows,
               med, ms.front(), ms.back(), flops / (med * 1e-3) / 1e12, rel, unwritten);
        fflush(stdout);
    }
    for (auto &d : db) device_free(d);
    CHECK_CUDA(cudaEventDestroy(start));
    CHECK_CUDA(cudaEventDestroy(stop));
}

void bench_all() {
    const ap_dtype BF = AP_DTYPE_BF16;
    const double S = 4096;
    extend_case causal = {
        "", BF, BF, 128, 32, 8, 16, 1, 0, std::vector<int>(4, 4096), std::vector<int>(4, 0)};
    // The causal count GPU.md uses, 2*B*H*S*S*D: the work actually done in both products.
    bench_shape(causal, "B4 S4096 H32/8 D128 causal p16", 2, 2.0 * 4 * 32 * S * S * 128, 11);
    extend_case prefix = {
        "", BF, BF, 128, 32, 8, 16, 1, 0, std::vector<int>(8, 512), std::vector<int>(8, 4096)};
    // 4*H*D per attended (query, key) pair: new token j sees 4096 + j + 1 keys.
    const double pairs = 8.0 * (512.0 * 4096 + 512.0 * 513 / 2);
    bench_shape(prefix, "B8 prefix 4096 + 512 new D128 p16", 2, 4.0 * 32 * 128 * pairs, 21);
    extend_case full = causal;
    full.causal = 0;
    bench_shape(full, "B4 S4096 H32/8 D128 noncausal p16", 2, 4.0 * 4 * 32 * S * S * 128, 31);
    extend_case page1 = causal;
    page1.page_size = 1;
    bench_shape(page1, "B4 S4096 H32/8 D128 causal p1", 2, 2.0 * 4 * 32 * S * S * 128, 41);
    extend_case fp8 = causal;
    fp8.kv_dtype = AP_DTYPE_FP8_E4M3;
    bench_shape(fp8, "B4 S4096 H32/8 D128 causal p16 fp8 KV", 2, 2.0 * 4 * 32 * S * S * 128, 51);
    extend_case mha = causal;
    mha.num_kv_heads = 32;
    bench_shape(mha, "B4 S4096 H32/32 D128 causal p16", 2, 2.0 * 4 * 32 * S * S * 128, 61);
    extend_case d64 = causal;
    d64.head_dim = 64;
    bench_shape(d64, "B4 S4096 H32/8 D64 causal p16", 2, 2.0 * 4 * 32 * S * S * 64, 71);
    extend_case d256 = causal;
    d256.head_dim = 256;
    d256.num_qo_heads = 16;
    d256.num_kv_heads = 4;
    bench_shape(d256, "B4 S4096 H16/4 D256 causal p16", 2, 2.0 * 4 * 16 * S * S * 256, 81);
}

} // namespace

int main(int argc, char **argv) {
    const std::string mode = argc > 1 ? argv[1] : "test";
    for (const extend_variant &var : kVariants) printf("variant %d: %s\n", var.id, var.what);
    int dev = 0;
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    bool ok = true;
    if (mode == "bench") {
        bench_all();
        return 0;
    }
    ok = plan_rejects_bad_batches() && ok;
    std::vector<extend_case> cases = test_cases(mode != "test");
    if (mode == "tiny") { // tiny [variant]
        cases = {{"bf16 d128 g4 p16 tiny",
                  AP_DTYPE_BF16,
                  AP_DTYPE_BF16,
                  128,
                  8,
                  2,
                  16,
                  1,
                  0,
                  {70, 1},
                  {30, 5}}};
        cases[0].variant = argc > 2 ? atoi(argv[2]) : 0;
        cases[0].tile_rows = 0; // every variant has the default's 128 rows
    }
    uint64_t seed = 1234;
    for (const extend_case &ec : cases) ok = check_case(ec, seed++) && ok;
    printf("%s\n", ok ? "ALL PASSED" : "SOME FAILED");
    return ok ? 0 : 1;
}
