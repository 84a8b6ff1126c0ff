/* prefill_hopper.cuh: the kit's Hopper (sm_90a) prefill kernel: TMA + mbarriers + wgmma, one
 * producer warpgroup and two consumer warpgroups of 64 query rows each (CTA tile 128 rows), head
 * dims (Geo) 128, 64, 256 or Q/K 192 with V 128 (MLA's MHA form), ragged Q and K/V by cu_seqlens or
 * (kPaged, 128 / 64) K/V from a paged NHD cache, causal aligned to the end or none, GQA, LSE.
 * Shared memory: Q and a ring of K and V tiles (Geo), each stored as 64-column chunks of 128-byte
 * rows in the 128-byte swizzle TMA writes and wgmma reads. The producer loads Q once and K/V
 * tiles from the last (diagonal) tile down, each completing on its full barrier; consumers
 * release a stage's K after S = Q K^T and its V after P V, on the empty barriers. */
#ifndef AP_COMMON_PREFILL_HOPPER_CUH
#define AP_COMMON_PREFILL_HOPPER_CUH

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include "mma.cuh" /* ap_smem_addr, ap_lds128 / ap_sts128 */
#include "prefill_internal.h"
#include "prefill_schedule.h"
#include "sm90.cuh"
#include "wgmma.cuh"

namespace ap_hopper {

using namespace ap_sm90;

constexpr int kRows = 128; /* query rows per CTA, 64 per consumer warpgroup */
constexpr int kDim = 128;  /* head dim of Q, K and V (Geo: of the other shapes) */
#ifndef AP_HOPPER_STAGES
#define AP_HOPPER_STAGES 3 /* 230.5 KB of shared memory; checked and faster on the H100 */
#endif
constexpr int kStages = AP_HOPPER_STAGES; /* K/V ring depth */
/* Keys per K/V tile at head dim 64 (Geo::kKeys): 192 (the default) or 128. A D64 tile's S and
 * P V are short (S 64 x 128 x 64 a warpgroup at 128 keys), so its fixed costs (the barrier
 * waits, the row max's shuffles, the wgmma waits) weigh as much as the MUFU's exponentials:
 * 192-key tiles pay them for 1.5x the keys (FA3 runs D64 with tiles of 192 too). */
#ifndef AP_HOPPER_D64_KEYS
#define AP_HOPPER_D64_KEYS 192
#endif
static_assert(AP_HOPPER_D64_KEYS == 128 || AP_HOPPER_D64_KEYS == 192, "D64 tiles: 128 or 192 keys");
/* Keys per K/V tile at head dim 256: 64 or 80 (FA3's; 2 stages of 80 KB beside the 64 KB Q tile,
 * 225.5 KB in all). */
#ifndef AP_HOPPER_D256_KEYS
#define AP_HOPPER_D256_KEYS 80
#endif
static_assert(AP_HOPPER_D256_KEYS == 64 || AP_HOPPER_D256_KEYS == 80, "D256 tiles: 64 or 80 keys");
#ifndef AP_HOPPER_PERSISTENT
#define AP_HOPPER_PERSISTENT 1 /* 0: one CTA per (item, head), grid (items, heads) */
#endif
constexpr bool kPersistent = AP_HOPPER_PERSISTENT != 0;
/* AP_HOPPER_QBUF 2, the default: two Q buffers at head dims 128 and 64 (Geo::kQBufs) and the
 * work tiles' boundaries merged (prefill_hopper_merge.cuh); 1: the two Q buffers alone; 0: one
 * Q buffer, each tile's first S and last P V a turn of their own. H100, 2026-11-27, one call,
 * hopper_prefill_check --time, causal H32/8 B4 S4096 (TFLOP/s): D128 570.1 (0) / 579.8 (1) /
 * 586.2 (2), D64 381.8 / 387.7 / 397.7; the varlen mix 397-420 / 410.5 / 433.8. */
#ifndef AP_HOPPER_QBUF
#define AP_HOPPER_QBUF 2
#endif
/* The K/V source a kernel is built for (its kPaged template argument): the ragged rows (kRagged),
 * or a paged cache, either with one CTA per work tile (kPagedTile: one Q buffer, the V ring as
 * deep as the K ring) or on the ragged source's machinery (kPagedRing: two Q buffers and the V
 * ring AP_HOPPER_QBUF_VSTAGES deep at head dim 128, the persistent grid with GQA, the scheduler
 * warp, the producer's TileDesc and the merged consumers). paged_source picks one per launch. */
constexpr int kRagged = 0, kPagedTile = 1, kPagedRing = 2;
/* The paged source's producer: one warp issuing a tile's Q, K and V loads (kLoadAll), or
 * (AP_HOPPER_PAGED_VWARP) two: warp 0 Q and K (kLoadQK), warp 2 V (kLoadV), each walking the
 * CTA's tiles and waiting on its own ring's barriers, so the two warps' page boxes (a TMA copy
 * per page and 64 columns from the lane holding that page, which a warp issues lane after lane)
 * go out side by side: page 16 +20% at D128 (paged_source's figures). */
constexpr int kLoadAll = 0, kLoadQK = 1, kLoadV = 2;
#ifndef AP_HOPPER_PAGED_VWARP
#define AP_HOPPER_PAGED_VWARP 1
#endif
constexpr bool kPagedVWarp = AP_HOPPER_PAGED_VWARP != 0;
#ifndef AP_HOPPER_QBUF_VSTAGES
#define AP_HOPPER_QBUF_VSTAGES 2 /* with AP_HOPPER_QBUF, the V ring's depth at head dim 128 */
#endif
constexpr int kMaxQBufs = AP_HOPPER_QBUF ? 2 : 1;
constexpr int kThreads = 384; /* two consumer warpgroups (Geo::kThreads: three at D64) */
/* AP_HOPPER_D64_WG3 1: head dim 64 over the ragged source runs three consumer warpgroups on work
 * tiles of 192 rows (FA3's D64 shape), AP_HOPPER_D64_WG3_KEYS-key K/V tiles in
 * AP_HOPPER_D64_WG3_STAGES stages (2 x 24 KB of Q + 5 x 32 KB at 128 keys), the producer at 32
 * registers and the consumers at 160 (64-key tiles in 8 stages: causal 5%, non-causal 10%
 * slower); 0: two on 128 rows with 192-key tiles. H100, 2026-11-28
 * (bench/results/2026-11-28-h100-c.md), B4 S4096 H32/8 TFLOP/s, two / three: non-causal 420-437
 * / 478-491, the varlen mix 330-341 / 350-362, causal 392-405 / 404-412 (packed: 48-token
 * tiles); H32/8 forced to one head a tile causal 393-400 / 381-382, non-causal the same; without
 * GQA (H32/32, one CTA per tile; 2026-11-28-h100-d.md) causal 365-368 / 373-378, non-causal
 * 411-414 / 444-447. */
#ifndef AP_HOPPER_D64_WG3
#define AP_HOPPER_D64_WG3 1
#endif
#ifndef AP_HOPPER_D64_WG3_KEYS
#define AP_HOPPER_D64_WG3_KEYS 128
#endif
#ifndef AP_HOPPER_D64_WG3_STAGES
#define AP_HOPPER_D64_WG3_STAGES 5
#endif
constexpr int kHalfBytes = kRows * 64 * 2; /* one 64-column chunk of the Q tile: 16 KB */
/* The ring's depth at head dim 64 over the ragged source: 4 stages of 48 KB (192-key tiles) beside
 * the two 16 KB Q buffers, 225.5 KB in all. H100, 2026-11-27 (bench/results/2026-11-27-h100-j.md,
 * call 95), against 3: causal B4 S4096 +1.6%, non-causal +2.5%, the varlen mix +2%. */
#ifndef AP_HOPPER_D64_STAGES
#define AP_HOPPER_D64_STAGES 4
#endif
/* the deepest ring of any Geo (Bars' arrays) */
constexpr int kMaxStages =
    std::max({kStages, AP_HOPPER_D64_STAGES, AP_HOPPER_D64_WG3 ? AP_HOPPER_D64_WG3_STAGES : 0});
constexpr int kBarsBytes = 512; /* shared memory for Bars (its static_assert) */
constexpr int kSchedSlots = 2;  /* the scheduler warp's ring of work tiles (Bars::sched) */

/* The shapes by the Q/K head dim kD (128; 64 or 256, V as wide; 192, V 128): Q is kD / 64 column
 * chunks of kHalfBytes, a K tile kD / 64 chunks of kKeys 128-byte rows, a V tile kDv / 64. Rings:
 * kD 192, 2 stages of 80 KB (48 + 2 x 80 KB); kD 64, 4 stages of 48 KB (192-key tiles; 2 x 16 + 4 x
 * 48), paged 3 of 32 KB (16 + 3 x 32, kPagedRing 2 x 16 + 3 x 32); kD 256 (Q 64 KB), 80-key tiles,
 * 2 stages of 80 KB (64 + 2 x 80 KB). kSrc: the kernel's K/V source (kRagged, kPagedTile,
 * kPagedRing). The paged ones take 128-key tiles in kStages stages at kD 64 too (192-key tiles ran
 * paged16 non-causal 4.6% slower, causal 0.7% faster); kPagedTile one Q buffer and the K ring's
 * depth for V (its CTA takes one work tile: a second Q buffer would only cost a V stage, H100,
 * 2026-11-27, paged16 causal / non-causal 2.1-2.4% slower with it). */
/* The rows of a paged source's TMA box at most for K/V tiles of `keys` (a page, or this much of a
 * larger one): the largest power of two <= 128 dividing keys, so a tile's boxes never straddle its
 * end. The kernel (Geo::kPageBox) and the maps (make_paged_map) take it from here. */
constexpr int page_box(int keys) {
    return keys % 128 == 0 ? 128 : keys % 64 == 0 ? 64 : keys % 32 == 0 ? 32 : 16;
}

/* Query rows of a work tile for the Q/K head dim kD and K/V source kSrc: 192 (three consumer
 * warpgroups) at head dim 64 over the ragged source with AP_HOPPER_D64_WG3, else kRows. The host
 * (plans, Q maps) and the kernel (Geo::kTileRows) take it from here. */
constexpr int tile_rows_of(int kD, int kSrc) {
    return AP_HOPPER_D64_WG3 && kD == 64 && kSrc == kRagged ? 192 : kRows;
}

template <int kD, int kSrc = kRagged> struct Geo {
    static constexpr int kDv = kD == 192 ? 128 : kD;
    static constexpr int kTileRows = tile_rows_of(kD, kSrc);
    static constexpr int kWGs = kTileRows / 64;       /* consumer warpgroups */
    static constexpr int kThreads = 128 * (1 + kWGs); /* and the producer warpgroup */
    static constexpr int kQChunk = kTileRows * 128;   /* one 64-column chunk of the Q tile */
    static constexpr bool kWG3 = kWGs == 3;
    /* setmaxnreg's budgets: the producer warpgroup's registers a thread and the consumers' (two
     * warpgroups: 128 x (168 - 40) given back = 256 x (232 - 168) taken; three: 128 x (128 - 32) =
     * 384 x (160 - 128)) */
    static constexpr int kProducerRegs = kWG3 ? 32 : 40;
    static constexpr int kConsumerRegs = kWG3 ? 160 : 232;
    static_assert(128 * kProducerRegs + 128 * kWGs * kConsumerRegs <= 65536,
                  "the consumers take no more than the producers give back");
    /* keys per K/V tile: 128; AP_HOPPER_D256_KEYS (80) at kD 256 (Q takes 64 KB);
     * AP_HOPPER_D64_KEYS (192) at kD 64 over the ragged source (AP_HOPPER_D64_WG3_KEYS with
     * three consumer warpgroups) */
    static constexpr int kKeys = kD == 256                     ? AP_HOPPER_D256_KEYS
                                 : kWG3                        ? AP_HOPPER_D64_WG3_KEYS
                                 : kD == 64 && kSrc == kRagged ? AP_HOPPER_D64_KEYS
                                                               : 128;
    static constexpr int kPageBox = page_box(kKeys); /* a paged source's box rows at most */
    static constexpr int kChunks = kD / 64;
    static constexpr int kVChunks = kDv / 64;
    static constexpr int kKChunk = kKeys * 128;        /* one 64-column chunk of a K/V tile */
    static constexpr int kQBytes = kChunks * kQChunk;  /* the Q tile */
    static constexpr int kKBytes = kChunks * kKChunk;  /* one K tile */
    static constexpr int kVBytes = kVChunks * kKChunk; /* one V tile */
    static constexpr int kOn = kDv / 2;                /* O floats per consumer thread */
    static constexpr int kSn = kKeys / 2;              /* S floats per consumer thread */
    static constexpr int kPk = kKeys / 16;             /* k16 steps of P V */
    static constexpr int kStg = kWG3                          ? AP_HOPPER_D64_WG3_STAGES
                                : kD == 64 && kSrc == kRagged ? AP_HOPPER_D64_STAGES
                                : kD == 128 || kD == 64       ? kStages
                                                              : 2; /* the K ring's depth */
    /* AP_HOPPER_QBUF: Q tiles in kQBufs buffers (load qn in qn % kQBufs), so the producer loads
     * the next work tile's Q while this one runs; at kD 128 the 32 KB this takes come from the V
     * ring (3 K stages, AP_HOPPER_QBUF_VSTAGES V: 2 x 32 + 3 x 32 + 2 x 32 KB, the bytes of
     * 32 + 3 x 64); kD 256 and 192 keep one (their rings have no stage to spare). */
    static constexpr int kQBufs =
        AP_HOPPER_QBUF && kSrc != kPagedTile && (kD == 128 || kD == 64) ? 2 : 1;
    static constexpr int kVStg =
        AP_HOPPER_QBUF && kSrc != kPagedTile && kD == 128 && AP_HOPPER_QBUF_VSTAGES < kStg
            ? AP_HOPPER_QBUF_VSTAGES
            : kStg;
    static constexpr int kSmem =
        kQBufs * kQBytes + kStg * kKBytes + kVStg * kVBytes + 1024 + kBarsBytes;
    static_assert(kVStg <= kStg, "bars_init sizes both rings' barriers by the K ring");
};

/* One CTA's work: an item of the kit's prefill plan (prefill_internal.h: sequence, first token,
 * KV tiles; the longest first) on grid.x, the head slot (Params.pack_shift: one query head, or a
 * group's packed heads) on grid.y (so the CTAs of one wave share a head's K/V in L2). The plan's
 * tiles are tile_tokens long, a divisor of the work tile's kRows >> pack_shift tokens: the item
 * that starts a work tile runs it, the others exit at once. */
typedef ap_kit_prefill_item Item;

struct Params {
    const Item *items;
    const int32_t *qo_indptr;
    const int32_t *kv_indptr;
    void *out;  /* [tokens][Hq][V head dim] */
    float *lse; /* [tokens][Hq] or NULL */
    int32_t num_qo_heads;
    int32_t group; /* Hq / Hkv */
    int32_t causal;
    float scale_log2; /* sm_scale * log2(e) */
    float sm_scale;
    /* The paged source (kernel's kPaged; kv_indptr is then kv_page_indptr): the NHD caches
     * [page][page_size][Hkv][head dim], page_size a power of two >= 8 (1 << page_shift). */
    const int32_t *kv_page_indices;
    const int32_t *kv_last_page_len;
    const void *v_pages; /* read by the producer for a tile's last, partly filled page */
    int32_t page_shift;
    int32_t num_kv_heads;
    int32_t num_items;  /* the plan's items (the persistent schedule's tiles: items x heads) */
    int32_t persistent; /* the grid is launch_grid(.., true)'s: CTAs take tiles round by round */
    float k_scale;      /* fp8 K/V (prefill_hopper_f8.cuh): real = stored * scale */
    float v_scale;
    /* GQA packing: a work tile's 128 rows are kRows >> pack_shift tokens x (1 << pack_shift)
     * query heads of one group, token-major (row rw: token m0 + (rw >> pack_shift), query head
     * (slot << pack_shift) + rw % (1 << pack_shift)); the tiles run over num_qo_heads >>
     * pack_shift head slots. 0: one query head per tile. 1 << pack_shift divides group. */
    int32_t pack_shift;
    int32_t band_kv; /* the persistent order's band of K/V heads (tile_at), >= 1 */
    /* The dynamic schedule (use_dynamic; the persistent grid of the merged consumers): queue_items
     * > 0, the plan's items (num_items is then 0, so the rounds, tile_at, give no tile); each
     * CTA's scheduler warp takes the tiles of ap_hopper_queue_tile's order one at a time from
     * tile_counter[0] (claim_load); tile_counter[1] counts the CTAs done taking, and the last one
     * sets both back to 0, so every launch finds them at 0 (a plan buffer's, ap_kit_plan_buffer; a
     * graph replays it as it is). */
    int32_t *tile_counter;
    int32_t queue_items;
    /* Split-KV (ap_kit_prefill_plan.splits): the tiles run over splits x (num_qo_heads >>
     * pack_shift) head slots, slot hv taking split hv / slots of head slot hv % slots (slot_split,
     * item_shape), and out / lse are the split workspace [tokens][splits][Hq] rows: out_heads, the
     * rows of a token there, is splits x num_qo_heads (num_qo_heads without a split). */
    int32_t splits;
    int32_t out_heads;
};

/* The head slots a launch's tiles run over: the query heads' slots, times the splits. */
__host__ __device__ __forceinline__ int slot_count(const Params &p) {
    return (p.num_qo_heads >> p.pack_shift) * p.splits;
}

/* The query head slot of a tile's slot hv (split-KV: hv names a split too), and its split. */
__device__ __forceinline__ int slot_head(const Params &p, int hv) {
    return p.splits > 1 ? hv % (p.num_qo_heads >> p.pack_shift) : hv;
}
__device__ __forceinline__ int slot_split(const Params &p, int hv) {
    return p.splits > 1 ? hv / (p.num_qo_heads >> p.pack_shift) : 0;
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* One ss wgmma m64nNk16 of T (bf16 or f16) operands: wgmma.cuh's wrapper of that N and type. */
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db, int acc) {
    constexpr bool kF16 = std::is_same<T, __half>::value;
    if constexpr (N == 64) {
        kF16 ? wgmma_ss_n64_f16(d, da, db, acc) : wgmma_ss_n64_bf16(d, da, db, acc);
    } else if constexpr (N == 80) {
        kF16 ? wgmma_ss_n80_f16(d, da, db, acc) : wgmma_ss_n80_bf16(d, da, db, acc);
    } else if constexpr (N == 128) {
        kF16 ? wgmma_ss_n128_f16(d, da, db, acc) : wgmma_ss_n128_bf16(d, da, db, acc);
    } else {
        static_assert(N == 192, "S tiles of 64, 80, 128 or 192 keys");
        kF16 ? wgmma_ss_n192_f16(d, da, db, acc) : wgmma_ss_n192_bf16(d, da, db, acc);
    }
}

/* S = Q K^T over a K tile: its kKeys keys (64, 80, 128 or 192: one n64, n80, n128 or n192 wgmma
 * a k16 step), or (kHalf: a half tile, pipe_half's, of 128 keys) the first 64 only, into
 * s[0..31] (the rest untouched). The merged consumers instantiate the half forms at every head
 * dim; only 128-key tiles run them (kHalfOn). G: the ring's geometry (Geo<kD, kSrc>). */
template <typename T, class G, bool kHalf = false>
__device__ __forceinline__ void qk_gemm(float (&s)[G::kSn], const uint8_t *q, const uint8_t *k) {
    constexpr int kD = G::kChunks * 64;
    const uint64_t dq = make_desc(q, 16, 1024);
    const uint64_t dk = make_desc(k, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
        const uint64_t da = desc_add(dq, (kk / 4) * G::kQChunk + (kk % 4) * 32);
        const uint64_t db = desc_add(dk, (kk / 4) * G::kKChunk + (kk % 4) * 32);
        if constexpr (kHalf) {
            wgmma_ss<T, 64>(*reinterpret_cast<float(*)[32]>(&s[0]), da, db, kk > 0);
        } else {
            wgmma_ss<T, G::kKeys>(s, da, db, kk > 0);
        }
    }
}

/* One k16 step of P V into kCols (64 or 128) columns of O from the V descriptor db. */
template <typename T, int kCols>
__device__ __forceinline__ void pv_step(float *o, const uint32_t (&a)[4], uint64_t db) {
    if constexpr (kCols == 64) {
        if constexpr (std::is_same<T, __half>::value) {
            wgmma_rs_n64_f16(o, a, db);
        } else {
            wgmma_rs_n64_bf16(o, a, db);
        }
    } else if constexpr (std::is_same<T, __half>::value) {
        wgmma_rs_n128_f16(o, a, db);
    } else {
        wgmma_rs_n128_bf16(o, a, db);
    }
}

/* O += P V: P's k-step kk is S columns 16kk..16kk+15; V rows of the step start at kk * 2048 in
 * each 64-column chunk of V (kPk * 2048 bytes). kN: O's floats per thread (kDv / 2): 32, one n64
 * wgmma per step; 64, one n128 (or two n64 with kSplitN); 128, two n128. kHalf: the first 64
 * keys' 4 k-steps only (P of a half K tile: its other keys' P is 0). */
template <typename T, bool kSplitN, int kN, int kPk, bool kHalf = false>
__device__ __forceinline__ void pv_gemm(float (&o)[kN], const uint32_t (&p)[kPk][4],
                                        const uint8_t *v) {
    static_assert(kN == 32 || kN == 64 || kN == 128, "V is 64, 128 or 256 wide");
    constexpr int kChunk = kPk * 2048;
    constexpr int kCols = kN == 32 || kSplitN ? 64 : 128; /* O columns per wgmma */
    const uint64_t dv = make_desc(v, kChunk, 1024);
#pragma unroll
    for (int kk = 0; kk < (kHalf ? 4 : kPk); ++kk) {
#pragma unroll
        for (int hn = 0; hn < 2 * kN / kCols; ++hn) {
            const uint32_t off = hn * (kCols / 64) * kChunk + kk * 2048;
            pv_step<T, kCols>(o + hn * (kCols / 2), p[kk], desc_add(dv, off));
        }
    }
}

struct Shape {
    int q_start, q_len, kv_start, kv_len, m0, n_blocks;
};

/* AP_HOPPER_TILEDESC 1 (the default): the producer hands each loaded tile's place and shape to the
 * merged consumers with its Q (TileDesc, next_tile); 0: they find it themselves from the plan.
 * compute-sanitizer's racecheck does not see an mbarrier order shared-memory accesses: on the
 * default build it reports every Bars::desc access as a hazard (H100, 2026-11-27), so the
 * racecheck runs take a 0 build; the protocol is checked by backends/common/emu/hopper_ring_sim.py
 * (meson test kit-hopper-ring-sim), which models the slots, the Q lead and the end. */
#ifndef AP_HOPPER_TILEDESC
#define AP_HOPPER_TILEDESC 1
#endif
constexpr bool kTileDesc = AP_HOPPER_TILEDESC != 0;

/* A work tile with K/V tiles as the producer hands it to the merged consumers
 * (prefill_hopper_merge.cuh) with its Q (Bars::desc): its round r (tile_at's), head slot h and
 * shape; r = -1 marks the end (no loaded tile after the previous one). */
struct alignas(16) TileDesc {
    int r, h;
    Shape sh;
};

/* A TileDesc into and out of Bars::desc by volatile (relaxed) accesses, the producer's as two
 * 16-byte stores, the consumers' as the fields they read (kv_start is the producer's alone):
 * the mbarriers order them (the q_full arrival after the store releases it, the consumers' wait
 * before the load acquires it; the q_empty wait before the next store follows every load), and
 * compute-sanitizer's racecheck, which does not see an mbarrier order plain shared-memory
 * accesses, reported every plain one as a hazard (H100, 2026-11-27). The loads are scalar: the
 * same record read by 16-byte loads, or as eight words, made ptxas serialize the consumers'
 * wgmma (C7511), as plain stores read by a struct copy did not. */
__device__ __forceinline__ void desc_store(TileDesc *at, const TileDesc &d) {
    asm volatile("st.volatile.shared.v4.s32 [%0], {%1, %2, %3, %4};\n"
                 "st.volatile.shared.v4.s32 [%0+16], {%5, %6, %7, %8};\n" ::"r"(smem_u32(at)),
                 "r"(d.r), "r"(d.h), "r"(d.sh.q_start), "r"(d.sh.q_len), "r"(d.sh.kv_start),
                 "r"(d.sh.kv_len), "r"(d.sh.m0), "r"(d.sh.n_blocks)
                 : "memory");
}
/* kAll: the whole record (the producer's, from the scheduler warp's ring: kv_start too). */
template <bool kAll = false> __device__ __forceinline__ TileDesc desc_load(const TileDesc *at) {
    const volatile int *w = &at->r;
    return TileDesc{w[0], w[1], {w[2], w[3], kAll ? w[4] : 0, w[5], w[6], w[7]}};
}

/* kv_start: the sequence's first K/V row (ragged) or first entry of its page list (kPaged);
 * n_blocks: K/V tiles of kKeys. hv: the tile's head slot, which names its split (Params.splits):
 * split s of a work tile whose keys take n K/V tiles reads tiles s len .. s len + len - 1 of them
 * (len = ceil(n / splits), rounded up to whole pages where a page holds more than a tile), as a
 * sequence of its own whose keys begin there: kv_start and kv_len move past the skipped keys, so
 * the causal bound (kv_len - q_len + the row's position) and the tiles' key columns stay right,
 * and n_blocks stops at the split's end; a split past the keys has none (its rows: 0, lse -inf). */
template <int kPaged, int kKeys, int kTR = kRows, bool kSplit = true>
__device__ __forceinline__ Shape item_shape(const Params &p, int item, int hv) {
    const Item it = p.items[item];
    Shape sh;
    sh.q_start = p.qo_indptr[it.seq];
    sh.q_len = p.qo_indptr[it.seq + 1] - sh.q_start;
    sh.kv_start = p.kv_indptr[it.seq];
    sh.kv_len = p.kv_indptr[it.seq + 1] - sh.kv_start;
    if constexpr (kPaged != kRagged) {
        sh.kv_len =
            sh.kv_len > 0 ? ((sh.kv_len - 1) << p.page_shift) + p.kv_last_page_len[it.seq] : 0;
    }
    sh.m0 = it.q_start;
    const int tokens = kTR >> p.pack_shift; /* the tile's tokens */
    if (kTR != kRows && p.causal) {
        /* Tiles aligned to the sequence's end: the first starts up to tokens - 1 rows before the
         * sequence (rows never written), so the partly filled tile is the one with the fewest
         * keys, not the one with the most (B4 S4096 causal one head a tile in 192-row tiles:
         * 363-376 -> 381-382 TFLOP/s). Only there: the 128-row kernels keep the code they were
         * measured with (their register budget tips ptxas into C7511 at small changes). */
        sh.m0 -= (tokens - sh.q_len % tokens) % tokens;
    }
    int end = sh.kv_len;
    if (p.causal) {
        end = min(end, sh.kv_len - sh.q_len + sh.m0 + tokens);
    }
    sh.n_blocks = end > 0 ? (end + kKeys - 1) / kKeys : 0;
    if ((kTR == kRows ? it.q_start & (tokens - 1) : it.q_start % tokens) != 0) {
        sh.n_blocks = -1; /* not a tile start: another CTA covers these tokens */
    } else if (kSplit && p.splits > 1 && sh.n_blocks > 0) {
        const int align = kPaged != kRagged && (1 << p.page_shift) > kKeys
                              ? (1 << p.page_shift) / kKeys /* powers of two: paged tiles are 128 */
                              : 1;
        int len = (sh.n_blocks + p.splits - 1) / p.splits;
        len = (len + align - 1) / align * align;
        const int first = slot_split(p, hv) * len;
        if (first >= sh.n_blocks) {
            sh.n_blocks = 0;
        } else {
            const int skip = first * kKeys;
            sh.kv_start += kPaged != kRagged ? skip >> p.page_shift : skip;
            sh.kv_len -= skip;
            sh.n_blocks = min(sh.n_blocks - first, len);
        }
    }
    return sh;
}

/* k_empty / v_empty: a stage's K tile is released once S = Q K is done, its V tile after P V,
 * so the next K load need not wait for the P V that reads the same stage's V. */
struct Bars {
    uint64_t q_full[kMaxQBufs];
    uint64_t q_empty[kMaxQBufs]; /* both consumer warpgroups' last S = Q K of a tile done: that Q
                                  * buffer may be reloaded */
    uint64_t k_full[kMaxStages];
    uint64_t v_full[kMaxStages];
    uint64_t k_empty[kMaxStages];
    uint64_t v_empty[kMaxStages];
    /* Q load qn's work tile (slot qn % kQBufs; two Q buffers, the ragged source), stored by the
     * producer between its q_empty wait and its q_full arrival (desc_store) */
    TileDesc desc[kMaxQBufs];
    /* the scheduler warp's ring (scheduler_tiles, sched_take): its n-th tile in slot
     * n % kSchedSlots, published by s_full, given back by s_empty (one arrival each) */
    uint64_t s_full[kSchedSlots];
    uint64_t s_empty[kSchedSlots];
    TileDesc sched[kSchedSlots];
};
static_assert(sizeof(Bars) <= kBarsBytes, "Geo::kSmem's room for the barriers");

// The CTA's Q tile (first query head h: the Q map's box holds the tile's heads), once, by one
// producer thread: both sources. Q load qn goes to buffer qn % kQBufs, that buffer's
// (qn / kQBufs)-th use.
template <int kD, int kQBufs = Geo<kD>::kQBufs, class G = Geo<kD>>
__device__ __forceinline__ void produce_q(const CUtensorMap *tq, uint8_t *sq, Bars *b,
                                          const Shape &sh, int h, int qn,
                                          const TileDesc *desc = nullptr) {
    const int qb = qn % kQBufs;
    uint8_t *q = sq + qb * G::kQBytes;
    bar_wait(&b->q_empty[qb], ((qn / kQBufs) & 1) ^ 1);
    if (desc != nullptr) {
        desc_store(&b->desc[qb], *desc); /* published by the arrival below (release; the
                                           * consumers' wait acquires) */
    }
    bar_expect_tx(&b->q_full[qb], G::kQBytes);
#pragma unroll
    for (int c = 0; c < G::kChunks; ++c) {
        tma_load(tq, q + c * G::kQChunk, &b->q_full[qb], 64 * c, h, sh.q_start + sh.m0);
    }
}

#include "prefill_hopper_paged.cuh" /* the paged source's producer (kPaged) */

/* How many of a work tile's K/V tiles before its last the producer issues the next work tile's Q
 * (two Q buffers): issued after the tile's last K/V load instead, the next Q, read from DRAM where
 * the K/V mostly come from L2, was still in flight at the boundary (ncu, H100, 2026-11-27, the
 * varlen mix: 1.6% of all stall samples on that wait). The buffer it loads was released by the
 * tile before this one's last S = Q K, so the wait it adds to the K/V loads is short. */
#ifndef AP_HOPPER_QLEAD
#define AP_HOPPER_QLEAD 2
#endif
constexpr int kQLead = AP_HOPPER_QLEAD;

/* One work tile's loads (cur: its round, head slot and shape), by the producer (thread 0, or the
 * paged source's warps: kRole's share, lane 0 issuing the Q loads): its Q (unless q_done: the
 * previous tile's loads issued it), then its K/V tiles into the ring, from the last down, at ring
 * position `ring` (the CTA's K/V tiles so far; qn: its Q loads so far); with has_next, next (the
 * CTA's next work tile with K/V tiles) gets its Q in the other buffer before K/V tile n_blocks -
 * kQLead (or the first) of this one. With two Q buffers each Q load carries its tile's TileDesc. A
 * K/V tile is two TMA boxes of kKeys rows (ragged) or produce_paged_tile's page boxes. */
template <int kD, int kPaged, int kRole = kLoadAll>
__device__ __forceinline__ void
produce(const CUtensorMap *tq, const CUtensorMap *tk, const CUtensorMap *tv, uint8_t *sq,
        uint8_t *sk, uint8_t *sv, Bars *b, const Params &p, const TileDesc &cur, int ring, int qn,
        bool q_done = false, bool has_next = false, const TileDesc &next = {}) {
    using G = Geo<kD, kPaged>;
    constexpr bool kDesc = kTileDesc && G::kQBufs == 2;
    const Shape &sh = cur.sh;
    const int h = slot_head(p, cur.h) << p.pack_shift; /* the tile's first query head */
    const int hk = h / p.group;
    const int lane = threadIdx.x % 32;
    const bool q_lane = (kPaged == kRagged || lane == 0) && kRole != kLoadV;
    if (q_lane && !q_done) {
        produce_q<kD, G::kQBufs, G>(tq, sq, b, sh, h, qn, kDesc ? &cur : nullptr);
    }
    const int q_at = sh.n_blocks > kQLead ? sh.n_blocks - kQLead : 0;
    for (int i = 0; i < sh.n_blocks; ++i) {
        if (q_lane && has_next && i == q_at) {
            produce_q<kD, G::kQBufs, G>(tq, sq, b, next.sh, slot_head(p, next.h) << p.pack_shift,
                                        qn + 1, kDesc ? &next : nullptr);
        }
        const int s = (ring + i) % G::kStg;
        const uint32_t ph = (((ring + i) / G::kStg) & 1) ^ 1;
        const int vs = (ring + i) % G::kVStg; /* the V stage: s without AP_HOPPER_QBUF */
        const uint32_t vph = (((ring + i) / G::kVStg) & 1) ^ 1;
        uint8_t *k = sk + s * G::kKBytes;
        uint8_t *v = sv + vs * G::kVBytes;
        if constexpr (kPaged != kRagged) {
            produce_paged_tile<kD, kPaged, kRole>(tk, tv, k, v, b, s, ph, vs, vph, p, sh,
                                                  sh.n_blocks - 1 - i, hk, lane);
        } else {
            const int row = sh.kv_start + (sh.n_blocks - 1 - i) * G::kKeys;
            bar_wait(&b->k_empty[s], ph);
            bar_expect_tx(&b->k_full[s], G::kKBytes);
#pragma unroll
            for (int c = 0; c < G::kChunks; ++c) {
                tma_load(tk, k + c * G::kKChunk, &b->k_full[s], 64 * c, hk, row);
            }
            bar_wait(&b->v_empty[vs], vph);
            bar_expect_tx(&b->v_full[vs], G::kVBytes);
#pragma unroll
            for (int c = 0; c < G::kVChunks; ++c) {
                tma_load(tv, v + c * G::kKChunk, &b->v_full[vs], 64 * c, hk, row);
            }
        }
    }
}

/* The sequence position (new token, counted from the sequence's first) of the tile's row rw. */
__device__ __forceinline__ int row_pos(const Params &p, const Shape &sh, int rw) {
    return sh.m0 + (rw >> p.pack_shift);
}

/* Masks S of key tile n (kSn floats: tiles of 2 kSn keys) for this thread's rows rw and rw + 8
 * of the work tile. */
template <int kSn>
__device__ __forceinline__ void mask_tile(float (&s)[kSn], const Shape &sh, const Params &p, int n,
                                          int rw, int lane) {
    const int col0 = n * 2 * kSn + 2 * (lane % 4);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        int lim = sh.kv_len - 1;
        if (p.causal) {
            lim = min(lim, sh.kv_len - sh.q_len + row_pos(p, sh, rw + 8 * hr));
        }
#pragma unroll
        for (int j = 0; j < kSn / 4; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (col0 + 8 * j + e > lim) {
                    s[4 * j + 2 * hr + e] = -INFINITY;
                }
            }
        }
    }
}

/* The running max moves only when a row's grows by more than 2^kLazyLog2 (in exp2 units) over
 * the one its O and sum are scaled to, and then for the whole warp: until then probabilities
 * are up to 2^8 (bf16 / fp16 and the fp32 sums hold that), O and l need no rescale, and O / l
 * and the LSE (from the max in use) are the same up to rounding. After the first tiles a row's
 * max rarely grows that much, so the 2 x (kDv / 2) multiplies of O's rescale are skipped. */
constexpr float kLazyLog2 = 8.f;

/* Online softmax statistics of one S tile: s turned into unnormalized probabilities against the
 * running max m, whose sum is added to l; returns whether the warp moved m (then corr is the
 * factor the earlier O must be scaled by, already applied to l). sl2: per row (r0, r0 + 8) the
 * factor from S to log2 units (sm_scale * log2(e), times the row's Q scale and the K scale where
 * S comes from fp8). */
template <int kSn>
__device__ __forceinline__ bool softmax_stats(float (&s)[kSn], float (&m)[2], float (&l)[2],
                                              float (&corr)[2], const float (&sl2)[2]) {
    float mx[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        mx[hr] = m[hr];
#pragma unroll
        for (int j = 0; j < kSn / 4; ++j) {
            mx[hr] = fmaxf(mx[hr], fmaxf(s[4 * j + 2 * hr], s[4 * j + 2 * hr + 1]));
        }
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
    }
    /* -inf - -inf is NaN: a row with no key yet does not ask for a move */
    const bool grows = (mx[0] - m[0]) * sl2[0] > kLazyLog2 || (mx[1] - m[1]) * sl2[1] > kLazyLog2;
    const bool move = __any_sync(0xffffffffu, grows);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        if (move) {
            corr[hr] = ex2((m[hr] - mx[hr]) * sl2[hr]); /* 0 from -inf; NaN only if both are */
            corr[hr] = mx[hr] == -INFINITY ? 0.f : corr[hr];
            m[hr] = mx[hr];
        }
        const float mu = m[hr] == -INFINITY ? 0.f : m[hr] * sl2[hr];
        float part[4] = {0.f, 0.f, 0.f, 0.f}; /* four short chains of adds, not one long one */
#pragma unroll
        for (int j = 0; j < kSn / 4; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float x = ex2(fmaf(s[4 * j + 2 * hr + e], sl2[hr], -mu));
                s[4 * j + 2 * hr + e] = x;
                part[2 * (j % 2) + e] += x;
            }
        }
        const float sum = (part[0] + part[1]) + (part[2] + part[3]);
        l[hr] = move ? l[hr] * corr[hr] + sum : l[hr] + sum;
    }
    return move;
}

/* Scales O by corr (where the warp moved its max) and packs the probabilities into P's A
 * fragments (bf16/fp16). */
template <typename T, int kSn, int kN>
__device__ __forceinline__ void rescale_pack(const float (&s)[kSn], float (&o)[kN],
                                             const float (&corr)[2], bool move,
                                             uint32_t (&p)[kSn / 8][4]) {
    if (move) {
#pragma unroll
        for (int j = 0; j < kN / 4; ++j) {
            o[4 * j] *= corr[0];
            o[4 * j + 1] *= corr[0];
            o[4 * j + 2] *= corr[1];
            o[4 * j + 3] *= corr[1];
        }
    }
#pragma unroll
    for (int kk = 0; kk < kSn / 8; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            p[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        }
    }
}

/* Online softmax over one S tile: rescales o, turns s into P. */
template <typename T, int kSn, int kN>
__device__ __forceinline__ void softmax_tile(float (&s)[kSn], float (&o)[kN], float (&m)[2],
                                             float (&l)[2], uint32_t (&p)[kSn / 8][4],
                                             const float (&sl2)[2]) {
    float corr[2];
    const bool move = softmax_stats(s, m, l, corr, sl2);
    rescale_pack<T>(s, o, corr, move, p);
}

/* The transpose of a quad's 4 x 4 words: lane q of the quad holds a[k] (word k of its four) on
 * entry and lane k's a[q] on return, in two exchanges (lanes q ^ 1, then q ^ 2), each lane sending
 * the words whose index bit differs from its lane's. */
__device__ __forceinline__ void quad_transpose(uint32_t (&a)[4], int lane) {
    const bool b0 = (lane & 1) != 0, b1 = (lane & 2) != 0;
#pragma unroll
    for (int k = 0; k < 4; k += 2) { /* selects, not a[b0 ? k : k + 1]: that indexes local memory */
        const uint32_t x = a[k], y = a[k + 1];
        const uint32_t got = __shfl_xor_sync(0xffffffffu, b0 ? x : y, 1);
        a[k] = b0 ? got : x;
        a[k + 1] = b0 ? y : got;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const uint32_t x = a[k], y = a[k + 2];
        const uint32_t got = __shfl_xor_sync(0xffffffffu, b1 ? x : y, 2);
        a[k] = b1 ? got : x;
        a[k + 2] = b1 ? y : got;
    }
}

/* O / l into out and the LSE for this thread's rows rw and rw + 8 of the work tile of head slot
 * h: ms, per row, the factor from S (m) to natural-log units (sm_scale, times the Q and K scales
 * of fp8 S); os multiplies O (1, or the V scale). A thread's O of a row is two columns of each
 * 8-column block (wgmma's accumulator); with out 16-byte aligned, a quad's four threads trade
 * their words of four blocks (quad_transpose) so each stores one block whole, one 16-byte store
 * in place of four of 4 bytes. */
template <typename T, int kN>
__device__ __forceinline__ void epilogue(const Params &p, const Shape &sh, const float (&o)[kN],
                                         const float (&m)[2], float (&l)[2], int h, int rw,
                                         int lane, const float (&ms)[2], float os) {
    static_assert(kN % 16 == 0, "O: whole groups of four 8-column blocks");
    const bool vec = (reinterpret_cast<uintptr_t>(p.out) & 15) == 0; /* uniform */
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        float sum = l[hr];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int r = row_pos(p, sh, rw + 8 * hr);
        /* one row per quad: the quad's shuffles run regardless; r < 0: a row before the sequence
         * (item_shape's end-aligned tiles) */
        const bool valid = static_cast<unsigned>(r) < static_cast<unsigned>(sh.q_len);
        const float inv = sum > 0.f ? os / sum : 0.f;
        const int head = (h << p.pack_shift) + ((rw + 8 * hr) & ((1 << p.pack_shift) - 1));
        const size_t row = static_cast<size_t>(sh.q_start + r) * p.out_heads + head;
        T *out = static_cast<T *>(p.out) + row * (2 * kN);
        if (vec) {
#pragma unroll
            for (int g = 0; g < kN / 16; ++g) {
                uint32_t a[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int j = 4 * g + k;
                    a[k] = pack2<T>(o[4 * j + 2 * hr] * inv, o[4 * j + 2 * hr + 1] * inv);
                }
                quad_transpose(a, lane);
                if (valid) {
                    *reinterpret_cast<uint4 *>(out + 8 * (4 * g + lane % 4)) =
                        make_uint4(a[0], a[1], a[2], a[3]);
                }
            }
        } else if (valid) {
#pragma unroll
            for (int j = 0; j < kN / 4; ++j) {
                *reinterpret_cast<uint32_t *>(out + 8 * j + 2 * (lane % 4)) =
                    pack2<T>(o[4 * j + 2 * hr] * inv, o[4 * j + 2 * hr + 1] * inv);
            }
        }
        if (valid && p.lse != nullptr && lane % 4 == 0) {
            p.lse[row] = sum > 0.f ? m[hr] * ms[hr] + logf(sum) : -INFINITY;
        }
    }
}

#include "prefill_hopper_consume.cuh" /* the consumers over one work tile */

/* Packing pays where it removes padding: a sequence's last 128-token work tile of one head runs
 * 128 rows whatever its length, a packed one 128 / pack tokens. kPackPadding: the share of padded
 * rows in one-head tiles from which a batch is packed. H100, 2026-11-27, causal H32/8, two rounds
 * of one call (TFLOP/s, one head per tile / packed): the varlen mix (6.0% of one-head rows
 * padding) 404 / 383 against 437 / 445; without padding packing neither gains nor loses beyond
 * the noise (B4 S4096 D128 577 / 565 against 577 / 578, B16 553 / 512 against 536 / 521, D64 367
 * / 354 against 376 / 366, paged16 483 / 470 against 484 / 476), so those batches keep one head
 * per tile. */
constexpr double kPackPadding = 0.03;

/* Params.pack_shift for a batch of num_seqs sequences (qo_indptr on the host) and this group:
 * log2 of the largest power of two dividing the group where one-head tiles of kRows rows would
 * pad at least kPackPadding of their rows, else 0. Tiles of other rows (tile_rows: the
 * kernel's, tile_rows_of), the 192 of three consumer warpgroups, pack whenever the group allows:
 * H100, 2026-11-28, B4 S4096 D64, one head a tile / packed (48-token tiles) TFLOP/s: causal
 * 381-382 / 404-412, non-causal 418-435 / 478-491. */
inline int pack_shift_for(const int32_t *qo_indptr, int num_seqs, int group,
                          int tile_rows = kRows) {
    if (group <= 1 || qo_indptr == nullptr || num_seqs <= 0) {
        return 0;
    }
    if (tile_rows != kRows) {
        return __builtin_ctz(static_cast<unsigned>(group));
    }
    long long tokens = 0, rows = 0;
    for (int i = 0; i < num_seqs; ++i) {
        const long long n = qo_indptr[i + 1] - qo_indptr[i];
        tokens += n;
        rows += (n + kRows - 1) / kRows * kRows;
    }
    if (rows == 0 ||
        static_cast<double>(rows - tokens) < kPackPadding * static_cast<double>(rows)) {
        return 0;
    }
    return __builtin_ctz(static_cast<unsigned>(group));
}

/* Work tile r of this CTA: (plan item, head slot h: query heads h << pack_shift ..). Without
 * persistence one, the CTA's own (grid items x head slots). With it (use_persistent) the grid is
 * at most one CTA per SM (launch_grid) and the tiles go round by round, each band of heads on
 * rounds of its own (ap_hopper_round_tile): in round r of a band CTA c takes its tile r G + c
 * (r even) or r G + G - 1 - c (r odd), a snake that gives the CTA with a round's longest tile the
 * next round's shortest. The tiles' order (prefill_schedule.h): the head slots
 * in bands of Params.band_kv K/V heads (whole groups), band after band; in a band, items x the
 * band's slots in the plan's order (longest first; slots fastest, so a group's heads run together
 * on the same K/V). The band bounds the K/V sets a round reads at once: with all heads in one
 * round, 4 sequences without GQA (H32/32) had every CTA of a round stream its own K/V past L2
 * (366 TFLOP/s; 484 in bands; 571 with one CTA per tile, which use_persistent keeps for them). A
 * static order: no counter to reset between calls, so a captured graph replays it as it is. */
/* Params.band_kv for a launch: bands of one K/V head, packed or not (grown where a band would hold
 * fewer tiles than the grid has CTAs: ap_hopper_band_kv), so a round's CTAs share one head's K/V.
 * A packed tile holds a whole group: bands of 8 K/V heads put every sequence's K/V of 8 heads in
 * flight at once (B16 S4096: the K/V of 16 sequences past L2); bands of one read B4 S4096's K/V
 * from DRAM 260 MB against 1000 (H100, 2026-11-27, causal H32/8 D128 packed, TFLOP/s, bands of
 * 1 / 8: the varlen mix 437 / 325, B16 S4096 536 / 410). One head per tile took bands of 8 until
 * 2026-11-28 (bench/results/2026-11-28-h100.md, call 102, medians, 8 / 1): causal B4 S4096 D128
 * 607 / 627 and 600 / 620, B16 S4096 535 / 566, paged16 472 / 491, D64 400 / 399 and 371 / 383,
 * non-causal D128 631 / 617 and 623 / 642 (within its spread). */
inline int band_kv_for(int num_items, int grid, int group_slots) {
    return ap_hopper_band_kv(1, num_items, grid, group_slots);
}

/* The CTA's work tile at round r or, where that round has none for it (a band's last round), the
 * next round that has one: r moves there. false past the last. */
__device__ __forceinline__ bool tile_at(const Params &p, int &r, int &item, int &h) {
    if (!kPersistent || !p.persistent) {
        item = blockIdx.x;
        h = blockIdx.y;
        return r == 0;
    }
    const int slots = slot_count(p);
    for (;; ++r) {
        const int k = ap_hopper_round_tile(r, blockIdx.x, gridDim.x, p.num_items, slots,
                                           p.group >> p.pack_shift, p.band_kv, &item, &h);
        if (k != 0) {
            return k > 0;
        }
    }
}

#include "prefill_hopper_merge.cuh" /* the consumers with merged tile boundaries */

/* Whether the kernel (kD, kMode, kPaged) has the scheduler warp (scheduler_loop): the merged
 * consumers (two Q buffers: the ragged source or kPagedRing, kMode 1 / 2) with the producer's
 * TileDesc, which carries every tile to them. */
template <int kD, int kMode, int kPaged> __host__ __device__ constexpr bool sched_built() {
    return kTileDesc && AP_HOPPER_QBUF >= 2 && kMode != 0 && Geo<kD, kPaged>::kQBufs == 2;
}

/* Whether the kernel can run the dynamic schedule (use_dynamic decides per launch; the runtime
 * option `fa_varlen.schedule: rounds` turns it off): its scheduler warp claims the tiles. */
template <int kD, int kMode, int kPaged> __host__ __device__ constexpr bool dynamic_built() {
    return kPersistent && sched_built<kD, kMode, kPaged>();
}

/* The dynamic schedule's next tile with K/V tiles (h, sh), claimed from Params.tile_counter;
 * false once the claims pass the last tile, after which this CTA takes no more: it counts itself
 * done (tile_counter[1]), and the last CTA done sets both counters back to 0 (a CTA's claims
 * come one after another, each one's result read before the next is issued, so every claim of
 * the launch came before the last count). The host takes this schedule only for plans without a
 * tile of no K/V tile (use_dynamic): the consumers learn their tiles from the producer's TileDesc
 * alone, and such a tile would have no Q load to carry it. */
template <int kPaged, int kKeys, int kTR = kRows>
__device__ __forceinline__ bool claim_load(const Params &p, int &h, Shape &sh) {
    const int slots = slot_count(p);
    for (;;) {
        const int t = atomicAdd(p.tile_counter, 1);
        int item = 0;
        if (ap_hopper_queue_tile(t, p.queue_items, slots, p.group >> p.pack_shift, p.band_kv, &item,
                                 &h) < 0) {
            __threadfence();
            if (atomicAdd(p.tile_counter + 1, 1) == static_cast<int>(gridDim.x) - 1) {
                p.tile_counter[0] = 0;
                p.tile_counter[1] = 0;
            }
            return false;
        }
        sh = item_shape<kPaged, kKeys, kTR>(p, item, h);
        if (sh.n_blocks > 0) {
            return true;
        }
    }
}

/* The CTA's work tile at round r or after it that has K/V tiles to load (r moves there), with its
 * shape; false past the last. Tiles without (n_blocks <= 0) load nothing: the consumers write
 * zeros and -inf for them without waiting, or (not a tile start) skip them. kDynamic:
 * claim_load's tile instead (r: the CTA's count of loaded tiles). */
template <int kPaged, int kKeys, bool kDynamic = false, int kTR = kRows>
__device__ __forceinline__ bool next_load(const Params &p, int &r, int &h, Shape &sh) {
    if constexpr (kDynamic) {
        return claim_load<kPaged, kKeys, kTR>(p, h, sh);
    }
    int item = 0;
    for (; tile_at(p, r, item, h); ++r) {
        sh = item_shape<kPaged, kKeys, kTR>(p, item, h);
        if (sh.n_blocks > 0) {
            return true;
        }
    }
    return false;
}

/* The scheduler warp's lane (kernels with sched_built): the CTA's work tiles with K/V tiles, in
 * order, into the ring of kSchedSlots TileDescs (Bars::sched; s_full / s_empty), the end as r =
 * -1; each found before its slot is waited for. It takes the tile lookups (dependent global loads:
 * a claim, the plan item, its indptrs) off the producer, which waited on them between one tile's
 * loads and the next while the consumers waited for those loads (H100, 2026-11-27: the dynamic
 * schedule's claim there cost the varlen mix 5% and B4 S4096 1.5%; the lookup moved after a
 * tile's first K/V loads cost the dense shapes 2-4%). kDynamic: claim_load's tiles, else the
 * rounds'. */
template <int kD, int kPaged, bool kDynamic>
__device__ __forceinline__ void scheduler_tiles(Bars *b, const Params &p) {
    TileDesc d = {0, 0, {}};
    for (int n = 0;; ++n) {
        const bool have =
            next_load<kPaged, Geo<kD, kPaged>::kKeys, kDynamic, Geo<kD, kPaged>::kTileRows>(
                p, d.r, d.h, d.sh);
        const int s = n % kSchedSlots;
        bar_wait(&b->s_empty[s], ((n / kSchedSlots) & 1) ^ 1);
        desc_store(&b->sched[s], have ? d : TileDesc{-1, 0, {}});
        bar_arrive(&b->s_full[s]); /* releases the stores */
        if (!have) {
            return;
        }
        ++d.r; /* the rounds: the next search's first; dynamic: the count */
    }
}

template <int kD, int kMode, int kPaged>
__device__ __forceinline__ void scheduler_loop(Bars *b, const Params &p) {
    if constexpr (dynamic_built<kD, kMode, kPaged>()) {
        if (p.queue_items > 0) {
            scheduler_tiles<kD, kPaged, true>(b, p);
            return;
        }
    }
    scheduler_tiles<kD, kPaged, false>(b, p);
}

/* The scheduler's n-th tile (r < 0: the end); its slot goes back once read. kWarp: taken by the
 * paged source's producer warp, every lane reading it and lane 0 giving the slot back after the
 * warp's reads. */
template <bool kWarp = false> __device__ __forceinline__ TileDesc sched_take(Bars *b, int n) {
    const int s = n % kSchedSlots;
    bar_wait(&b->s_full[s], (n / kSchedSlots) & 1);
    const TileDesc d = desc_load<true>(&b->sched[s]);
    if constexpr (kWarp) {
        __syncwarp();
        if (threadIdx.x % 32 == 0) {
            bar_arrive(&b->s_empty[s]);
        }
    } else {
        bar_arrive(&b->s_empty[s]); /* after the loads (release) */
    }
    return d;
}

/* The producer (thread 0, or for the paged source warp 0 and, with AP_HOPPER_PAGED_VWARP, warp 2
 * for the V loads: kRole) over the CTA's work tiles: each one's Q once its previous Q is released,
 * then its K/V tiles into the ring, which runs on from the last tile's (so the next tile's loads
 * start while the consumers finish this one). With two Q buffers (the ragged source, kPagedRing)
 * the next tile's Q goes out kQLead K/V tiles before this one's last (produce). kSched: the tiles
 * come from the scheduler warp (sched_take), else the producer finds them (next_load). */
template <int kD, int kPaged, bool kSched, int kRole = kLoadAll>
__device__ __forceinline__ void producer_loop(const CUtensorMap *tq, const CUtensorMap *tk,
                                              const CUtensorMap *tv, uint8_t *sq, uint8_t *sk,
                                              uint8_t *sv, Bars *b, const Params &p) {
    constexpr int kKeys = Geo<kD, kPaged>::kKeys;
    constexpr bool kAhead = Geo<kD, kPaged>::kQBufs == 2;
    int ring = 0, qn = 0;
    TileDesc cur = {0, 0, {}};
    bool have = false, q_done = false;
    if constexpr (kSched) { /* the scheduler's tile n is Q load n: every one has K/V tiles */
        cur = sched_take<kPaged != kRagged>(b, 0);
        have = cur.r >= 0;
    } else {
        have = next_load<kPaged, kKeys, false, Geo<kD, kPaged>::kTileRows>(p, cur.r, cur.h, cur.sh);
    }
    while (have) {
        TileDesc next = {cur.r + 1, 0, {}};
        bool have2 = false;
        if constexpr (kSched) {
            next = sched_take<kPaged != kRagged>(b, qn + 1);
            have2 = next.r >= 0;
        } else {
            have2 = next_load<kPaged, kKeys, false, Geo<kD, kPaged>::kTileRows>(p, next.r, next.h,
                                                                                next.sh);
        }
        produce<kD, kPaged, kRole>(tq, tk, tv, sq, sk, sv, b, p, cur, ring, qn, q_done,
                                   kAhead && have2, next);
        q_done = kAhead && have2;
        ring += cur.sh.n_blocks;
        ++qn;
        have = have2;
        cur = next;
    }
    if constexpr (kAhead && kTileDesc && kRole != kLoadV) {
        /* the end: Q load qn's slot says so (r = -1), published by a bare arrival on its q_full
         * (no Q tile); the merged consumers' last lookahead waits for it. The paged source's
         * warp: lane 0. */
        if (kPaged == kRagged || threadIdx.x == 0) {
            const int qb = qn % 2;
            bar_wait(&b->q_empty[qb], ((qn / 2) & 1) ^ 1);
            desc_store(&b->desc[qb], TileDesc{-1, 0, {}});
            bar_arrive(&b->q_full[qb]);
        }
    }
}

/* The consumer warpgroups over the CTA's work tiles, in the producer's order. Ping-pong (kMode
 * 2): warpgroup 1's first hand-over lets warpgroup 0 start; after that every GEMM issue of one
 * warpgroup hands the turn to the other, across tiles too, so one's epilogue runs under the
 * other's GEMMs; warpgroup 0's final wait takes warpgroup 1's last hand-over, so every named
 * barrier arrival is matched before the CTA exits. */
template <typename T, int kMode, int kD, int kPaged, class Q = QSmem<T, kD, kPaged>>
__device__ __forceinline__ void consumer_loop(const uint8_t *sq, const uint8_t *sk,
                                              const uint8_t *sv, Bars *b, const Params &p) {
    const int wg = threadIdx.x / 128 - 1;
    if (kMode == 2 && wg == Q::G::kWGs - 1) {
        named_arrive<256>(1);
    }
    if constexpr (AP_HOPPER_QBUF >= 2 && kMode != 0 && Q::G::kQBufs == 2) {
        consumer_loop_merged<T, kMode == 2, kPaged, Q>(sq, sk, sv, b, p);
    } else {
        int ring = 0, qn = 0, item = 0, h = 0;
        for (int r = 0; tile_at(p, r, item, h); ++r) {
            const Shape sh =
                item_shape<kPaged, Geo<kD, kPaged>::kKeys, Geo<kD, kPaged>::kTileRows>(p, item, h);
            if (sh.n_blocks < 0) {
                continue; /* not a tile start: another tile covers these tokens */
            }
            if constexpr (kMode == 0) {
                consume<T, false, kD, kPaged>(p, sh, sq, sk, sv, b, h, ring, qn);
            } else {
                consume_pipe<T, false, kMode == 2, Q>(p, sh, sq, sk, sv, b, h, ring, qn);
            }
            if (sh.n_blocks > 0) {
                ring += sh.n_blocks;
                ++qn;
            }
        }
    }
    if (kMode == 2 && wg == 0) {
        named_sync<256>(1);
    }
}

/* The kernels' shared memory, aligned to 1024 bytes (the 128-byte swizzle's atom). */
__device__ __forceinline__ uint8_t *smem_base(uint8_t *raw) {
    return reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                       ~static_cast<uintptr_t>(1023));
}

/* Thread 0's init of the Q and ring barriers (stages of them; v_full with v_full_count
 * arrivals: 1, a TMA's, or the fp8 kernel's converter warps). The caller fences and syncs. */
__device__ __forceinline__ void bars_init(Bars *b, int stages, uint32_t v_full_count,
                                          uint32_t s_empty_count = 1, uint32_t warps = 8) {
    for (int qb = 0; qb < kMaxQBufs; ++qb) {
        bar_init(&b->q_full[qb], 1);
        bar_init(&b->q_empty[qb], warps); /* one arrival per consumer warp */
    }
    for (int s = 0; s < stages; ++s) {
        bar_init(&b->k_full[s], 1);
        bar_init(&b->v_full[s], v_full_count);
        bar_init(&b->k_empty[s], warps);
        bar_init(&b->v_empty[s], warps);
    }
    for (int s = 0; s < kSchedSlots; ++s) {
        bar_init(&b->s_full[s], 1);
        bar_init(&b->s_empty[s], s_empty_count); /* a warp per taker */
    }
}

/* kMode 0: one warpgroup GEMM then softmax, in turn; 1: the next tile's S GEMM and this one's
 * P V in flight during softmax (intra-warpgroup overlap); 2: 1 plus ping-pong between the two
 * consumer warpgroups on named barriers. kD: the Q/K head dim (Geo).
 * Barriers (mbarriers in shared memory, phases counted per CTA across its work tiles): Q load qn
 * in buffer qb = qn % kQBufs (kQBufs 1 unless AP_HOPPER_QBUF), its use u = qn / kQBufs: q_full[qb]
 * (producer's expect_tx + TMA; consumers wait phase u & 1), q_empty[qb] (8 consumer warps arrive
 * after their tile's last S = Q K; the producer waits phase (u & 1) ^ 1 before loading it again),
 * k_full / k_empty of K stage g % kStg (consumers wait phase (g / kStg) & 1), v_full / v_empty of
 * V stage g % kVStg (phase (g / kVStg) & 1; kVStg is kStg unless AP_HOPPER_QBUF at kD 128), the
 * empty ones with 8 warps arriving after S / after P V and the producer waiting the flipped
 * phase. With two Q buffers the producer loads tile r + 1's Q once tile r - 1 released its
 * buffer, so a tile's Q is in shared memory before its first S. A tile with no key
 * tile (n_blocks 0) loads nothing and is skipped by both sides alike, since both derive n_blocks
 * from the same plan item. */
template <typename T, int kMode, int kD = 128, int kPaged = kRagged>
__global__ void __launch_bounds__(Geo<kD, kPaged>::kThreads, 1)
    prefill_hopper_kernel(const __grid_constant__ CUtensorMap tq,
                          const __grid_constant__ CUtensorMap tk,
                          const __grid_constant__ CUtensorMap tv,
                          const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    using G = Geo<kD, kPaged>;
    uint8_t *sq = smem_base(smem_raw);
    uint8_t *sk = sq + G::kQBufs * G::kQBytes;
    uint8_t *sv = sk + G::kStg * G::kKBytes;
    Bars *b = reinterpret_cast<Bars *>(sv + G::kVStg * G::kVBytes);
    constexpr bool kVWarp = kPaged != kRagged && kPagedVWarp;
    if (threadIdx.x == 0) {
        bars_init(b, G::kStg, 1, kVWarp ? 2 : 1, 4 * G::kWGs);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        /* Geo's budgets (24 / 240 before the persistent loop: the paged producer warp spilled at
         * 24) */
        regs_dec<G::kProducerRegs>();
        constexpr bool kSched = sched_built<kD, kMode, kPaged>();
        if (threadIdx.x < (kPaged != kRagged ? 32 : 1)) {
            producer_loop<kD, kPaged, kSched, kVWarp ? kLoadQK : kLoadAll>(&tq, &tk, &tv, sq, sk,
                                                                           sv, b, p);
        } else if (kSched && threadIdx.x == 32) {
            scheduler_loop<kD, kMode, kPaged>(b, p);
        } else if (kVWarp && threadIdx.x >= 64 && threadIdx.x < 96) {
            producer_loop<kD, kPaged, kSched, kLoadV>(&tq, &tk, &tv, sq, sk, sv, b, p);
        }
    } else {
        regs_inc<G::kConsumerRegs>();
        consumer_loop<T, kMode, kD, kPaged>(sq, sk, sv, b, p);
    }
#endif
}

#include "prefill_hopper_f8.cuh" /* fp8 K/V: its Q operand, producer, converters and kernel */

/* Whether a launch takes the persistent grid (kPersistent builds only): the ragged source and
 * kPagedRing (src) with head dims 128 and 64 and GQA (group >= 2). H100, 2026-11-26,
 * hopper_prefill_check, ping-pong consumers in one call: causal B4 S4096 H32/8 D128 569.6 TFLOP/s
 * persistent against 565.0 with one CTA per tile, D64 387.8 against 351.3; fav-bench's varlen mix
 * 436 against 363 (156d4fb). One CTA per tile stays ahead without GQA (H32/32: 571 against 484
 * even in bands), for MLA's 192/128 (616 against 381) and D256 (651 / 641). */
inline bool use_persistent(int head_dim_qk, int src, int group) {
    return kPersistent && src != kPagedTile && (head_dim_qk == 128 || head_dim_qk == 64) &&
           group >= 2;
}

/* The kernel for a paged launch (any page size the kernel takes, any pack_shift) by its group and
 * head dim: kPagedRing wherever the persistent grid serves it (use_persistent: head dims 128 and 64
 * with GQA), else kPagedTile. H100, 2026-11-28 (bench/results/2026-11-28-h100-b.md, call 108,
 * causal H32/8 B4 S4096 D128 unless said, TFLOP/s, tile / ring, both with the V warp): page 16
 * 552-566 / 603-606, non-causal 573-603 / 612-616, page 32 554-564 / 603-613, page 64 559-567 /
 * 615-617, D64 page 16 340-347 / 346-364, the varlen mix on page 16 (packed) 402-409 / 475-488.
 * Before the V warp (AP_HOPPER_PAGED_VWARP) the tile kernel's 3 V stages had kept page 16 one head
 * per tile (500 against the ring's 505, non-causal 534 against 513; call 103). */
inline int paged_source(int group, int head_dim_qk) {
    return use_persistent(head_dim_qk, kPagedRing, group) ? kPagedRing : kPagedTile;
}

/* The current device's SM count, 0 where it cannot be read. */
inline int device_sm_count() {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        sms <= 0) {
        cudaGetLastError();
        sms = 0;
    }
    return sms;
}

/* The grid of a launch over num_items plan items and `heads` query heads: (items, heads), or
 * (persistent, which Params.persistent must match) one CTA per SM of the current device, no more
 * than the tiles (all the tiles where the SM count cannot be read: each CTA then takes one). */
inline dim3 launch_grid(int num_items, int heads, bool persistent) {
    if (!kPersistent || !persistent) {
        return dim3(static_cast<unsigned>(num_items), static_cast<unsigned>(heads));
    }
    const long long tiles = static_cast<long long>(num_items) * heads;
    const int sms = device_sm_count();
    const long long n = sms > 0 && sms < tiles ? sms : tiles;
    return dim3(static_cast<unsigned>(n > 0 ? n : 1)); /* a CTA with no tile exits at once */
}

/* A launch's schedule, from its Params (items, heads, group, pack_shift): Params.persistent
 * (use_persistent's rule, or `force` 0 / 1), the grid over the items and head slots, and
 * Params.band_kv for that grid. */
inline dim3 launch_schedule(Params &p, int head_dim_qk, int src, int force = -1) {
    const bool persistent = force < 0 ? use_persistent(head_dim_qk, src, p.group) : force > 0;
    p.persistent = persistent ? 1 : 0;
    const dim3 grid = launch_grid(p.num_items, slot_count(p), persistent);
    p.band_kv = band_kv_for(p.num_items, static_cast<int>(grid.x), p.group >> p.pack_shift);
    return grid;
}

/* Params.tile_counter and Params.queue_items of a launch (after launch_schedule): the dynamic
 * schedule where the kernel has it, the grid is the persistent one, the plan gave the counters
 * (two int32 at 0, left at 0 by every launch), none of its items has no K/V tile (min_kv_tiles >
 * 0) and the batch is packed (Params.pack_shift > 0: sequences short or ragged enough to pad
 * one-head tiles), unless `any` (measurements). The rounds hand out the same tiles in the same
 * order, each CTA its share fixed in advance; the counter lets a CTA that finishes early take
 * more. H100, 2026-11-27 (hopper_prefill_check --time, three rounds, medians, TFLOP/s, rounds /
 * dynamic): the varlen mix packed 504 / 523, B16 S4096 packed 554 / 554, but B4 S4096 D128 one
 * head per tile 613 / 598 and packed 615 / 591, D64 packed 371 / 348; through fa_varlen the
 * varlen mix 489-502 / 518-519. ncu of the varlen mix on the rounds had put 4.4% of the SMs' time
 * idle at the kernel's end. */
template <int kD, int kMode, int kPaged>
inline void use_dynamic(Params &p, int32_t *tile_counter, int32_t min_kv_tiles, bool any = false) {
    p.tile_counter = tile_counter;
    p.queue_items = 0;
    if (dynamic_built<kD, kMode, kPaged>() && p.persistent != 0 && tile_counter != nullptr &&
        min_kv_tiles > 0 && (any || p.pack_shift > 0)) {
        p.queue_items = p.num_items;
        p.num_items = 0; /* the consumers' tile_at: no tile (they follow the producer's TileDesc) */
    }
}

/* The map of a dense 16-bit [rows][heads][dim] tensor (dim a multiple of 64): boxes of 64
 * columns x box_heads heads x box_rows rows (a K/V tile's Geo::kKeys, or a paged cache's page
 * size, x 1 head; Q: a work tile's tokens x its packed heads, q_map), landing as box_rows x
 * box_heads rows of 128 bytes (at most 256, TMA's box limit), token-major, in the 128-byte
 * swizzle; rows past the end read as zeros. 0 on success. */
inline int make_map(CUtensorMap *map, const void *ptr, int64_t rows, int heads, int dim = kDim,
                    int box_rows = kRows, int box_heads = 1) {
    EncodeTiledFn fn = encode_tiled_fn();
    if (fn == nullptr || rows <= 0 || dim % 64 != 0 || box_heads < 1 || box_heads > heads ||
        box_rows * box_heads < 8 || box_rows * box_heads > 256) {
        return -1;
    }
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(heads),
                                static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(dim) * 2,
                                   static_cast<cuuint64_t>(dim) * 2 * heads};
    const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_heads),
                               static_cast<cuuint32_t>(box_rows)};
    const cuuint32_t estride[3] = {1, 1, 1};
    const CUresult r =
        fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void *>(ptr), dims, strides, box,
           estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -2;
}

/* The Q map of a launch: [tokens][heads][dim], boxes of one work tile (Params.pack_shift) of
 * `rows` rows (Geo::kTileRows). */
inline int q_map(CUtensorMap *map, const void *q, int64_t tokens, int heads, int dim,
                 int pack_shift, int rows = kRows) {
    return make_map(map, q, tokens, heads, dim, rows >> pack_shift, 1 << pack_shift);
}

/* The map of a paged NHD cache [page][page_size][heads][dim] viewed as [rows][heads][dim] for K/V
 * tiles of `keys` (Geo::kKeys), boxes of one page (or page_box(keys) rows of a larger one). The
 * cache's page count is not in the call: the view spans 2^39 bytes (past any GPU's memory), and
 * the kernel only reads rows of listed pages. */
inline int make_paged_map(CUtensorMap *map, const void *pages, int heads, int page_size,
                          int dim = kDim, int keys = kRows) {
    const int64_t row_bytes = static_cast<int64_t>(heads) * dim * 2;
    const int64_t rows = heads > 0 ? (static_cast<int64_t>(1) << 39) / row_bytes : 0;
    const int box = page_box(keys);
    return make_map(map, pages, rows < INT32_MAX ? rows : INT32_MAX, heads, dim,
                    page_size < box ? page_size : box);
}

} // namespace ap_hopper

#endif /* AP_COMMON_PREFILL_HOPPER_CUH */
