/* hopper_prefill_check.cu: the kit's Hopper prefill kernel (backends/common/prefill_hopper.cuh)
 * against a double-precision host reference on ragged batches and paged caches (pages 8..256,
 * shuffled, unowned slots NaN; every output element and LSE checked, outputs poisoned first),
 * head dims 128/128, 64/64, 256/256 and 192/128 (MLA's MHA form), fp8 K/V (ragged 128/128 and
 * 192/128: against the reference of Q split into two e4m3 terms as the kernel does, and against
 * exact Q; LSE within kLseF8 = 1e-2 there, the fp8 accumulation), then its timing on B4 S4096
 * H32/8 and H32/32 D128 (ragged, and paged with page 16), B4 S4096 H32/8 D64 and D256 and MLA
 * prefill B1 S4096 H128 qk192/v128.
 * Usage: hopper_prefill_check [--no-bench | --bench-only | --quick | --time | --time-dim D |
 * --time-paged | --time-f8 | --profile V | --match TEXT].
 * Exit 1 on any failed case. */
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "../backends/common/prefill_hopper.cuh"
#include "hopper_paged_cache.h"

#ifdef HOPPER_CHECK_KIT
#include "../backends/common/prefill.h"
#endif

using namespace ap_hopper;

#define CK(x) \
    do { \
        cudaError_t e_ = (x); \
        if (e_ != cudaSuccess) { \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            std::exit(2); \
        } \
    } while (0)

struct Case {
    const char *name;
    bool fp16;
    bool causal;
    int hq, hkv;
    std::vector<int> q_lens, kv_lens;
    int dqk = 128; /* Q/K head dim; V is Geo's kDv wide (dv_of: kDim with dqk 192, else dqk) */
    int page = 0;  /* > 0: K/V from a paged cache of this page size, pages shuffled */
    /* > 0: a sequence's key t scaled by 1 + grow * (kv_len - 1 - t) / kv_len, so the scores grow
     * tile after tile (the kernel runs them from the last down) and the running max moves */
    float grow = 0.f;
    bool fp8 = false; /* K/V fp8_e4m3 (ragged, dqk 128 or 192) */
};

struct Batch {
    std::vector<int> qo, kv;
    std::vector<Item> items;
    int tq, tkv;
};

/* The V head dim that goes with a Q/K head dim (Geo<kD>::kDv). */
static int dv_of(int dqk) {
    return dqk == 192 ? kDim : dqk;
}

/* The largest GQA pack_shift of a case (Params.pack_shift: the group's heads in one work tile, a
 * power of two dividing the group), the one the kit's dispatch takes where it packs
 * (pack_shift_for). */
static int pack_shift_of(const Case &c) {
    const int group = c.hq / c.hkv;
    return __builtin_ctz(static_cast<unsigned>(group));
}

/* The batch and its plan items, work tiles of the kernel's rows (tile_rows_of: its head dim and
 * source) >> ps tokens (ps: Params.pack_shift). */
static Batch make_batch(const Case &c, int ps = 0) {
    const int tile = tile_rows_of(c.dqk, c.page > 0 ? kPagedTile : kRagged) >> ps;
    Batch b;
    b.qo.push_back(0);
    b.kv.push_back(0);
    for (size_t i = 0; i < c.q_lens.size(); ++i) {
        b.qo.push_back(b.qo.back() + c.q_lens[i]);
        b.kv.push_back(b.kv.back() + c.kv_lens[i]);
    }
    std::vector<std::pair<int, Item>> order;
    for (size_t i = 0; i < c.q_lens.size(); ++i) {
        for (int mb = 0; mb * tile < c.q_lens[i]; ++mb) {
            int end = c.kv_lens[i];
            if (c.causal) {
                end = std::min(end, c.kv_lens[i] - c.q_lens[i] + mb * tile + tile);
            }
            /* the kit plan's item for a work tile (prefill_internal.h) */
            order.push_back(
                {-end, Item{static_cast<int32_t>(i), mb * tile,
                            (end + AP_KIT_PREFILL_TILE_KV - 1) / AP_KIT_PREFILL_TILE_KV, 0}});
        }
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const auto &a, const auto &b) { return a.first < b.first; });
    for (auto &o : order) {
        b.items.push_back(o.second);
    }
    b.tq = b.qo.back();
    b.tkv = b.kv.back();
    return b;
}

static float round16(float x, bool fp16) {
    return fp16 ? __half2float(__float2half_rn(x)) : __bfloat162float(__float2bfloat16_rn(x));
}

static void to16(const std::vector<float> &f, std::vector<uint16_t> &h, bool fp16) {
    h.resize(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
        if (fp16) {
            const __half_raw x = __float2half_rn(f[i]);
            h[i] = x.x;
        } else {
            const __nv_bfloat16_raw x = __float2bfloat16_rn(f[i]);
            h[i] = x.x;
        }
    }
}

static float from16(uint16_t v, bool fp16) {
    if (fp16) {
        __half_raw x;
        x.x = v;
        return __half2float(__half(x));
    }
    __nv_bfloat16_raw x;
    x.x = v;
    return __bfloat162float(__nv_bfloat16(x));
}

/* --time's schedule overrides: g_persistent -1 takes use_persistent's rule (and for the paged
 * source paged_source's kernel), else 0 / 1 (the paged source: kPagedTile / kPagedRing, whose
 * grids follow use_persistent); g_band 0 takes band_kv_for's band, else that many K/V heads;
 * g_dynamic -1 takes use_dynamic's rule, 0 the rounds, 1 the dynamic schedule wherever the
 * kernel has it. g_min_kv_tiles: the fewest KV tiles of an item of the batch launched (its
 * last), which use_dynamic asks for (set by the caller of launch). */
static int g_persistent = -1, g_band = 0, g_dynamic = -1;
static int g_last_src = kRagged; /* the K/V source of launch's last launch (paged: its kernel) */
static int32_t g_min_kv_tiles = 0;
static bool g_last_dynamic = false; /* whether launch_src's last launch took the dynamic schedule */

/* The dynamic schedule's two counters (at 0, and left at 0 by every launch), once. */
static int32_t *tile_counters() {
    static int32_t *counters = nullptr;
    if (counters == nullptr) {
        CK(cudaMalloc(&counters, 16));
        CK(cudaMemset(counters, 0, 16));
        CK(cudaDeviceSynchronize());
    }
    return counters;
}

/* Whether the dynamic schedule's counters are back at 0 after a launch (every launch, on either
 * schedule, must leave them so); else a FAIL line for case `name` (`where`: a prefix naming the
 * path) and the counters reset for the next launch. */
static bool counters_at_zero(const char *name, const char *where) {
    int32_t left[2] = {-1, -1};
    CK(cudaMemcpy(left, tile_counters(), sizeof left, cudaMemcpyDeviceToHost));
    if (left[0] == 0 && left[1] == 0) {
        return true;
    }
    std::printf("FAIL %-28s %sthe tile counters left at %d, %d\n", name, where, left[0], left[1]);
    CK(cudaMemset(tile_counters(), 0, 16));
    return false;
}

/* The fewest KV tiles of the items (the plan's order puts them last). */
static int32_t min_kv_tiles(const std::vector<Item> &items) {
    return items.empty() ? 0 : items.back().kv_tiles;
}

/* Launches one variant; returns 0 or a map error. */
template <typename T, int kMode, int kD, int kPaged>
static int launch_src(const void *q, const void *k, const void *v, int tq, int tkv, int hq, int hkv,
                      const Params &p, int num_items, cudaStream_t st) {
    CUtensorMap mq, mk, mv;
    const int page = 1 << p.page_shift;
    constexpr int kDv = Geo<kD>::kDv, kN = Geo<kD, kPaged>::kKeys;
    if (q_map(&mq, q, tq, hq, kD, p.pack_shift, Geo<kD, kPaged>::kTileRows) ||
        (kPaged != kRagged
             ? make_paged_map(&mk, k, hkv, page, kD, kN) ||
                   make_paged_map(&mv, v, hkv, page, kDv, kN)
             : make_map(&mk, k, tkv, hkv, kD, kN) || make_map(&mv, v, tkv, hkv, kDv, kN))) {
        return -1;
    }
    static bool attr = false; /* one per instantiation */
    if (!attr) {
        CK(cudaFuncSetAttribute(prefill_hopper_kernel<T, kMode, kD, kPaged>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                Geo<kD, kPaged>::kSmem));
        attr = true;
    }
    Params pn = p;
    pn.num_items = num_items;
    /* the dispatch's schedule, or --time's overrides */
    const dim3 grid = launch_schedule(pn, kD, kPaged, kPaged != kRagged ? -1 : g_persistent);
    if (g_band > 0) {
        pn.band_kv = g_band;
    }
    use_dynamic<kD, kMode, kPaged>(pn, tile_counters(), g_dynamic == 0 ? 0 : g_min_kv_tiles,
                                   g_dynamic == 1);
    g_last_dynamic = pn.queue_items > 0;
    prefill_hopper_kernel<T, kMode, kD, kPaged>
        <<<grid, Geo<kD, kPaged>::kThreads, Geo<kD, kPaged>::kSmem, st>>>(mq, mk, mv, pn);
    return 0;
}

/* The paged source when p.kv_page_indices is set (k, v: the caches), else the ragged one. */
template <typename T, int kMode, int kD>
static int launch(const void *q, const void *k, const void *v, int tq, int tkv, int hq, int hkv,
                  const Params &p, int num_items, cudaStream_t st) {
    if constexpr (kD == 128 || kD == 64) {
        if (p.kv_page_indices != nullptr) {
            g_last_src = g_persistent < 0   ? paged_source(p.group, kD)
                         : g_persistent > 0 ? kPagedRing
                                            : kPagedTile;
            if (g_last_src == kPagedRing) {
                return launch_src<T, kMode, kD, kPagedRing>(q, k, v, tq, tkv, hq, hkv, p, num_items,
                                                            st);
            }
            return launch_src<T, kMode, kD, kPagedTile>(q, k, v, tq, tkv, hq, hkv, p, num_items,
                                                        st);
        }
    }
    g_last_src = kRagged;
    return launch_src<T, kMode, kD, kRagged>(q, k, v, tq, tkv, hq, hkv, p, num_items, st);
}

template <int kMode, int kD>
static int launch_d(bool fp16, const void *q, const void *k, const void *v, int tq, int tkv, int hq,
                    int hkv, const Params &p, int num_items, cudaStream_t st) {
    if (fp16) {
        return launch<__half, kMode, kD>(q, k, v, tq, tkv, hq, hkv, p, num_items, st);
    }
    return launch<__nv_bfloat16, kMode, kD>(q, k, v, tq, tkv, hq, hkv, p, num_items, st);
}

template <int kMode>
static int launch_t(int dqk, bool fp16, const void *q, const void *k, const void *v, int tq,
                    int tkv, int hq, int hkv, const Params &p, int num_items, cudaStream_t st) {
    if (dqk == 192) {
        return launch_d<kMode, 192>(fp16, q, k, v, tq, tkv, hq, hkv, p, num_items, st);
    }
    if (dqk == 64) {
        return launch_d<kMode, 64>(fp16, q, k, v, tq, tkv, hq, hkv, p, num_items, st);
    }
    if (dqk == 256) {
        return launch_d<kMode, 256>(fp16, q, k, v, tq, tkv, hq, hkv, p, num_items, st);
    }
    return launch_d<kMode, 128>(fp16, q, k, v, tq, tkv, hq, hkv, p, num_items, st);
}

/* The fp8 K/V kernel (ragged): k, v fp8 bytes. */
template <typename T, int kD>
static int launch_f8(const void *q, const void *k, const void *v, int tq, int tkv, int hq, int hkv,
                     const Params &p, int num_items, cudaStream_t st) {
    CUtensorMap mq, mk, mv;
    if (q_map(&mq, q, tq, hq, kD, p.pack_shift) || make_map_f8(&mk, k, tkv, hkv, kD) ||
        make_map_f8(&mv, v, tkv, hkv, 128)) {
        return -1;
    }
    static bool attr = false;
    if (!attr) {
        CK(cudaFuncSetAttribute(prefill_hopper_f8_kernel<T, kD>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, GeoF8<kD>::kSmem));
        attr = true;
    }
    Params pn = p;
    pn.num_items = num_items;
    const dim3 grid = launch_schedule(pn, kD, kRagged);
    g_last_dynamic = false; /* the fp8 kernel has no dynamic schedule */
    prefill_hopper_f8_kernel<T, kD><<<grid, kThreads, GeoF8<kD>::kSmem, st>>>(mq, mk, mv, pn);
    return 0;
}

static int launch_f8_any(int dqk, bool fp16, const void *q, const void *k, const void *v, int tq,
                         int tkv, int hq, int hkv, const Params &p, int num_items,
                         cudaStream_t st) {
    if (dqk == 192) {
        return fp16 ? launch_f8<__half, 192>(q, k, v, tq, tkv, hq, hkv, p, num_items, st)
                    : launch_f8<__nv_bfloat16, 192>(q, k, v, tq, tkv, hq, hkv, p, num_items, st);
    }
    return fp16 ? launch_f8<__half, 128>(q, k, v, tq, tkv, hq, hkv, p, num_items, st)
                : launch_f8<__nv_bfloat16, 128>(q, k, v, tq, tkv, hq, hkv, p, num_items, st);
}

static const int kVariants = 3;
static const char *const kVariant[kVariants] = {"plain", "overlap", "overlap+pingpong"};

/* The kernel's consumer modes (prefill_hopper_kernel's kMode). */
static int launch_any(int variant, int dqk, bool fp16, const void *q, const void *k, const void *v,
                      int tq, int tkv, int hq, int hkv, const Params &p, int num_items,
                      cudaStream_t st) {
    switch (variant) {
        case 0: return launch_t<0>(dqk, fp16, q, k, v, tq, tkv, hq, hkv, p, num_items, st);
        case 1: return launch_t<1>(dqk, fp16, q, k, v, tq, tkv, hq, hkv, p, num_items, st);
        default: return launch_t<2>(dqk, fp16, q, k, v, tq, tkv, hq, hkv, p, num_items, st);
    }
}

static void reference(const Case &c, const Batch &b, const std::vector<float> &q,
                      const std::vector<float> &k, const std::vector<float> &v, float scale,
                      std::vector<double> &out, std::vector<double> &lse) {
    const int hq = c.hq, hkv = c.hkv, D = dv_of(c.dqk), DK = c.dqk, group = hq / hkv;
    out.assign(static_cast<size_t>(b.tq) * hq * D, 0.0);
    lse.assign(static_cast<size_t>(b.tq) * hq, -INFINITY);
    std::vector<std::pair<int, int>> jobs;
    for (size_t s = 0; s + 1 < b.qo.size(); ++s) {
        for (int r = b.qo[s]; r < b.qo[s + 1]; ++r) {
            jobs.push_back({static_cast<int>(s), r});
        }
    }
    const unsigned nt = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nt; ++t) {
        th.emplace_back([&, t]() {
            std::vector<double> sc;
            for (size_t j = t; j < jobs.size(); j += nt) {
                const int s = jobs[j].first, r = jobs[j].second;
                const int qlen = b.qo[s + 1] - b.qo[s], kvlen = b.kv[s + 1] - b.kv[s];
                const int i = r - b.qo[s];
                int lim = kvlen;
                if (c.causal) {
                    lim = std::min(kvlen, kvlen - qlen + i + 1);
                }
                for (int h = 0; h < hq; ++h) {
                    const float *qr = &q[(static_cast<size_t>(r) * hq + h) * DK];
                    const int hk = h / group;
                    sc.assign(std::max(lim, 0), 0.0);
                    double mx = -INFINITY;
                    for (int n = 0; n < lim; ++n) {
                        const float *kr = &k[(static_cast<size_t>(b.kv[s] + n) * hkv + hk) * DK];
                        double acc = 0;
                        for (int d = 0; d < DK; ++d) {
                            acc += static_cast<double>(qr[d]) * kr[d];
                        }
                        sc[n] = acc * scale;
                        mx = std::max(mx, sc[n]);
                    }
                    if (lim <= 0) {
                        continue;
                    }
                    double sum = 0;
                    for (int n = 0; n < lim; ++n) {
                        sc[n] = std::exp(sc[n] - mx);
                        sum += sc[n];
                    }
                    double *o = &out[(static_cast<size_t>(r) * hq + h) * D];
                    for (int n = 0; n < lim; ++n) {
                        const float *vr = &v[(static_cast<size_t>(b.kv[s] + n) * hkv + hk) * D];
                        const double w = sc[n] / sum;
                        for (int d = 0; d < D; ++d) {
                            o[d] += w * vr[d];
                        }
                    }
                    lse[static_cast<size_t>(r) * hq + h] = mx + std::log(sum);
                }
            }
        });
    }
    for (auto &x : th) {
        x.join();
    }
}

/* The fp8 K/V path's LSE tolerance: S comes from fp8 tensor cores, which keep fewer bits than
 * fp32 while they accumulate (about 13-14, DeepSeek-V3's report), so a row's LSE (S itself for a
 * row of few keys) is off by up to ~1e-3 of the logits' scale: 5.0e-3 against Q split as the
 * kernel splits it and 8.2e-3 against exact Q on the "grow" case (logits up to ~10) on the H100,
 * 2026-11-26. The outputs keep the 16-bit path's 1e-2 (measured 1.1e-3 to 2.8e-3). */
constexpr double kLseF8 = 1e-2;

/* Every output element and LSE of one run against the double reference; prints one line. */
static bool compare(const Case &c, const char *what, const void *dout, const float *dlse,
                    size_t n_out, const std::vector<double> &ref,
                    const std::vector<double> &ref_lse, double tol = 1e-2, double lse_tol = 1e-3) {
    std::vector<uint16_t> out(n_out);
    std::vector<float> lse(ref_lse.size());
    CK(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0, maxerr = 0, lse_err = 0;
    size_t bad = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        const double x = from16(out[i], c.fp16);
        if (!std::isfinite(x)) {
            ++bad;
            continue;
        }
        num += (x - ref[i]) * (x - ref[i]);
        den += ref[i] * ref[i];
        maxerr = std::max(maxerr, std::fabs(x - ref[i]));
    }
    for (size_t i = 0; i < lse.size(); ++i) {
        if (std::isinf(ref_lse[i])) {
            if (!(std::isinf(lse[i]) && lse[i] < 0)) {
                ++bad;
            }
            continue;
        }
        if (!std::isfinite(lse[i])) {
            ++bad;
            continue;
        }
        lse_err = std::max(lse_err, std::fabs(lse[i] - ref_lse[i]));
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    const bool pass = bad == 0 && rel < tol && lse_err < lse_tol;
    std::printf("%s %-28s %s rel_l2 %.2e max_abs %.2e lse_err %.2e nonfinite %zu\n",
                pass ? "PASS" : "FAIL", c.name, what, rel, maxerr, lse_err, bad);
    return pass;
}

#ifdef HOPPER_CHECK_KIT
/* The same batch through the kit's entry: ap_kit_prefill_plan_build picks the Hopper kernel
 * (plan.hopper) and ap_kit_prefill_run launches it. */
static bool run_kit(const Case &c, const Batch &b, const Paged &g, const void *dq, const void *dk,
                    const void *dv, const int32_t *dqo, const int32_t *dkv, const Params &kp,
                    void *dout, float *dlse, size_t n_out, float scale,
                    const std::vector<double> &ref, const std::vector<double> &ref_lse) {
    char text[512] = "";
    ap_msgbuf msg = {sizeof(ap_msgbuf), text, sizeof text, 0};
    const int num_seqs = static_cast<int>(b.qo.size()) - 1;
    const size_t bytes =
        ap_kit_prefill_plan_bytes(b.tq, num_seqs, c.dqk, dv_of(c.dqk), c.hq, c.hkv);
    std::vector<uint8_t> scratch(bytes + 16);
    void *dbuf = nullptr;
    CK(cudaMalloc(&dbuf, bytes + 16));
    ap_kit_prefill_plan_args a = {};
    a.num_seqs = num_seqs;
    a.qo_indptr_host = b.qo.data();
    a.kv_indptr_host = c.page > 0 ? nullptr : b.kv.data();
    a.kv_page_indptr_host = g.indptr.data();
    a.kv_last_page_len_host = g.last.data();
    a.page_size = c.page;
    a.head_dim_qk = c.dqk;
    a.head_dim_v = dv_of(c.dqk);
    a.num_qo_heads = c.hq;
    a.num_kv_heads = c.hkv;
    a.causal = c.causal;
    a.host_scratch = scratch.data();
    a.device_buffer = dbuf;
    a.buffer_bytes = bytes;
    a.kv_dtype = c.fp8 ? AP_DTYPE_FP8_E4M3 : c.fp16 ? AP_DTYPE_F16 : AP_DTYPE_BF16;
    a.tile_counters = tile_counters();
    ap_kit_prefill_plan plan = {};
    ap_status st = ap_kit_prefill_plan_build(&a, nullptr, &plan, "check", &msg);
    bool ok = st == AP_OK && plan.hopper == 1;
    if (ok) {
        ap_kit_prefill_params p = {};
        p.q = dq;
        p.out = dout;
        p.lse = dlse;
        p.q_dtype = c.fp16 ? AP_DTYPE_F16 : AP_DTYPE_BF16;
        p.kv_dtype = c.fp8 ? AP_DTYPE_FP8_E4M3 : p.q_dtype;
        p.k_scale = kp.k_scale;
        p.v_scale = kp.v_scale;
        p.head_dim_qk = c.dqk;
        p.head_dim_v = dv_of(c.dqk);
        p.num_qo_heads = c.hq;
        p.num_kv_heads = c.hkv;
        p.causal = c.causal;
        p.sm_scale = scale;
        p.qo_indptr = dqo;
        if (c.page > 0) {
            p.k_pages = dk;
            p.v_pages = dv;
            p.page_size = c.page;
            p.kv_page_indptr = kp.kv_indptr;
            p.kv_page_indices = kp.kv_page_indices;
            p.kv_last_page_len = kp.kv_last_page_len;
        } else {
            p.k = dk;
            p.v = dv;
            p.kv_indptr = dkv;
        }
        CK(cudaMemset(dout, 0xff, n_out * 2));
        CK(cudaMemset(dlse, 0xff, ref_lse.size() * 4));
        st = ap_kit_prefill_run(&p, &plan, nullptr, "check", &msg);
        CK(cudaDeviceSynchronize());
        const bool zero = counters_at_zero(c.name, "kit entry: ");
        ok = st == AP_OK && zero &&
             compare(c, "kit entry", dout, dlse, n_out, ref, ref_lse, 1e-2, c.fp8 ? kLseF8 : 1e-3);
    }
    if (!ok) {
        std::printf("FAIL %-28s kit entry: status %d hopper %d: %s\n", c.name, (int)st, plan.hopper,
                    text);
    }
    cudaFree(dbuf);
    return ok;
}
#endif

static bool run_case(const Case &c, unsigned seed) {
    const Batch b = make_batch(c);
    const int D = dv_of(c.dqk), DK = c.dqk;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> q(static_cast<size_t>(b.tq) * c.hq * DK),
        k(static_cast<size_t>(b.tkv) * c.hkv * DK), v(static_cast<size_t>(b.tkv) * c.hkv * D);
    const size_t n_out = static_cast<size_t>(b.tq) * c.hq * D;
    for (auto *t : {&q, &k, &v}) {
        for (auto &x : *t) {
            x = round16(2.f * u(rng), c.fp16);
        }
    }
    for (size_t i = 0; c.grow > 0.f && i + 1 < b.kv.size(); ++i) {
        const int len = b.kv[i + 1] - b.kv[i];
        for (int r = 0; r < len; ++r) {
            const float f = 1.f + c.grow * static_cast<float>(len - 1 - r) / len;
            float *row = &k[static_cast<size_t>(b.kv[i] + r) * c.hkv * DK];
            for (int e = 0; e < c.hkv * DK; ++e) {
                row[e] = round16(row[e] * f, c.fp16);
            }
        }
    }
    std::vector<uint16_t> hq16, hk16, hv16;
    to16(q, hq16, c.fp16);
    to16(k, hk16, c.fp16);
    to16(v, hv16, c.fp16);
    const float scale = 1.f / std::sqrt(static_cast<float>(DK));
    /* fp8 K/V: stored = e4m3(x / scale) (scales not powers of two), the references read the
     * stored values times the scale; the kernel's Q (QF8: per row, its largest magnitude to 448,
     * hi = e4m3 of it, lo = e4m3 of what hi missed, round to nearest even) for the reference it
     * must match */
    const float ks = 0.0137f, vs = 0.0071f;
    std::vector<uint8_t> k8, v8;
    std::vector<float> q8;
    auto e4m3 = [](float x) {
        return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
    };
    auto from_e4m3 = [](uint8_t x) {
        __nv_fp8_e4m3 f;
        f.__x = x;
        return static_cast<float>(f);
    };
    if (c.fp8) {
        for (auto [t, t8, sc] : {std::make_tuple(&k, &k8, ks), std::make_tuple(&v, &v8, vs)}) {
            t8->resize(t->size());
            for (size_t i = 0; i < t->size(); ++i) {
                (*t8)[i] = e4m3((*t)[i] / sc);
                (*t)[i] = from_e4m3((*t8)[i]) * sc;
            }
        }
        q8.resize(q.size());
        for (size_t row = 0; row * DK < q.size(); ++row) {
            float amax = 0.f;
            for (int d = 0; d < DK; ++d) {
                amax = std::max(amax, std::fabs(q[row * DK + d]));
            }
            const bool any = amax > 1e-30f;
            const float qs = any ? amax * (1.f / 448.f) : 1.f, inv = any ? 448.f / amax : 1.f;
            for (int d = 0; d < DK; ++d) {
                const float x = q[row * DK + d] * inv, hi = from_e4m3(e4m3(x));
                q8[row * DK + d] = (hi + from_e4m3(e4m3(x - hi))) * qs;
            }
        }
    }
    std::vector<double> ref, ref_lse, ref_x, lse_x;
    reference(c, b, c.fp8 ? q8 : q, k, v, scale, ref, ref_lse);
    if (c.fp8) {
        reference(c, b, q, k, v, scale, ref_x, lse_x);
    }
    Paged g;
    int32_t *dpi = nullptr, *dpx = nullptr, *dpl = nullptr;
    if (c.page > 0) {
        g = make_pages(b.kv, c.page, rng, 3);
        hk16 = to_pages(hk16, b.kv, g, c.page, c.hkv, DK);
        hv16 = to_pages(hv16, b.kv, g, c.page, c.hkv, D);
        CK(cudaMalloc(&dpi, g.indptr.size() * 4));
        CK(cudaMalloc(&dpx, std::max<size_t>(g.indices.size(), 1) * 4));
        CK(cudaMalloc(&dpl, std::max<size_t>(g.last.size(), 1) * 4));
        CK(cudaMemcpy(dpi, g.indptr.data(), g.indptr.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dpx, g.indices.data(), g.indices.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dpl, g.last.data(), g.last.size() * 4, cudaMemcpyHostToDevice));
    }

    void *dq, *dk, *dv, *dout;
    float *dlse;
    int32_t *dqo, *dkv;
    Item *ditems;
    CK(cudaMalloc(&dq, hq16.size() * 2 + 16));
    const void *k_src = c.fp8 ? static_cast<const void *>(k8.data()) : hk16.data();
    const void *v_src = c.fp8 ? static_cast<const void *>(v8.data()) : hv16.data();
    const size_t k_bytes = c.fp8 ? k8.size() : hk16.size() * 2;
    const size_t v_bytes = c.fp8 ? v8.size() : hv16.size() * 2;
    CK(cudaMalloc(&dk, std::max<size_t>(k_bytes, 2) + 16));
    CK(cudaMalloc(&dv, std::max<size_t>(v_bytes, 2) + 16));
    CK(cudaMalloc(&dout, n_out * 2 + 16));
    CK(cudaMalloc(&dlse, static_cast<size_t>(b.tq) * c.hq * 4 + 16));
    CK(cudaMalloc(&dqo, b.qo.size() * 4));
    CK(cudaMalloc(&dkv, b.kv.size() * 4));
    /* the work tiles of both packings: one query head (b.items) and the group's heads (packed) */
    const int ps_max = pack_shift_of(c);
    const std::vector<Item> packed = make_batch(c, ps_max).items;
    Item *dpacked;
    CK(cudaMalloc(&ditems, std::max<size_t>(b.items.size(), 1) * sizeof(Item)));
    CK(cudaMalloc(&dpacked, std::max<size_t>(packed.size(), 1) * sizeof(Item)));
    CK(cudaMemcpy(dpacked, packed.data(), packed.size() * sizeof(Item), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq, hq16.data(), hq16.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, k_src, k_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, v_src, v_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dqo, b.qo.data(), b.qo.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dkv, b.kv.data(), b.kv.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ditems, b.items.data(), b.items.size() * sizeof(Item), cudaMemcpyHostToDevice));
    Params p{ditems,
             dqo,
             dkv,
             dout,
             dlse,
             c.hq,
             c.hq / c.hkv,
             c.causal ? 1 : 0,
             scale * 1.4426950408889634f,
             scale,
             nullptr,
             nullptr,
             nullptr,
             0,
             c.hkv,
             static_cast<int32_t>(b.items.size()),
             0,
             c.fp8 ? ks : 1.f,
             c.fp8 ? vs : 1.f,
             0,
             0,
             nullptr,
             0,
             1,
             c.hq};
    if (c.page > 0) {
        p.kv_indptr = dpi;
        p.kv_page_indices = dpx;
        p.kv_last_page_len = dpl;
        p.v_pages = dv;
        p.page_shift = __builtin_ctz(static_cast<unsigned>(c.page));
        p.num_kv_heads = c.hkv;
    }
    /* One launch into poisoned outputs: variant -1 is the fp8 kernel, else the consumer mode;
     * ps the pack_shift (0, or ps_max with the packed items); out_off, bytes from dout to where
     * out starts (8: not 16-byte aligned, the epilogue's 4-byte stores). */
    /* sched: g_dynamic for the launch (-1 the rule, 0 the rounds). After the launch the dynamic
     * schedule's counters must be back at 0 (whichever schedule ran). */
    auto run = [&](int variant, int ps, int out_off = 0, int sched = -1) {
        CK(cudaMemset(dout, 0xff, n_out * 2 + 16));
        CK(cudaMemset(dlse, 0xff, static_cast<size_t>(b.tq) * c.hq * 4));
        p.out = static_cast<uint8_t *>(dout) + out_off;
        p.pack_shift = ps;
        p.items = ps > 0 ? dpacked : ditems;
        const int items = static_cast<int>(ps > 0 ? packed.size() : b.items.size());
        g_min_kv_tiles = min_kv_tiles(ps > 0 ? packed : b.items);
        g_dynamic = sched;
        const int rc = variant < 0 ? launch_f8_any(c.dqk, c.fp16, dq, dk, dv, b.tq, b.tkv, c.hq,
                                                   c.hkv, p, items, 0)
                                   : launch_any(variant, c.dqk, c.fp16, dq, dk, dv, b.tq, b.tkv,
                                                c.hq, c.hkv, p, items, 0);
        g_dynamic = -1;
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        if (rc != 0) {
            std::printf("FAIL %-28s tensor map error %d\n", c.name, rc);
        }
        if (!counters_at_zero(c.name, "")) {
            return false;
        }
        return rc == 0;
    };
    bool ok = true;
    for (int ps = 0; ps <= ps_max; ps += ps_max > 0 ? ps_max : 1) {
        char what[64];
        if (c.fp8) {
            std::snprintf(what, sizeof what, "fp8 kernel%s", ps > 0 ? " packed" : "");
            if (run(-1, ps)) {
                ok = compare(c, what, dout, dlse, n_out, ref, ref_lse, 1e-2, kLseF8) && ok;
                std::snprintf(what, sizeof what, "fp8 vs exact q%s", ps > 0 ? " packed" : "");
                ok = compare(c, what, dout, dlse, n_out, ref_x, lse_x, 1e-2, kLseF8) && ok;
            } else {
                ok = false;
            }
        }
        for (int variant = 0; variant < (c.fp8 ? 0 : kVariants); ++variant) {
            if (!run(variant, ps)) {
                ok = false;
                continue;
            }
            std::snprintf(what, sizeof what, "%s%s", kVariant[variant], ps > 0 ? " packed" : "");
            ok = compare(c, what, dout, dlse, n_out, ref, ref_lse) && ok;
        }
        if (!c.fp8) { /* the production variant with out off a 16-byte boundary */
            if (run(kVariants - 1, ps, 8)) {
                std::snprintf(what, sizeof what, "%s%s, out+8", kVariant[kVariants - 1],
                              ps > 0 ? " packed" : "");
                ok =
                    compare(c, what, static_cast<uint8_t *>(dout) + 8, dlse, n_out, ref, ref_lse) &&
                    ok;
            } else {
                ok = false;
            }
            /* the production variant on the other schedule where the kernel has both: the
             * rounds where its rule took the dynamic one, else the dynamic one (forced) */
            const bool rule_dynamic = g_last_dynamic;
            if (run(kVariants - 1, ps, 0, rule_dynamic ? 0 : 1)) {
                if (rule_dynamic || g_last_dynamic) {
                    std::snprintf(what, sizeof what, "%s%s, %s", kVariant[kVariants - 1],
                                  ps > 0 ? " packed" : "", g_last_dynamic ? "dynamic" : "rounds");
                    ok = compare(c, what, dout, dlse, n_out, ref, ref_lse) && ok;
                }
            } else {
                ok = false;
            }
            /* a paged batch: the production variant on the other paged kernel too */
            if (c.page > 0) { /* g_last_src: the rule's kernel (the run above) */
                g_persistent = g_last_src == kPagedRing ? 0 : 1;
                if (run(kVariants - 1, ps)) {
                    std::snprintf(what, sizeof what, "%s%s, paged %s", kVariant[kVariants - 1],
                                  ps > 0 ? " packed" : "",
                                  g_last_src == kPagedRing ? "ring" : "tile");
                    ok = compare(c, what, dout, dlse, n_out, ref, ref_lse) && ok;
                } else {
                    ok = false;
                }
                g_persistent = -1;
            }
        }
    }
    p.out = dout;
#ifdef HOPPER_CHECK_KIT
    ok = run_kit(c, b, g, dq, dk, dv, dqo, dkv, p, dout, dlse, n_out, scale, ref, ref_lse) && ok;
#endif
    cudaFree(dpi);
    cudaFree(dpx);
    cudaFree(dpl);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dout);
    cudaFree(dlse);
    cudaFree(dqo);
    cudaFree(dkv);
    cudaFree(ditems);
    cudaFree(dpacked);
    return ok;
}

#include "hopper_prefill_cases.h"
#include "hopper_prefill_timing.cuh"

int main(int argc, char **argv) {
    /* --no-bench: checks only; --bench-only; --quick: the small cases only (for compute-sanitizer);
     * --profile V [PS [mix|dense [rounds|dynamic]]]: one causal H32/8 launch set of variant V
     * (for ncu), pack_shift PS, the varlen mix or B4 S4096, on the schedule named;
     * --time: bench_tiles' timings only (the per-work-tile overhead's shapes); --time-dim D:
     * bench_dim's (head dim 64, 128 or 256); --time-paged: bench_paged's (the paged source);
     * --time-f8: bench_f8's (the fp8 K/V kernel beside the 16-bit one);
     * --match TEXT: the checks whose name holds TEXT only. */
    std::setvbuf(stdout, nullptr, _IOLBF, 0); /* lines survive a timeout's kill */
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    const bool bench_only = argc > 1 && std::strcmp(argv[1], "--bench-only") == 0;
    const bool do_bench = argc == 1 || bench_only;
    if (argc > 1 && std::strcmp(argv[1], "--time") == 0) {
        bench_tiles();
        return 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "--time-f8") == 0) {
        bench_f8();
        return 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "--time-paged") == 0) {
        bench_paged();
        return 0;
    }
    if (argc > 2 && std::strcmp(argv[1], "--time-dim") == 0) {
        bench_dim(std::atoi(argv[2]));
        return 0;
    }
    if (argc > 2 && std::strcmp(argv[1], "--profile") == 0) {
        /* --profile V [PS [mix|dense [rounds|dynamic|- [D]]]]: PS the pack_shift (-1: the
         * dispatch's); mix: the varlen mix, else B4 S4096; the schedule (default: the
         * dispatch's); D the head dim (128) */
        const int ps = argc > 3 ? std::atoi(argv[3]) : -1;
        const int dim = argc > 6 ? std::atoi(argv[6]) : 128;
        if (argc > 5) {
            g_dynamic = std::strcmp(argv[5], "dynamic") == 0  ? 1
                        : std::strcmp(argv[5], "rounds") == 0 ? 0
                                                              : -1;
        }
        if (argc > 4 && std::strcmp(argv[4], "mix") == 0) {
            bench_lens(true, varlen_mix(), "varlen64", 32, 8, dim, std::atoi(argv[2]), 0, ps);
        } else {
            bench(true, 4, 32, 8, dim, std::atoi(argv[2]), 0, ps);
        }
        return 0;
    }
    std::vector<Case> cases = quick ? quick_cases() : check_cases();
    const bool match = argc > 2 && std::strcmp(argv[1], "--match") == 0;
    if (match) {
        std::vector<Case> picked;
        for (const Case &c : cases) {
            if (std::strstr(c.name, argv[2]) != nullptr) {
                picked.push_back(c);
            }
        }
        cases = picked;
    }
    int dev = 0;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    std::printf("device %s sm_%d%d\n", prop.name, prop.major, prop.minor);
    bool ok = true;
    unsigned seed = 1;
    if (bench_only) {
        cases.clear();
    }
    for (const Case &c : cases) {
        ok = run_case(c, seed++) && ok;
    }
    std::printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
    if (do_bench) {
        for (int variant = 0; variant < kVariants; ++variant) {
            for (bool causal : {true, false}) {
                for (int hkv : {8, 32}) {
                    bench(causal, 4, 32, hkv, 128, variant);
                }
            }
            bench(true, 1, 128, 128, 192, variant); /* MLA prefill (issue 9) */
            bench(true, 4, 32, 8, 64, variant);     /* head dim 64 (issue 10) */
            bench(false, 4, 32, 8, 64, variant);
            bench(true, 4, 32, 8, 256, variant); /* head dim 256 (issue 10) */
            bench(false, 4, 32, 8, 256, variant);
        }
        bench(true, 4, 32, 8, 128, 2, 16); /* fa_varlen's paged case, the dispatched mode */
        bench(false, 4, 32, 8, 128, 2, 16);
    }
    return ok ? 0 : 1;
}
