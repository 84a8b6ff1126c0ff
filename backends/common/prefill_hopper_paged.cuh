/* prefill_hopper_paged.cuh: the paged K/V source of the kit's Hopper prefill kernel (kPaged): one
 * K/V tile's loads from a paged NHD cache by the producer warps (K and V, kRole), one TMA box per
 * page (produce_paged_tile; produce calls it for each tile and runs the Q loads). A part of
 * prefill_hopper.cuh, which includes it after the kernel's shared types (Params, Shape, Bars, Geo);
 * not a header of its own. */
#ifndef AP_COMMON_PREFILL_HOPPER_PAGED_CUH
#define AP_COMMON_PREFILL_HOPPER_PAGED_CUH

#ifndef AP_COMMON_PREFILL_HOPPER_CUH
#error "prefill_hopper_paged.cuh is included by prefill_hopper.cuh only"
#endif

/* Rows row0 .. keys - 1 of a tile in shared memory (`halves` 64-column chunks of `keys` 128-byte
 * rows, 128-byte swizzle as TMA writes it): the first `valid` copied from the cache rows src,
 * src + stride, ... (16-bit elements), the rest zeros. By the whole warp. */
__device__ __forceinline__ void warp_fill_rows(uint8_t *tile, int halves, int keys, int row0,
                                               int valid, const uint16_t *src, int64_t stride,
                                               int lane) {
    const int per_row = halves * 8; /* 16-byte units */
    const int units = (keys - row0) * per_row;
#pragma unroll 2 /* 8 spilled the producer warp's 40 registers */
    for (int u = lane; u < units; u += 32) {
        const int r = u / per_row;
        const int c = u % per_row;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (r < valid) {
            x = __ldg(reinterpret_cast<const uint4 *>(src + r * stride + c * 8));
        }
        const int rr = row0 + r;
        *reinterpret_cast<uint4 *>(tile + (c / 8) * keys * 128 + rr * 128 +
                                   (((c % 8) ^ (rr & 7)) * 16)) = x;
    }
}

/* K/V tile n of a paged sequence into K stage s and V stage vs (phases ph, vph), by a producer
 * warp (kRole: its K boxes, its V boxes, or both): one TMA box per page (or per Geo::kPageBox rows
 * of a larger page) at its row offset (the 128-byte swizzle repeats every 8 rows, so the boxes
 * build the layout of one tile-long box); box j and its page number on lane j. K boxes holding any
 * key are loaded whole (keys past kv_len are masked); V boxes only when full:
 * the last, partly filled page is copied by hand and the rows past kv_len zeroed, since a
 * masked P of 0 times a never-written (NaN) V would still poison O. */
template <int kD, int kPaged, int kRole = kLoadAll>
__device__ __forceinline__ void
produce_paged_tile(const CUtensorMap *tk, const CUtensorMap *tv, uint8_t *k, uint8_t *v, Bars *b,
                   int s, uint32_t ph, int vs, uint32_t vph, const Params &p, const Shape &sh,
                   int n, int hk, int lane) {
    using G = Geo<kD, kPaged>;
    const int box = min(G::kPageBox, 1 << p.page_shift);
    const int pos = n * G::kKeys + lane * box;
    const int valid = lane * box < G::kKeys ? max(0, min(box, sh.kv_len - pos)) : 0;
    int row = 0;
    if (valid > 0) {
        const int page = __ldg(p.kv_page_indices + sh.kv_start + (pos >> p.page_shift));
        row = (page << p.page_shift) + (pos & ((1 << p.page_shift) - 1));
    }
    const uint32_t some = __ballot_sync(0xffffffffu, valid > 0);
    const int full = __popc(__ballot_sync(0xffffffffu, valid == box)); /* a prefix of boxes */
    if constexpr (kRole != kLoadV) {
        bar_wait(&b->k_empty[s], ph);
        if (lane == 0) {
            bar_expect_tx(&b->k_full[s], __popc(some) * box * 128 * G::kChunks);
        }
        __syncwarp();
        if (valid > 0) {
#pragma unroll
            for (int c = 0; c < G::kChunks; ++c) {
                tma_load(tk, k + c * G::kKChunk + lane * box * 128, &b->k_full[s], 64 * c, hk, row);
            }
        }
    }
    if constexpr (kRole == kLoadQK) {
        return;
    }
    constexpr int kVc = G::kVChunks;
    bar_wait(&b->v_empty[vs], vph);
    if (lane == 0 && full * box == G::kKeys) {
        bar_expect_tx(&b->v_full[vs], G::kVBytes); /* TMA bytes alone complete it */
    } else if (lane == 0 && full > 0) {
        expect_tx(&b->v_full[vs], full * box * 128 * kVc); /* the arrival comes after the copy */
    }
    __syncwarp();
    if (valid == box) {
#pragma unroll
        for (int c = 0; c < kVc; ++c) {
            tma_load(tv, v + c * G::kKChunk + lane * box * 128, &b->v_full[vs], 64 * c, hk, row);
        }
    }
    if (full * box < G::kKeys) {
        const int tail_valid = __shfl_sync(0xffffffffu, valid, full);
        const int tail_row = __shfl_sync(0xffffffffu, row, full);
        const int64_t stride = static_cast<int64_t>(p.num_kv_heads) * G::kDv;
        const uint16_t *src = static_cast<const uint16_t *>(p.v_pages) + tail_row * stride +
                              static_cast<int64_t>(hk) * G::kDv;
        warp_fill_rows(v, kVc, G::kKeys, full * box, tail_valid, src, stride, lane);
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) {
            bar_arrive(&b->v_full[vs]);
        }
    }
}

#endif /* AP_COMMON_PREFILL_HOPPER_PAGED_CUH */
