/* hopper_prefill_timing.cuh: hopper_prefill_check's timings (a part of
 * bench/hopper_prefill_check.cu, which includes it after its launch helpers). */
#ifndef AP_BENCH_HOPPER_PREFILL_TIMING_CUH
#define AP_BENCH_HOPPER_PREFILL_TIMING_CUH

/* Sequences of lens tokens (Q and K/V alike), H query heads over hkv, Q/K dqk wide (V
 * dv_of(dqk)); page > 0: K/V read as a paged cache of that page size through a shuffled page
 * table; ps: Params.pack_shift (-1: the dispatch's, pack_shift_for). what: the shape in the
 * printed line. variant -1: fp8 K/V (the fp8 kernel, ragged; scales 1, values in [-1, 1]). */
static void bench_lens(bool causal, const std::vector<int> &lens, const char *what, int H, int hkv,
                       int dqk, int variant, int page = 0, int ps = -1) {
    const int D = dv_of(dqk);
    Case c{"bench", false, causal, H, hkv, lens, lens, dqk};
    c.page = page;
    if (ps < 0) {
        const Batch b0 = make_batch(c);
        ps = pack_shift_for(b0.qo.data(), static_cast<int>(lens.size()), H / hkv,
                            tile_rows_of(dqk, page > 0 ? kPagedTile : kRagged));
    }
    const Batch b = make_batch(c, ps);
    g_min_kv_tiles = min_kv_tiles(b.items);
    const bool f8 = variant < 0;
    const int sets = 2;
    std::vector<void *> bufs;
    const size_t qn = static_cast<size_t>(b.tq) * H * dqk,
                 kn = static_cast<size_t>(b.tkv) * hkv * dqk,
                 vn = static_cast<size_t>(b.tkv) * hkv * D;
    void *dout;
    float *dlse;
    int32_t *dqo, *dkv;
    Item *ditems;
    static std::vector<uint16_t> host; /* one random pool, sliced at different offsets */
    if (host.size() < qn + 4096) {
        host.resize(qn + 4096);
        uint32_t x = 12345u;
        for (auto &e : host) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            const __nv_bfloat16_raw y =
                __float2bfloat16_rn(static_cast<float>(x % 2001u) / 1000.f - 1.f);
            e = y.x;
        }
    }
    static std::vector<uint8_t> host8; /* the pool's values as e4m3 */
    if (f8 && host8.size() < host.size()) {
        host8.resize(host.size());
        for (size_t i = 0; i < host.size(); ++i) {
            __nv_bfloat16_raw r;
            r.x = host[i];
            host8[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(
                __bfloat162float(__nv_bfloat16(r)), __NV_SATFINITE, __NV_E4M3));
        }
    }
    int slice = 0;
    for (int s = 0; s < sets; ++s) {
        for (size_t n : {qn, kn, vn}) {
            void *p;
            const bool bytes = f8 && n != qn; /* fp8 K / V */
            CK(cudaMalloc(&p, bytes ? n : n * 2));
            const size_t at = 97 * (slice++);
            CK(cudaMemcpy(p,
                          bytes ? static_cast<const void *>(host8.data() + at) : host.data() + at,
                          bytes ? n : n * 2, cudaMemcpyHostToDevice));
            bufs.push_back(p);
        }
    }
    CK(cudaMalloc(&dout, static_cast<size_t>(b.tq) * H * D * 2));
    CK(cudaMalloc(&dlse, static_cast<size_t>(b.tq) * H * 4));
    CK(cudaMalloc(&dqo, b.qo.size() * 4));
    CK(cudaMalloc(&dkv, b.kv.size() * 4));
    CK(cudaMalloc(&ditems, b.items.size() * sizeof(Item)));
    CK(cudaMemcpy(dqo, b.qo.data(), b.qo.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dkv, b.kv.data(), b.kv.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ditems, b.items.data(), b.items.size() * sizeof(Item), cudaMemcpyHostToDevice));
    const float scale = 1.f / std::sqrt(static_cast<float>(dqk));
    Params p{ditems,
             dqo,
             dkv,
             dout,
             nullptr,
             H,
             H / hkv,
             causal ? 1 : 0,
             scale * 1.4426950408889634f,
             scale,
             nullptr,
             nullptr,
             nullptr,
             0,
             hkv,
             static_cast<int32_t>(b.items.size()),
             0,
             1.f,
             1.f,
             ps,
             0,
             nullptr,
             0,
             1,
             H};
    int32_t *dpi = nullptr, *dpx = nullptr, *dpl = nullptr;
    if (page > 0) {
        std::mt19937 rng(7);
        /* the caches are the k / v buffers, no page to spare: S is a multiple of the page */
        const Paged g = make_pages(b.kv, page, rng, 0);
        CK(cudaMalloc(&dpi, g.indptr.size() * 4));
        CK(cudaMalloc(&dpx, g.indices.size() * 4));
        CK(cudaMalloc(&dpl, g.last.size() * 4));
        CK(cudaMemcpy(dpi, g.indptr.data(), g.indptr.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dpx, g.indices.data(), g.indices.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dpl, g.last.data(), g.last.size() * 4, cudaMemcpyHostToDevice));
        p.kv_indptr = dpi;
        p.kv_page_indices = dpx;
        p.kv_last_page_len = dpl;
        p.page_shift = __builtin_ctz(static_cast<unsigned>(page));
        p.num_kv_heads = hkv;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    const int warm = 5, iters = 40;
    for (int i = 0; i < warm + iters; ++i) {
        const int s = i % sets;
        p.v_pages = bufs[3 * s + 2];
        CK(cudaEventRecord(e0));
        const int rc =
            f8 ? launch_f8_any(dqk, false, bufs[3 * s], bufs[3 * s + 1], bufs[3 * s + 2], b.tq,
                               b.tkv, H, hkv, p, static_cast<int>(b.items.size()), 0)
               : launch_any(variant, dqk, false, bufs[3 * s], bufs[3 * s + 1], bufs[3 * s + 2],
                            b.tq, b.tkv, H, hkv, p, static_cast<int>(b.items.size()), 0);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        if (rc != 0) {
            std::printf("bench: map error\n");
            return;
        }
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (i >= warm) {
            ms.push_back(t);
        }
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    double sq = 0; /* sum of S^2 */
    for (int len : lens) {
        sq += static_cast<double>(len) * len;
    }
    const double flops = (causal ? 1.0 : 2.0) * H * sq * (dqk + D);
    char sched[48] = "";
    if (page > 0) {
        std::snprintf(sched, sizeof sched, " %s", g_last_src == kPagedRing ? "ring" : "tile");
    } else if (g_persistent >= 0 || g_band > 0) {
        std::snprintf(sched, sizeof sched, " %s band%d", g_persistent == 0 ? "grid" : "persistent",
                      g_band);
    }
    if (g_last_dynamic || g_dynamic >= 0) { /* the launches' schedule where it had a choice */
        std::snprintf(sched + std::strlen(sched), sizeof sched - std::strlen(sched), " %s",
                      g_last_dynamic ? "dynamic" : "rounds");
    }
    char pg[16] = "";
    if (page > 0) {
        std::snprintf(pg, sizeof pg, " paged%d", page);
    }
    std::printf("hopper %s %s H%d/%d D%d/%d %s %s%s pack%d%s: %.3f ms %.1f TFLOP/s\n",
                causal ? "causal    " : "non-causal", what, H, hkv, dqk, D, f8 ? "fp8-kv" : "bf16",
                kVariant[f8 ? 2 : variant], pg, 1 << ps, sched, med, flops / med / 1e9);
    cudaFree(dpi);
    cudaFree(dpx);
    cudaFree(dpl);
    for (void *x : bufs) {
        cudaFree(x);
    }
    cudaFree(dout);
    cudaFree(dlse);
    cudaFree(dqo);
    cudaFree(dkv);
    cudaFree(ditems);
}

/* B sequences of S = 4096 tokens. */
static void bench(bool causal, int B, int H, int hkv, int dqk, int variant, int page = 0,
                  int ps = -1) {
    char what[32];
    std::snprintf(what, sizeof what, "B%d S4096", B);
    bench_lens(causal, std::vector<int>(B, 4096), what, H, hkv, dqk, variant, page, ps);
}

/* fav-bench's varlen shape (bench/fav_bench.c fb_lengths): 64 sequences of 16..4096 tokens
 * scaled to about 64k in all, here from a fixed splitmix64 seed (not fav-bench's stream, so the
 * same mix, not the same lengths). */
static std::vector<int> varlen_mix() {
    uint64_t state = 20261127u;
    auto next = [&state]() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    };
    std::vector<int> lens(64);
    double total = 0;
    for (int &len : lens) {
        len = 16 + static_cast<int>(next() % 4081u);
        total += len;
    }
    for (int &len : lens) {
        len = std::min(4096, std::max(16, static_cast<int>(std::llround(len * 65536.0 / total))));
    }
    return lens;
}

/* --time: the shapes of the per-work-tile overhead (issue 10's causal targets), the dispatched
 * ping-pong mode, one query head per work tile (pack1) and the group's four (pack4, in
 * band_kv_for's bands), each on the dispatch's schedule and on the other one where the kernel has
 * both (pack1: dynamic, g_dynamic 1; pack4: the rounds, g_dynamic 0), two rounds:
 * causal H32/8 B4 S4096 D128 and D64, non-causal D128, paged16 D128, D256, B16 S4096 D128, the
 * varlen mix D128. */
static void bench_tiles() {
    const std::vector<int> mix = varlen_mix();
    int tokens = 0;
    for (int len : mix) {
        tokens += len;
    }
    const Case c{"mix", false, true, 32, 8, mix, mix};
    /* (pack_shift, persistent override, band override, schedule): one head per tile (the rule:
     * rounds; and dynamic), packed (bands of one K/V head where persistent; the rule: dynamic;
     * and rounds) */
    const int configs[4][4] = {{0, -1, 0, -1}, {0, -1, 0, 1}, {2, -1, 0, -1}, {2, -1, 0, 0}};
    for (int round = 0; round < 2; ++round) {
        for (const auto &cf : configs) {
            const int ps = cf[0];
            g_persistent = cf[1];
            g_band = cf[2];
            g_dynamic = cf[3];
            bench(true, 4, 32, 8, 128, 2, 0, ps);
            bench(true, 4, 32, 8, 64, 2, 0, ps);
            bench(false, 4, 32, 8, 128, 2, 0, ps);
            bench(true, 4, 32, 8, 128, 2, 16, ps);
            bench(true, 4, 32, 8, 256, 2, 0, ps);
            bench(true, 16, 32, 8, 128, 2, 0, ps);
            const long long tiles =
                static_cast<long long>(make_batch(c, ps).items.size()) * (32 >> ps);
            char what[64];
            std::snprintf(what, sizeof what, "varlen64 %dtok %lldtiles", tokens, tiles);
            bench_lens(true, mix, what, 32, 8, 128, 2, 0, ps);
        }
    }
    g_persistent = -1;
    g_band = 0;
    g_dynamic = -1;
}

/* --time-dim D: head dim D (64, 128 or 256) alone (the K/V tile's keys: AP_HOPPER_D64_KEYS,
 * AP_HOPPER_D256_KEYS; D64's warpgroups: AP_HOPPER_D64_WG3), the dispatched mode, three rounds:
 * B4 S4096 H32/8 causal and not, ragged and (D64) paged16 and without GQA (H32/32: one CTA per
 * work tile, nothing to pack), and the varlen mix causal. */
static void bench_dim(int dqk) {
    for (int round = 0; round < 3; ++round) {
        for (bool causal : {true, false}) {
            bench(causal, 4, 32, 8, dqk, 2);
            if (dqk == 64) {
                bench(causal, 4, 32, 8, dqk, 2, 16);
                bench(causal, 4, 32, 32, dqk, 2);
            }
        }
        bench_lens(true, varlen_mix(), "varlen64", 32, 8, dqk, 2);
    }
}

/* --time-f8: the fp8 K/V kernel beside the 16-bit one (the dispatched mode and schedule), three
 * rounds: B4 S4096 H32/8 D128 causal and not, the varlen mix causal D128, MLA's B1 S4096 H128
 * qk 192 / v 128 causal. */
static void bench_f8() {
    for (int round = 0; round < 3; ++round) {
        for (int variant : {-1, 2}) {
            for (bool causal : {true, false}) {
                bench(causal, 4, 32, 8, 128, variant);
            }
            bench_lens(true, varlen_mix(), "varlen64", 32, 8, 128, variant);
            bench_lens(true, std::vector<int>(1, 4096), "B1 S4096", 128, 128, 192, variant);
        }
    }
}

/* --time-paged: the paged source on both its kernels (kPagedTile, kPagedRing), the dispatched
 * mode and packing, three rounds: B4 S4096 H32/8 D128 causal and not on page 16 (fav-bench's
 * paged row), causal on pages 32 and 64, D64 causal on page 16, and the varlen mix causal D128 on
 * page 16; the ragged source's causal D128 beside them. */
static void bench_paged() {
    for (int round = 0; round < 3; ++round) {
        for (int src : {0, 1}) { /* g_persistent: kPagedTile, kPagedRing */
            g_persistent = src;
            for (bool causal : {true, false}) {
                bench(causal, 4, 32, 8, 128, 2, 16);
            }
            bench(true, 4, 32, 8, 128, 2, 32);
            bench(true, 4, 32, 8, 128, 2, 64);
            bench(true, 4, 32, 8, 64, 2, 16);
            bench_lens(true, varlen_mix(), "varlen64", 32, 8, 128, 2, 16);
        }
        g_persistent = -1;
        bench(true, 4, 32, 8, 128, 2);
    }
}

#endif /* AP_BENCH_HOPPER_PREFILL_TIMING_CUH */
