/* prefill_hopper_f8.cuh: fp8 (e4m3) K/V in the kit's Hopper prefill kernel, ragged source, Q/K
 * head dim 128 or 192 with V 128 (MLA's MHA form over the chunks pack_prefix_chunk_kv writes).
 * - S = Q K^T on fp8 tensor cores (m64n128k32), K read as stored (TMA, 128-byte rows, 128-byte
 *   swizzle). Each consumer turns its 64 Q rows, once per work tile, into two e4m3 terms in
 *   registers (lo in shared memory at 192: kLoSmem), hi + lo, at one scale per row (its largest
 *   magnitude to 448, e4m3's largest):
 *   lo is the rounding error of hi, so Q keeps about 8 bits of precision (bf16 has 8) where one
 *   e4m3 term keeps 4. Both terms go into the same accumulator (2 x kD / 32 k-steps: the tensor
 *   time of the 16-bit S). S comes out in units of q_scale(row) * k_scale, which the softmax's
 *   per-row factor and the LSE take in. One term alone (Q in e4m3, the fp8 attention of FA3)
 *   ran 1.04x (D128) and 1.14x (MLA) our bf16 on the H100 but missed cpu_ref by up to 10% on a
 *   row (rel L2 2.8e-2, LSE 0.07-0.16 off): not kept.
 * - P V in f16: fp8 wgmma wants B K-major, and V's rows run the other way; three warps of the
 *   producer warpgroup turn each fp8 V tile (TMA into a 2-deep staging ring) into the f16 V
 *   stage the 16-bit kernel reads (every e4m3 value is exact in f16; one cvt per two values),
 *   and P is packed to f16 (it is at most 2^8, kLazyLog2). O is scaled by v_scale at the end.
 * A part of prefill_hopper.cuh, which includes it after the consumers; not a header of its own. */
#ifndef AP_COMMON_PREFILL_HOPPER_F8_CUH
#define AP_COMMON_PREFILL_HOPPER_F8_CUH

#ifndef AP_COMMON_PREFILL_HOPPER_CUH
#error "prefill_hopper_f8.cuh is included by prefill_hopper.cuh only"
#endif

#include <cuda_fp8.h>

/* The fp8 kernel's shapes by the Q/K head dim kD (128, or 192 with V 128): Q as in Geo (16-bit,
 * 64-column chunks); a K tile is kKChunks chunks of 128 fp8 columns x 128 keys (kD 192: the
 * second chunk's last 64 columns are the map's zero fill, never multiplied); a V stage is the
 * f16 V of the 16-bit kernel (two 64-column chunks); the fp8 V staging ring 2 x 16 KB.
 * Shared memory: kD 128, 32 + 3 x (16 + 32) + 2 x 16 KB; kD 192, 48 + 2 x (32 + 32) + 2 x 16. */
template <int kD> struct GeoF8 {
    static_assert(kD == 128 || kD == 192, "fp8 K/V: Q/K head dim 128 or 192, V 128");
    static constexpr int kDv = 128;
    static constexpr int kTileRows = kRows, kWGs = 2, kQChunk = kHalfBytes; /* Geo's at kD 128 */
    static constexpr int kKeys = 128;
    static constexpr int kChunks = kD / 64;
    static constexpr int kQBytes = kChunks * kHalfBytes;
    static constexpr int kKChunk = kKeys * 128;
    static constexpr int kKChunks = (kD + 127) / 128;
    static constexpr int kKBytes = kKChunks * kKChunk;
    static constexpr int kVBytes = (kDv / 64) * kKChunk;
    static constexpr int kVsBytes = kKeys * kDv;
    static constexpr int kVsStages = 2;
    static constexpr int kOn = kDv / 2;
    static constexpr int kSn = kKeys / 2;
    static constexpr int kPk = kKeys / 16;
    static constexpr int kStg = kD == 128 ? 3 : 2;
    static constexpr int kVStg = kStg; /* one ring depth for K and V; one Q buffer (Geo's) */
    static constexpr int kQBufs = 1;
    static constexpr int kSmem =
        kQBytes + kStg * (kKBytes + kVBytes) + kVsStages * kVsBytes + 1024 + kBarsBytes;
};

constexpr int kConvWarps = 3; /* warps 1..3 of the producer warpgroup turn fp8 V into f16 */

struct BarsF8 {
    Bars b;               /* b.v_full: kConvWarps arrivals (the converters), not a TMA */
    uint64_t vs_full[2];  /* a staging slot's TMA landed */
    uint64_t vs_empty[2]; /* the converters are done with a staging slot */
};
static_assert(sizeof(BarsF8) <= kBarsBytes, "GeoF8::kSmem's room for the barriers");

/* Whether Q's lo term sits in shared memory (this warpgroup's rows of the Q tile, over the 16-bit
 * values it came from) rather than in registers: at head dim 192 the 48 registers of both terms
 * made ptxas spill 32 bytes; 128 keeps both in registers. */
template <int kD> constexpr bool kLoSmem = kD == 192;

/* S = (Q_hi + Q_lo) K^T over one fp8 K tile: Q's hi term as e4m3 A fragments (kD / 32 k-steps of
 * four registers), its lo term the same (lo) or in shared memory (lo_smem: kLoSmem, e4m3 rows of
 * 128-byte chunks in the 128-byte swizzle, chunk c at c x kHalfBytes), both into one
 * accumulator. */
template <int kD>
__device__ __forceinline__ void qk_gemm_f8(float (&s)[64], const uint32_t (&hi)[kD / 32][4],
                                           const uint32_t (&lo)[kD / 32][4], const uint8_t *lo_smem,
                                           const uint8_t *k) {
    const uint64_t dk = make_desc(k, 16, 1024);
    const uint64_t dl = make_desc(lo_smem, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < kD / 32; ++kk) {
        const uint64_t db = desc_add(dk, (kk / 4) * GeoF8<kD>::kKChunk + (kk % 4) * 32);
        wgmma_rs_n128_e4m3(s, hi[kk], db, kk > 0);
        if constexpr (kLoSmem<kD>) {
            wgmma_ss_n128_e4m3(s, desc_add(dl, (kk / 4) * kHalfBytes + (kk % 4) * 32), db, 1);
        } else {
            wgmma_rs_n128_e4m3(s, lo[kk], db, 1);
        }
    }
}

/* Four 16-bit Q values (T) of row r (of this warpgroup's 64) from column c (a multiple of 4) of
 * the swizzled Q tile, as floats. */
template <typename T>
__device__ __forceinline__ void q_load4(const uint8_t *q, int r, int c, float (&f)[4]) {
    const int cc = c & 63;
    const uint8_t *at =
        q + (c >> 6) * kHalfBytes + r * 128 + ((((cc >> 3) ^ (r & 7)) << 4) | ((cc & 7) << 1));
    uint32_t w[2];
    ap_lds64(w, ap_smem_addr(at));
    float2 lo, hi;
    if constexpr (std::is_same<T, __half>::value) {
        lo = __half22float2(*reinterpret_cast<const __half2 *>(&w[0]));
        hi = __half22float2(*reinterpret_cast<const __half2 *>(&w[1]));
    } else {
        lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w[0]));
        hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w[1]));
    }
    f[0] = lo.x;
    f[1] = lo.y;
    f[2] = hi.x;
    f[3] = hi.y;
}

/* e4m3 bytes of four floats (the first in the lowest byte), rounded to nearest even, saturating;
 * back[] gets the values the bytes hold. */
__device__ __forceinline__ uint32_t e4m3x4(const float (&f)[4], float (&back)[4]) {
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(f[0], f[1]), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(f[2], f[3]), __NV_SATFINITE, __NV_E4M3);
    const float2 b0 = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(lo, __NV_E4M3)));
    const float2 b1 = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(hi, __NV_E4M3)));
    back[0] = b0.x;
    back[1] = b0.y;
    back[2] = b1.x;
    back[3] = b1.y;
    return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

/* The fp8 Q operand (consume_pipe's Q): this thread's share of its warpgroup's 64 Q rows as two
 * e4m3 terms of A fragments (hi, and lo = e4m3 of hi's rounding error, at the same scale),
 * register j of k-step kk holding row r0 + 8 (j & 1), columns 32 kk + 16 (j >> 1) + 4 (lane % 4)
 * + 0..3 (the lower column in the lower byte); one scale per row. */
template <typename T, int kD> struct QF8 {
    using G = GeoF8<kD>;
    using PT = __half;
    uint32_t a[kD / 32][4];
    uint32_t b[kD / 32][4]; /* lo (kLoSmem: only until load() stores it in shared memory) */
    const uint8_t *lo;      /* lo in shared memory (kLoSmem) */
    float sl2[2], ms[2], os;
    __device__ __forceinline__ void init(const Params &p) {
        sl2[0] = sl2[1] = p.scale_log2 * p.k_scale;
        ms[0] = ms[1] = p.sm_scale * p.k_scale;
        os = p.v_scale;
    }
    /* Reads the tile twice: the rows' largest magnitudes (this thread's columns, then over the
     * four threads of a row), then the values scaled to them. A row of zeros (or of values
     * below 1e-30, which round to zero in e4m3 either way) keeps scale 1. */
    __device__ __forceinline__ void load(const Params &, const uint8_t *sq, int wg) {
        const int lane = threadIdx.x % 32;
        const int r = (threadIdx.x % 128 / 32) * 16 + lane / 4;
        const uint8_t *q = sq + wg * 64 * 128;
        lo = q;
        float amax[2] = {0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < kD / 32; ++kk) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float f[4];
                q_load4<T>(q, r + 8 * (j & 1), 32 * kk + 16 * (j >> 1) + 4 * (lane % 4), f);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    amax[j & 1] = fmaxf(amax[j & 1], fabsf(f[e]));
                }
            }
        }
        float inv[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            amax[hr] = fmaxf(amax[hr], __shfl_xor_sync(0xffffffffu, amax[hr], 1));
            amax[hr] = fmaxf(amax[hr], __shfl_xor_sync(0xffffffffu, amax[hr], 2));
            const bool any = amax[hr] > 1e-30f; /* NaN: false, scale 1, and the NaN stays */
            const float scale = any ? amax[hr] * (1.f / 448.f) : 1.f;
            inv[hr] = any ? 448.f / amax[hr] : 1.f;
            sl2[hr] *= scale;
            ms[hr] *= scale;
        }
#pragma unroll
        for (int kk = 0; kk < kD / 32; ++kk) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float f[4];
                q_load4<T>(q, r + 8 * (j & 1), 32 * kk + 16 * (j >> 1) + 4 * (lane % 4), f);
                float x[4], back[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    x[e] = f[e] * inv[j & 1];
                }
                a[kk][j] = e4m3x4(x, back);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    x[e] -= back[e];
                }
                b[kk][j] = e4m3x4(x, back);
            }
        }
        if constexpr (kLoSmem<kD>) {
            /* over this warp's own rows of the 16-bit tile, which only it read: the warp's
             * reads done, each thread stores its four bytes per register where an e4m3 A tile
             * has them (row R, column col: chunk col / 128, 16-byte unit (col % 128 / 16) ^ (R %
             * 8)); then the async-proxy fence and the warpgroup's barrier before any S GEMM */
            __syncwarp();
#pragma unroll
            for (int kk = 0; kk < kD / 32; ++kk) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int row = r + 8 * (j & 1);
                    const int col = (32 * kk) % 128 + 16 * (j >> 1) + 4 * (lane % 4);
                    uint8_t *at = const_cast<uint8_t *>(q) + (kk / 4) * kHalfBytes + row * 128 +
                                  ((((col >> 4) ^ (row & 7)) << 4) | (col & 15));
                    *reinterpret_cast<uint32_t *>(at) = b[kk][j];
                }
            }
            fence_proxy_async();
            named_sync<128>(3 + wg); /* 1 and 2 are the ping-pong turns */
        }
    }
    __device__ __forceinline__ void qk(float (&s)[G::kSn], const uint8_t *k) const {
        qk_gemm_f8<kD>(s, a, b, lo, k);
    }
};

/* The producer thread over one work tile: Q (16-bit, as produce_q), then per K/V tile its fp8 K
 * into the ring and its fp8 V into the staging ring (tile g in slot g % 2). */
template <int kD>
__device__ __forceinline__ void produce_f8(const CUtensorMap *tq, const CUtensorMap *tk,
                                           const CUtensorMap *tv, uint8_t *sq, uint8_t *sk,
                                           uint8_t *svs, BarsF8 *bf, const Shape &sh, int h, int hk,
                                           int ring, int qn) {
    using G = GeoF8<kD>;
    Bars *b = &bf->b;
    produce_q<kD, G::kQBufs>(tq, sq, b, sh, h, qn);
    for (int i = 0; i < sh.n_blocks; ++i) {
        const int g = ring + i;
        const int s = g % G::kStg;
        const int t = g % G::kVsStages;
        const int row = sh.kv_start + (sh.n_blocks - 1 - i) * G::kKeys;
        bar_wait(&b->k_empty[s], ((g / G::kStg) & 1) ^ 1);
        bar_expect_tx(&b->k_full[s], G::kKBytes);
#pragma unroll
        for (int c = 0; c < G::kKChunks; ++c) {
            tma_load(tk, sk + s * G::kKBytes + c * G::kKChunk, &b->k_full[s], 128 * c, hk, row);
        }
        bar_wait(&bf->vs_empty[t], ((g / G::kVsStages) & 1) ^ 1);
        bar_expect_tx(&bf->vs_full[t], G::kVsBytes);
        tma_load(tv, svs + t * G::kVsBytes, &bf->vs_full[t], 0, hk, row);
    }
}

template <int kD>
__device__ __forceinline__ void producer_loop_f8(const CUtensorMap *tq, const CUtensorMap *tk,
                                                 const CUtensorMap *tv, uint8_t *sq, uint8_t *sk,
                                                 uint8_t *svs, BarsF8 *bf, const Params &p) {
    int ring = 0, qn = 0, item = 0, h = 0;
    for (int r = 0; tile_at(p, r, item, h); ++r) {
        const Shape sh = item_shape<false, GeoF8<kD>::kKeys>(p, item, h);
        if (sh.n_blocks <= 0) {
            continue;
        }
        const int h0 = slot_head(p, h) << p.pack_shift; /* the tile's first query head */
        produce_f8<kD>(tq, tk, tv, sq, sk, svs, bf, sh, h0, h0 / p.group, ring, qn);
        ring += sh.n_blocks;
        ++qn;
    }
}

/* Two e4m3 values (the lower byte first) as an f16 pair, exactly. */
__device__ __forceinline__ uint32_t e4m3x2_to_h2(uint32_t two) {
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

/* Eight e4m3 values (two registers, the lowest byte first) as f16, exactly, stored as 16 bytes at
 * the shared-space address at. */
__device__ __forceinline__ void sts_e4m3x8_as_h(uint32_t at, uint32_t a, uint32_t b) {
    ap_sts128(at, e4m3x2_to_h2(a), e4m3x2_to_h2(a >> 16), e4m3x2_to_h2(b), e4m3x2_to_h2(b >> 16));
}

/* The converter warps (1..kConvWarps of the producer warpgroup) over the CTA's K/V tiles in the
 * producer's order: staging slot g % 2 (fp8 [128 keys][128], 128-byte swizzle) into V stage
 * g % kStg (f16, two 64-column chunks of 128-byte rows, 128-byte swizzle), once the consumers
 * released that stage. Converter c (warp c + 1) takes the groups of 8 rows c, c + kConvWarps,
 * ..: lane l reads the 16 fp8 columns from 16 (l / 8) of row l % 8, then those 64 columns on
 * (16-byte loads, each quarter-warp's in 8 distinct bank groups), and writes each one's 32 f16
 * bytes into the first, then the second 64-column chunk. A lane's offsets in a group (the
 * swizzle's XOR with the row) are the same in every group and every tile, so they are computed
 * once, and the accesses are ld / st.shared on 32-bit addresses. The converters share the SM
 * sub-partitions with the consumers, so every instruction of theirs is an issue slot the
 * consumers lose. H100, 2026-11-28 (bench/results/2026-11-28-h100-d.md): with two converter
 * warps in place of three the kernel ran about 15% slower, and this loop (about 20 instructions
 * per 16 bytes, where the generic loads and stores and the per-unit index math took 47) made it
 * 6% faster. */
template <int kD>
__device__ __forceinline__ void convert_loop(const uint8_t *svs, uint8_t *sv, BarsF8 *bf,
                                             const Params &p) {
    using G = GeoF8<kD>;
    const int cw = threadIdx.x / 32 - 1;
    const int lane = threadIdx.x % 32;
    const int r7 = lane & 7, qd = lane >> 3;
    const uint32_t src0 = ap_smem_addr(svs), dst0 = ap_smem_addr(sv);
    /* columns 16 qd .. of the row (and 64 + 16 qd ..: unit qd + 4, the offset ^ 64); their
     * first 8 as f16 (the next 8: unit 2 qd + 1, the offset ^ 16) */
    const uint32_t so = r7 * 128 + ((qd ^ r7) << 4);
    const uint32_t dof = r7 * 128 + (((2 * qd) ^ r7) << 4);
    int g = 0, item = 0, h = 0;
    for (int r = 0; tile_at(p, r, item, h); ++r) {
        const Shape sh = item_shape<false, G::kKeys>(p, item, h);
        for (int i = 0; i < sh.n_blocks; ++i, ++g) {
            const int t = g % G::kVsStages;
            const int s = g % G::kStg;
            bar_wait(&bf->vs_full[t], (g / G::kVsStages) & 1);
            bar_wait(&bf->b.v_empty[s], ((g / G::kStg) & 1) ^ 1);
            const uint32_t src = src0 + t * G::kVsBytes;
            const uint32_t dst = dst0 + s * G::kVBytes;
            for (int grp = cw; grp < G::kKeys / 8; grp += kConvWarps) {
                const uint32_t at = grp * 8 * 128;
#pragma unroll
                for (int half = 0; half < 2; ++half) { /* columns 0..63, then 64..127 */
                    uint32_t x[4];
                    ap_lds128(x, src + at + (so ^ (64 * half)));
                    const uint32_t d = dst + half * G::kKChunk + at;
                    sts_e4m3x8_as_h(d + dof, x[0], x[1]);
                    sts_e4m3x8_as_h(d + (dof ^ 16), x[2], x[3]);
                }
            }
            fence_proxy_async(); /* the f16 stores before the consumers' wgmma reads */
            __syncwarp();
            if (lane == 0) {
                bar_arrive(&bf->vs_empty[t]);
                bar_arrive(&bf->b.v_full[s]);
            }
        }
    }
}

/* The fp8 K/V kernel: prefill_hopper_kernel's ping-pong consumers (kMode 2) over the ragged
 * source, with QF8 for Q, the fp8 producer and the converter warps. Barriers as there, plus
 * v_full from the converters (kConvWarps arrivals) and the staging ring's vs_full (TMA) and
 * vs_empty (kConvWarps arrivals), phases counted per CTA over its K/V tiles. */
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_hopper_f8_kernel(const __grid_constant__ CUtensorMap tq,
                             const __grid_constant__ CUtensorMap tk,
                             const __grid_constant__ CUtensorMap tv,
                             const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    using G = GeoF8<kD>;
    uint8_t *sq = smem_base(smem_raw);
    uint8_t *sk = sq + G::kQBytes;
    uint8_t *sv = sk + G::kStg * G::kKBytes;
    uint8_t *svs = sv + G::kStg * G::kVBytes;
    BarsF8 *bf = reinterpret_cast<BarsF8 *>(svs + G::kVsStages * G::kVsBytes);
    if (threadIdx.x == 0) {
        bars_init(&bf->b, G::kStg, kConvWarps);
        for (int t = 0; t < G::kVsStages; ++t) {
            bar_init(&bf->vs_full[t], 1);
            bar_init(&bf->vs_empty[t], kConvWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        regs_dec<Geo<kD>::kProducerRegs>(); /* as prefill_hopper_kernel */
        if (threadIdx.x == 0) {
            producer_loop_f8<kD>(&tq, &tk, &tv, sq, sk, svs, bf, p);
        } else if (threadIdx.x >= 32) {
            convert_loop<kD>(svs, sv, bf, p);
        }
    } else {
        regs_inc<Geo<kD>::kConsumerRegs>();
        consumer_loop<T, 2, kD, false, QF8<T, kD>>(sq, sk, sv, &bf->b, p);
    }
#endif
}

/* The map of a dense fp8 [rows][heads][dim] tensor: boxes of 128 columns (bytes) x 1 head x 128
 * rows, 128-byte swizzle, reads past the end (rows, or columns past dim 192) as zeros. 0 on
 * success. */
inline int make_map_f8(CUtensorMap *map, const void *ptr, int64_t rows, int heads, int dim) {
    EncodeTiledFn fn = encode_tiled_fn();
    if (fn == nullptr || rows <= 0 || dim % 64 != 0) {
        return -1;
    }
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(heads),
                                static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(dim),
                                   static_cast<cuuint64_t>(dim) * heads};
    const cuuint32_t box[3] = {128, 1, 128};
    const cuuint32_t estride[3] = {1, 1, 1};
    const CUresult r =
        fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void *>(ptr), dims, strides, box,
           estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -2;
}

#endif /* AP_COMMON_PREFILL_HOPPER_F8_CUH */
