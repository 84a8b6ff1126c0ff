/* hopper_paged_cache.h: hopper_prefill_check's paged caches: a page table over shuffled pages and
 * the cache built from contiguous K/V rows (bench/hopper_prefill_check.cu includes it). */
#ifndef AP_BENCH_HOPPER_PAGED_CACHE_H
#define AP_BENCH_HOPPER_PAGED_CACHE_H

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

/* A paged cache holding a batch's contiguous K/V rows: sequence i's pages are entries
 * indptr[i] .. indptr[i+1] of indices, a shuffled permutation of the cache's pages (`extra` more
 * than needed); every slot no sequence owns holds NaN, so a kernel that lets one reach O fails. */
struct Paged {
    std::vector<int> indptr, indices, last;
    int num_pages = 0;
};

static Paged make_pages(const std::vector<int> &kv, int page, std::mt19937 &rng, int extra) {
    Paged g;
    g.indptr.push_back(0);
    for (size_t i = 0; i + 1 < kv.size(); ++i) {
        const int len = kv[i + 1] - kv[i];
        const int np = (len + page - 1) / page;
        g.indptr.push_back(g.indptr.back() + np);
        g.last.push_back(np > 0 ? len - (np - 1) * page : page);
    }
    g.num_pages = g.indptr.back() + extra;
    std::vector<int> perm(g.num_pages);
    for (int i = 0; i < g.num_pages; ++i) {
        perm[i] = i;
    }
    std::shuffle(perm.begin(), perm.end(), rng);
    g.indices.assign(perm.begin(), perm.begin() + g.indptr.back());
    return g;
}

/* The cache [pages][page][heads][dim] of contiguous rows src [kv][heads][dim] (16-bit). */
static std::vector<uint16_t> to_pages(const std::vector<uint16_t> &src, const std::vector<int> &kv,
                                      const Paged &g, int page, int heads, int dim) {
    const size_t row = static_cast<size_t>(heads) * dim;
    std::vector<uint16_t> cache(static_cast<size_t>(g.num_pages) * page * row, 0x7fff);
    for (size_t i = 0; i + 1 < kv.size(); ++i) {
        for (int t = 0; t < kv[i + 1] - kv[i]; ++t) {
            const int pg = g.indices[g.indptr[i] + t / page];
            std::memcpy(&cache[(static_cast<size_t>(pg) * page + t % page) * row],
                        &src[(static_cast<size_t>(kv[i]) + t) * row], row * 2);
        }
    }
    return cache;
}

#endif /* AP_BENCH_HOPPER_PAGED_CACHE_H */
