// decode.cu: MLA absorbed decode over the paged latent cache, on tensor cores (mma.sync), with a
// device-computed split over KV tiles and a combine kernel launched with PDL.
//
// Per row r (a query token and head) over the keys j the row may see (causal, aligned to the end):
//   s_j = (q_nope_r . c_j + q_rope_r . kpe_j) * sm_scale * kv_scale
//   out_r = sum_j softmax(s)_j c_j * kv_scale,   lse_r = log(sum_j exp(s_j))
// where row j of the cache is [c_j (512) | kpe_j (64)], stored in bf16, or fp8 with kv_scale.
// A CTA holds `M` rows' queries (M x 576) in shared memory and streams 64-token tiles of the cache
// (cp.async, two stages). Its 8 warps form (M/16) row blocks x (8 / (M/16)) column splits: warp
// (rb, cs) computes S for rows rb*16.. over tokens cs*TN.. of the tile, the row maxima are shared
// through shared memory, P goes to shared memory as bf16, and the warp accumulates O for its rows
// over output dims cs*DN.. (DN = 512 / splits). V is the first 512 columns of the same K tile.
// fp8: the 16-row kernel with Q in registers converts K and V fragments as it loads them (half
// mma, Layout::kFragFp8); the others convert each tile to bf16 in shared memory first.
#include <cuda_runtime.h>
#include <math.h>

#include <type_traits>

#include "../common/cp_async.cuh"
#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/pdl.cuh"
#include "decode_finish.cuh"
#include "decode_flat.cuh"
#include "mla.h"

#define MLA_WHO "trtllm_mla decode"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = 8;
constexpr int kChunks = MLA_ROW / 8; // 16-byte chunks of a bf16 row: 72
constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][576] bf16 tile, swizzled so that
// eight consecutive rows at the same chunk land in eight different bank groups (ldmatrix).
__device__ __forceinline__ uint32_t tile_off(int row, int chunk) {
    return static_cast<uint32_t>(row * (MLA_ROW * 2) + ((chunk ^ (row & 7)) << 4));
}
// Same for the [M][64] bf16 P tile (8 chunks a row).
__device__ __forceinline__ uint32_t p_off(int row, int chunk) {
    return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Byte offset of 16-byte chunk `chunk` (16 dims) of row `row` in a [rows][576] fp8 stage read by
// fragments (kFragFp8): the chunk's low two bits are XORed with ((row >> 1) & 1, (row >> 2) & 1),
// so the eight rows of an ldmatrix and the four rows of a 64-bit load phase hit distinct banks.
__device__ __forceinline__ uint32_t fp8_off(int row, int chunk) {
    const int f = (((row >> 1) & 1) << 1) | ((row >> 2) & 1);
    return static_cast<uint32_t>(row * MLA_ROW + ((chunk ^ f) << 4));
}

// STAGES load stages (2, or 3 for M = 16). QREG (M = 16 with 3 stages): every warp keeps the 16
// rows' Q fragments in registers (144), read once from a stage buffer before the pipeline reuses
// it, so Q takes no shared memory and no per-tile ldmatrix.
template <int M, bool FP8, int STAGES> struct Layout {
    static constexpr bool kQReg = M == 16 && STAGES == 3;
    // fp8 with Q in registers: K and V fragments are converted as they are loaded (half pairs,
    // half mma), so no converted tile and no barrier for it; the fp8 stage is swizzled (fp8_off).
    static constexpr bool kFragFp8 = FP8 && kQReg;
    static constexpr int kRowBlocks = M / 16;
    static constexpr int kSplits = kWarps / kRowBlocks; // column splits
    static constexpr int kTN = MLA_TILE / kSplits;      // tokens of S per warp
    static constexpr int kDN = MLA_LATENT / kSplits;    // output dims per warp
    static constexpr int kQBytes = kQReg ? 0 : M * MLA_ROW * 2;
    static constexpr int kTileBytes = MLA_TILE * MLA_ROW * 2;              // bf16 tile
    static constexpr int kStageBytes = MLA_TILE * MLA_ROW * (FP8 ? 1 : 2); // one load stage
    static constexpr int kPBytes = M * MLA_TILE * 2;
    static constexpr int kRedBytes = kSplits * M * 4;
    static constexpr int kQ = 0;
    static constexpr int kStage0 = kQ + kQBytes;
    static constexpr int kConv = kStage0 + STAGES * kStageBytes; // fp8 only: the converted tile
    static constexpr int kP = kConv + (FP8 && !kFragFp8 ? kTileBytes : 0);
    static constexpr int kRedMax = kP + kPBytes;
    static constexpr int kRedSum = kRedMax + kRedBytes;
    static constexpr int kBytes = kRedSum + kRedBytes;
    // where Q is staged: its own region, or (QREG) the last stage until its fragments are read
    static constexpr int kQStage = kQReg ? kStage0 + (STAGES - 1) * kStageBytes : kQ;
    static_assert(!kQReg || M * MLA_ROW * 2 <= kStageBytes, "Q must fit a stage");
    static_assert(kBytes <= 232448, "over the H100's shared memory per block");
};

// The cache slot of this thread's token row of KV tile `tile` (four threads share a row), or -1
// past kv_len. Split from the copies so the page-table load of the next tile can be issued before
// the barrier that precedes its copies, not serialised after it.
__device__ __forceinline__ int64_t tile_slot(const mla_decode_params &p, const Seq &sq, int tile) {
    const int pos = tile * MLA_TILE + (threadIdx.x >> 2);
    if (pos >= sq.kv_len) return -1;
    const int shift = p.page_size == 64 ? 6 : 5;
    return (static_cast<int64_t>(__ldg(sq.pages + (pos >> shift))) << shift) +
           (pos & (p.page_size - 1));
}

// Issue the cp.async copies of this thread's quarter of its token row into `stage`; a row past
// kv_len (slot -1) is zero-filled.
template <bool FP8, bool SWZ8 = false>
__device__ __forceinline__ void load_tile(const mla_decode_params &p, int64_t slot,
                                          uint8_t *stage) {
    const int row = threadIdx.x >> 2, part = threadIdx.x & 3;
    const bool valid = slot >= 0;
    constexpr int kRowBytes = MLA_ROW * (FP8 ? 1 : 2);
    constexpr int kRowChunks = kRowBytes / 16;
    const uint8_t *src = static_cast<const uint8_t *>(p.kv_pages) + (valid ? slot : 0) * kRowBytes;
    const uint32_t base = ap_smem_addr(stage);
    static_assert(kRowChunks % 4 == 0, "four threads share a row's chunks");
    if constexpr (SWZ8) {
        // chunk part + 4 i: fp8_off's XOR touches the low two bits only, so one source and one
        // destination address, the chunks at immediate offsets of 64 bytes
        const uint32_t dst = base + fp8_off(row, part);
        const uint8_t *src0 = src + part * 16;
#pragma unroll
        for (int i = 0; i < kRowChunks / 4; i++) ap_cp_async_16(dst + 64 * i, src0 + 64 * i, valid);
    } else {
        // a loop, not 18 unrolled copies at each call site, whose code a split's few tiles run
        // cold (bench/results/2026-11-28-h200-f.md, H200): H128 fp8 (64 rows) +2.1%, B1 L32768
        // sleep-timed +1%, B128 H16 unchanged, the 2-stage option's B128 H16 1.5% slower
#pragma unroll 1
        for (int c = part; c < kRowChunks; c += 4) {
            const uint32_t dst = FP8 ? base + row * kRowBytes + c * 16 : base + tile_off(row, c);
            ap_cp_async_16(dst, src + c * 16, valid);
        }
    }
}

// fp8 tile -> bf16 tile (exact: every e4m3 value is a bf16), swizzled like a bf16 stage.
__device__ __forceinline__ void convert_tile(const uint8_t *raw, uint8_t *conv) {
    for (int i = threadIdx.x; i < MLA_TILE * (MLA_ROW / 16); i += kThreads) {
        const int row = i / (MLA_ROW / 16), c16 = i % (MLA_ROW / 16);
        const uint4 in = *reinterpret_cast<const uint4 *>(raw + row * MLA_ROW + c16 * 16);
        const uint32_t words[4] = {in.x, in.y, in.z, in.w};
        uint32_t outw[8];
#pragma unroll
        for (int w = 0; w < 4; w++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t hb =
                    ap_fp8x2_to_half2_bits(static_cast<uint16_t>(words[w] >> (16 * h)));
                const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&hb));
                outw[2 * w + h] = ap_pack2<__nv_bfloat16>(f.x, f.y);
            }
        }
        *reinterpret_cast<uint4 *>(conv + tile_off(row, 2 * c16)) =
            make_uint4(outw[0], outw[1], outw[2], outw[3]);
        *reinterpret_cast<uint4 *>(conv + tile_off(row, 2 * c16 + 1)) =
            make_uint4(outw[4], outw[5], outw[6], outw[7]);
    }
}

// The queries of this CTA's rows into shared memory (zero rows past the sequence's rows).
template <int M>
__device__ __forceinline__ void load_q(const mla_decode_params &p, const Seq &sq, int row0,
                                       uint8_t *q_smem) {
    const uint32_t base = ap_smem_addr(q_smem);
    const uint8_t *qn = static_cast<const uint8_t *>(p.q_nope);
    const uint8_t *qr = static_cast<const uint8_t *>(p.q_rope);
    const int rows = sq.q_len * p.num_heads;
    for (int i = threadIdx.x; i < M * kChunks; i += kThreads) {
        const int r = i / kChunks, c = i % kChunks;
        const int gr = row0 + r;
        const bool valid = gr < rows;
        const int tok = valid ? gr / p.num_heads : 0, head = valid ? gr % p.num_heads : 0;
        const int64_t t = sq.q_begin + tok;
        const uint8_t *src =
            c < 64 ? qn + 2 * (t * p.q_stride_t + head * p.q_stride_h + c * 8)
                   : qr + 2 * (t * p.qr_stride_t + head * p.qr_stride_h + (c - 64) * 8);
        ap_cp_async_16(base + tile_off(r, c), src, valid);
    }
}

// Q's A fragments when the layout keeps them in registers: read once from the stage Q was
// loaded into, which the pipeline then reuses.
template <class L, int STAGES>
__device__ __forceinline__ void load_q_regs(uint32_t (&qf)[L::kQReg ? MLA_ROW / 32 : 1][2][4],
                                            uint32_t q_base, int lane) {
    if constexpr (L::kQReg) {
        ap_cp_async_wait<STAGES - 1>(); // the Q group
        __syncthreads();
        const int qrow = lane & 15;
#pragma unroll
        for (int k32 = 0; k32 < MLA_ROW / 32; k32++) {
            if constexpr (L::kFragFp8) {
                // dims 64 (k32 >> 1) + 16 t4 + 8 (k32 & 1) .. + 7 of rows g and g + 8, as half
                // pairs, in the order of the fp8 K fragment (see tile_scores)
                uint32_t w[2][4];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = (lane >> 2) + 8 * h;
                    uint32_t in[4];
                    ap_lds128(in,
                              q_base + tile_off(r, 8 * (k32 >> 1) + 2 * (lane & 3) + (k32 & 1)));
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float2 f = ap_unpack2<__nv_bfloat16>(in[i]);
                        w[h][i] = ap_pack2<__half>(f.x, f.y);
                    }
                }
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    qf[k32][m][0] = w[0][2 * m];
                    qf[k32][m][1] = w[1][2 * m];
                    qf[k32][m][2] = w[0][2 * m + 1];
                    qf[k32][m][3] = w[1][2 * m + 1];
                }
            } else {
                ap_ldmatrix_x4(qf[k32][0], q_base + tile_off(qrow, 4 * k32 + (lane >> 4)));
                ap_ldmatrix_x4(qf[k32][1], q_base + tile_off(qrow, 4 * k32 + 2 + (lane >> 4)));
            }
        }
        __syncthreads(); // the last stage is free for tile t_begin + STAGES - 1
    }
}

// One S step of the fp8 fragment layout (kFragFp8): token g's dims 64 (k32 >> 1) + 16 t4 .. + 15,
// one 128-bit load every other step into kw: its first eight dims feed the even step, the last
// eight the odd one; in a step the first four feed the mma of a0, the last four that of a1 (Q
// permuted to match, load_q_regs). fp8_off's XOR touches the chunk's low two bits only, so chunk
// 4 (k32 >> 1) + t4 is chunk t4 plus 64 (k32 >> 1) bytes: one address, immediate offsets.
template <class L>
__device__ __forceinline__ void
qk_step_fp8(int k32, const uint32_t *a0, const uint32_t *a1, float (*sa)[4], float (*sb)[4],
            uint32_t (&kw)[L::kTN / 8][4], uint32_t k_base, const WarpPos &w) {
#pragma unroll
    for (int j = 0; j < L::kTN / 8; j++) {
        if ((k32 & 1) == 0) {
            const int krow = w.cs * L::kTN + j * 8 + w.g;
            const uint32_t addr = k_base + fp8_off(krow, w.t4) + 64 * (k32 >> 1);
            ap_lds128(kw[j], addr);
        }
        uint32_t b[4];
        ap_fp8x4_to_half2x2(kw[j][2 * (k32 & 1)], b[0], b[1]);
        ap_fp8x4_to_half2x2(kw[j][2 * (k32 & 1) + 1], b[2], b[3]);
        ap_mma_16816<__half>(sa[j], a0, b[0], b[1]);
        ap_mma_16816<__half>(sb[j], a1, b[2], b[3]);
    }
}

// S = Q K^T for rows rb*16.., tokens cs*TN.. (TN/8 n-tiles), 18 steps of 32 dims.
template <class L>
__device__ __forceinline__ void tile_scores(const uint32_t (&qf)[L::kQReg ? MLA_ROW / 32 : 1][2][4],
                                            uint32_t q_base, uint32_t k_base, const WarpPos &w,
                                            float (&s)[L::kTN / 8][4]) {
    constexpr int kSN = L::kTN / 8;
    const int lane = w.lane;
    // With one n-tile per warp (M = 16) the 36 mma of S would form one dependent chain:
    // four accumulators (even/odd step x low/high 16 dims) cut it to four chains of 9.
    constexpr int kChains = kSN == 1 ? 4 : 1;
    float sc[kChains][kSN][4];
#pragma unroll
    for (int c = 0; c < kChains; c++)
#pragma unroll
        for (int j = 0; j < kSN; j++) sc[c][j][0] = sc[c][j][1] = sc[c][j][2] = sc[c][j][3] = 0.f;
    uint32_t kw[kSN][4]; // fp8: 16 bytes of K a lane, for two steps (qk_step_fp8)
    // One step of 32 dims: the two A fragments (from registers or shared memory), then for
    // each n-tile the B fragments of both 16-dim halves and two mma.
    auto qk_step = [&](int k32, const uint32_t *a0, const uint32_t *a1, float(*sa)[4],
                       float(*sb)[4]) {
        if constexpr (L::kFragFp8) {
            qk_step_fp8<L>(k32, a0, a1, sa, sb, kw, k_base, w);
        } else {
#pragma unroll
            for (int j = 0; j < kSN; j++) {
                uint32_t b[4];
                const int krow = w.cs * L::kTN + j * 8 + (lane & 7);
                ap_ldmatrix_x4(b, k_base + tile_off(krow, 4 * k32 + (lane >> 3)));
                ap_mma_16816<__nv_bfloat16>(sa[j], a0, b[0], b[1]);
                ap_mma_16816<__nv_bfloat16>(sb[j], a1, b[2], b[3]);
            }
        }
    };
    if constexpr (L::kQReg) {
        // fully unrolled: qf is indexed by compile-time constants only (registers, no stack)
#pragma unroll
        for (int k32 = 0; k32 < MLA_ROW / 32; k32++)
            qk_step(k32, qf[k32][0], qf[k32][1], sc[(2 * (k32 & 1)) % kChains],
                    sc[(2 * (k32 & 1) + 1) % kChains]);
    } else {
#pragma unroll 1
        for (int k64 = 0; k64 < MLA_ROW / 64; k64++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int k32 = 2 * k64 + h;
                uint32_t a0[4], a1[4];
                const int qrow = w.rb * 16 + (lane & 15);
                ap_ldmatrix_x4(a0, q_base + tile_off(qrow, 4 * k32 + (lane >> 4)));
                ap_ldmatrix_x4(a1, q_base + tile_off(qrow, 4 * k32 + 2 + (lane >> 4)));
                qk_step(k32, a0, a1, sc[(2 * h) % kChains], sc[(2 * h + 1) % kChains]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < kSN; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float sum = sc[0][j][e];
#pragma unroll
            for (int c = 1; c < kChains; c++) sum += sc[c][j][e];
            s[j][e] = sum;
        }
}

// Row maxima of this warp's columns, shared with the other column splits through red_max; the
// new running maxima, and alpha = 2^(m_old - m_new) per row.
template <int M, class L>
__device__ __forceinline__ void tile_row_max(const float (&s)[L::kTN / 8][4], float *red_max,
                                             const WarpPos &w, float scale2, float (&m_run)[2],
                                             float (&m_use)[2], float (&alpha)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < L::kTN / 8; j++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    if constexpr (L::kFragFp8) {
        // a row's eight split maxima side by side: two 16-byte loads and a tree, not eight
        // loads and a chain of eight
        static_assert(L::kSplits == 8 && L::kRedMax % 16 == 0, "eight splits, aligned");
        if (w.t4 == 0) {
            red_max[w.g * 8 + w.cs] = mx[0];
            red_max[(w.g + 8) * 8 + w.cs] = mx[1];
        }
    } else if (w.t4 == 0) {
        red_max[w.cs * M + w.rb * 16 + w.g] = mx[0];
        red_max[w.cs * M + w.rb * 16 + w.g + 8] = mx[1];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float tmax = -INFINITY;
        if constexpr (L::kFragFp8) {
            const float4 a = *reinterpret_cast<const float4 *>(red_max + (w.g + 8 * h) * 8);
            const float4 b = *reinterpret_cast<const float4 *>(red_max + (w.g + 8 * h) * 8 + 4);
            tmax = fmaxf(fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w)),
                         fmaxf(fmaxf(b.x, b.y), fmaxf(b.z, b.w)));
        } else {
#pragma unroll
            for (int c = 0; c < L::kSplits; c++)
                tmax = fmaxf(tmax, red_max[c * M + w.rb * 16 + w.g + 8 * h]);
        }
        const float m_new = fmaxf(m_run[h], tmax * scale2);
        m_use[h] = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = ap_exp2_approx(m_run[h] - m_use[h]);
        m_run[h] = m_new;
    }
}

// Online softmax of one tile: P = 2^(s * scale2 - m) to shared memory as bf16, the row sums
// and O rescaled by alpha.
template <int M, class L>
__device__ __forceinline__ void tile_softmax(const float (&s)[L::kTN / 8][4], uint8_t *p_smem,
                                             float *red_max, const WarpPos &w, float scale2,
                                             RowState<L::kDN / 8> &rs_) {
    float alpha[2], m_use[2];
    tile_row_max<M, L>(s, red_max, w, scale2, rs_.m_run, m_use, alpha);
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < L::kTN / 8; j++) {
        float pv[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            pv[e] = ap_exp2_approx(s[j][e] * scale2 - m_use[e >> 1]);
            rs[e >> 1] += pv[e];
        }
        const int col = w.cs * L::kTN + j * 8 + 2 * w.t4;
        const int r = w.rb * 16 + w.g;
        using PT = typename std::conditional<L::kFragFp8, __half, __nv_bfloat16>::type;
        *reinterpret_cast<uint32_t *>(p_smem + p_off(r, col >> 3) + (col & 7) * 2) =
            ap_pack2<PT>(pv[0], pv[1]);
        *reinterpret_cast<uint32_t *>(p_smem + p_off(r + 8, col >> 3) + (col & 7) * 2) =
            ap_pack2<PT>(pv[2], pv[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) rs_.l_run[h] = rs_.l_run[h] * alpha[h] + rs[h];
    // fp8 fragments: O is left alone when no row of the warp grew its maximum (alpha is 1 for
    // all; most tiles of a long sequence), which skips the multiplies, exactly
    if constexpr (L::kFragFp8)
        if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
    for (int i = 0; i < L::kDN / 8; i++) {
        rs_.o[i][0] *= alpha[0];
        rs_.o[i][1] *= alpha[0];
        rs_.o[i][2] *= alpha[1];
        rs_.o[i][3] *= alpha[1];
    }
}

// O += P V: rows rb*16.., dims cs*DN.., 4 steps of 16 tokens.
template <class L>
__device__ __forceinline__ void tile_pv(uint32_t p_base, uint32_t k_base, const WarpPos &w,
                                        float (&o)[L::kDN / 8][4]) {
    const int lane = w.lane;
#pragma unroll
    for (int k16 = 0; k16 < MLA_TILE / 16; k16++) {
        uint32_t a[4];
        ap_ldmatrix_x4(a, p_base + p_off(w.rb * 16 + (lane & 15), 2 * k16 + (lane >> 4)));
        const int vrow = k16 * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
        if constexpr (L::kFragFp8) {
            // fp8: a transposed 8x8 b16 load of two 16-dim chunks gives, per register, tokens
            // 2 t4 and 2 t4 + 1 of dims 2 g and 2 g + 1: bytes (0, 2) feed the even dims' mma,
            // (1, 3) the odd dims'. o[2 c] holds chunk c's even dims, o[2 c + 1] its odd ones.
#pragma unroll
            for (int i = 0; i < L::kDN / 8; i += 4) {
                uint32_t b[4];
                const int chunk = (w.cs * L::kDN + i * 8) / 16 + (lane >> 4);
                ap_ldmatrix_x4_trans(b, k_base + fp8_off(vrow, chunk));
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    // one permute a register: bytes (0, 2) to its low half, (1, 3) to its high
                    uint32_t ev[2], od[2];
                    ap_fp8x4_to_half2x2(__byte_perm(b[2 * c], 0, 0x3120), ev[0], od[0]);
                    ap_fp8x4_to_half2x2(__byte_perm(b[2 * c + 1], 0, 0x3120), ev[1], od[1]);
                    ap_mma_16816<__half>(o[i + 2 * c], a, ev[0], ev[1]);
                    ap_mma_16816<__half>(o[i + 2 * c + 1], a, od[0], od[1]);
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < L::kDN / 8; i += 2) {
                uint32_t b[4];
                const int chunk = (w.cs * L::kDN + i * 8) / 8 + (lane >> 4);
                ap_ldmatrix_x4_trans(b, k_base + tile_off(vrow, chunk));
                ap_mma_16816<__nv_bfloat16>(o[i], a, b[0], b[1]);
                ap_mma_16816<__nv_bfloat16>(o[i + 1], a, b[2], b[3]);
            }
        }
    }
}

// Keys past the row's limit (the last position it may see, causal) or past the sequence: -inf.
template <class L>
__device__ __forceinline__ void tile_mask(float (&s)[L::kTN / 8][4], const Seq &sq, int tile,
                                          const WarpPos &w, const int (&limit)[2]) {
    const int pos0 = tile * MLA_TILE + w.cs * L::kTN;
    if (tile * MLA_TILE + MLA_TILE - 1 > sq.kv_len - sq.q_len) {
#pragma unroll
        for (int j = 0; j < L::kTN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int pos = pos0 + j * 8 + 2 * w.t4 + (e & 1);
                if (pos > limit[e >> 1]) s[j][e] = -INFINITY;
            }
    }
}

// Prologue: Q, then tiles t_begin .. + STAGES - 2, a commit group each (even when empty). QREG:
// Q to registers, then tile t_begin + STAGES - 1 into Q's stage (one group more), not after tile
// t_begin landed: STAGES tiles in flight from the start (a B1 split has ~4 tiles).
template <int M, bool FP8, int STAGES, class L = Layout<M, FP8, STAGES>>
__device__ __forceinline__ void
load_prologue(const mla_decode_params &p, const Seq &sq, int row0, int t_begin, int t_end,
              uint8_t *smem, uint32_t (&qf)[L::kQReg ? MLA_ROW / 32 : 1][2][4], int lane) {
    load_q<M>(p, sq, row0, smem + L::kQStage);
    ap_cp_async_commit();
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {
        if (t_begin + i < t_end)
            load_tile<FP8, L::kFragFp8>(p, tile_slot(p, sq, t_begin + i),
                                        smem + L::kStage0 + i * L::kStageBytes);
        ap_cp_async_commit();
    }
    const int pre = t_begin + STAGES - 1;
    const int64_t pre_slot = L::kQReg && pre < t_end ? tile_slot(p, sq, pre) : -1;
    load_q_regs<L, STAGES>(qf, ap_smem_addr(smem + L::kQStage), lane);
    if constexpr (L::kQReg) {
        if (pre < t_end) load_tile<FP8, L::kFragFp8>(p, pre_slot, smem + L::kQStage);
        ap_cp_async_commit();
    }
}

// Iteration `tile`: wait until it landed and every warp is done with tile - 1, then load tile +
// STAGES - 1 into tile - 1's stage. QREG's first: the prologue's extra group holds that tile.
template <int M, bool FP8, int STAGES, class L = Layout<M, FP8, STAGES>>
__device__ __forceinline__ void load_advance(const mla_decode_params &p, const Seq &sq, int tile,
                                             int stage, int t_begin, int t_end, uint8_t *smem) {
    const int ahead = tile + STAGES - 1;
    const bool first_pre = L::kQReg && tile == t_begin;
    const int64_t next_slot = ahead < t_end && !first_pre ? tile_slot(p, sq, ahead) : -1;
    first_pre ? ap_cp_async_wait<STAGES - 1>() : ap_cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (first_pre) return;
    if (ahead < t_end) // into tile - 1's stage
        load_tile<FP8, L::kFragFp8>(
            p, next_slot, smem + L::kStage0 + ((stage + STAGES - 1) % STAGES) * L::kStageBytes);
    ap_cp_async_commit();
}

// One piece: rows [row0, row0 + M) of sequence sq (rows in all) over its KV tiles [t_begin, t_end),
// its rows to out (slot < 0) or to partial slot `slot`. `trigger`: release a PDL successor once
// the loads are done (the unsplit grid's point for it).
template <int M, bool FP8, int STAGES, class L = Layout<M, FP8, STAGES>>
__device__ __forceinline__ void run_piece(const mla_decode_params &p, const Seq &sq, int row0,
                                          int rows, int t_begin, int t_end, int slot, bool trigger,
                                          uint8_t *smem, const WarpPos &w) {
    uint32_t qf[L::kQReg ? MLA_ROW / 32 : 1][2][4]; // QREG: A fragments of 32 dims per step
    load_prologue<M, FP8, STAGES>(p, sq, row0, t_begin, t_end, smem, qf, w.lane);
    const uint32_t q_base = ap_smem_addr(smem + L::kQStage);

    // Per lane: rows rb*16 + g and + 8 of the CTA; their causal limits (last visible position).
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int gr = row0 + w.rb * 16 + w.g + 8 * h;
        const int tok = gr < rows ? gr / p.num_heads : 0;
        limit[h] = sq.kv_len - sq.q_len + tok;
    }
    const float scale2 = p.sm_scale * p.kv_scale * kLog2e;
    RowState<L::kDN / 8> st;
#pragma unroll
    for (int i = 0; i < L::kDN / 8; i++) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.f;
    st.m_run[0] = st.m_run[1] = -INFINITY;
    st.l_run[0] = st.l_run[1] = 0.f;

    for (int tile = t_begin; tile < t_end; tile++) {
        const int stage = (tile - t_begin) % STAGES;
        uint8_t *cur = smem + L::kStage0 + stage * L::kStageBytes;
        load_advance<M, FP8, STAGES>(p, sq, tile, stage, t_begin, t_end, smem);
        uint8_t *kt = cur;
        if (FP8 && !L::kFragFp8) {
            convert_tile(cur, smem + L::kConv);
            __syncthreads();
            kt = smem + L::kConv;
        }
        const uint32_t k_base = ap_smem_addr(kt);
        float s[L::kTN / 8][4];
        tile_scores<L>(qf, q_base, k_base, w, s);
        tile_mask<L>(s, sq, tile, w, limit);
        tile_softmax<M, L>(s, smem + L::kP, reinterpret_cast<float *>(smem + L::kRedMax), w, scale2,
                           st);
        __syncthreads(); // P complete
        tile_pv<L>(ap_smem_addr(smem + L::kP), k_base, w, st.o);
    }
    ap_cp_async_wait<0>();
    if (trigger) ap_pdl_launch_dependents(); // a PDL successor of the caller's
    rows_finish<M, L>(p, sq, st, reinterpret_cast<float *>(smem + L::kRedSum), w, row0, rows, slot);
}

// The flat schedule (decode_flat.cuh): warp 0 finds the CTA's share, which the CTA then runs
// piece by piece (or sequence by sequence, whole).
template <int M, bool FP8, int STAGES, class L = Layout<M, FP8, STAGES>>
__device__ __forceinline__ void run_flat(const mla_decode_params &p, uint8_t *smem,
                                         const WarpPos &w) {
    const int cta = blockIdx.x;
    // kRedSum: free until rows_finish, whose first barrier follows every thread's read of it
    const FlatShare f =
        flat_share_cta(p, cta, p.flat_ctas, reinterpret_cast<int *>(smem + L::kRedSum));
    if (f.whole) {
        for (int seq = cta; seq < p.num_seqs; seq += p.flat_ctas) {
            const Seq sq = seq_of(p, seq);
            const int rows = sq.q_len * p.num_heads;
            if (rows <= 0) continue;
            const int tiles = (sq.kv_len + MLA_TILE - 1) / MLA_TILE;
            __syncthreads(); // the previous sequence's last reads of shared memory are done
            run_piece<M, FP8, STAGES>(p, sq, 0, rows, 0, tiles, -1, false, smem, w);
        }
        return;
    }
    int seq = f.seq, at = f.seq_start; // at: the flat position of seq's first tile
    if (seq < 0) return;
    for (int pos = f.begin; pos < f.end && seq < p.num_seqs; seq++) {
        const Seq sq = seq_of(p, seq);
        const int rows = sq.q_len * p.num_heads;
        const int tiles = rows > 0 && sq.kv_len > 0 ? (sq.kv_len + MLA_TILE - 1) / MLA_TILE : 0;
        const int t_begin = pos - at, t_end = min(tiles, f.end - at);
        if (t_end > t_begin) {
            const bool whole = t_begin == 0 && t_end == tiles;
            const int slot = whole ? -1 : 2 * cta + (pos == f.begin ? 0 : 1);
            __syncthreads(); // the previous piece's last reads of shared memory are done
            run_piece<M, FP8, STAGES>(p, sq, 0, rows, t_begin, t_end, slot, false, smem, w);
            pos = at + t_end;
        }
        at += tiles;
    }
}

template <int M, bool FP8, int STAGES>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(const mla_decode_params p) {
    using L = Layout<M, FP8, STAGES>;
    extern __shared__ __align__(128) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const WarpPos w = {lane, lane >> 2, lane & 3, warp % L::kRowBlocks, warp / L::kRowBlocks};
    if (p.flat) {
        // the combine's wait holds until this grid is done; its CTAs take SMs as ours leave
        ap_pdl_launch_dependents();
        run_flat<M, FP8, STAGES>(p, smem, w);
        return;
    }
    const int split = blockIdx.x, rb_cta = blockIdx.y, seq = blockIdx.z;

    // Split: the grid is one wave (ctas x splits <= SMs) and the combine's wait holds until it
    // is done, so the combine may launch now (its CTAs placed as SMs free), not after the loop.
    if (p.num_splits > 1) ap_pdl_launch_dependents();
    const Seq sq = seq_of(p, seq);
    const int row0 = rb_cta * M;
    const int rows = sq.q_len * p.num_heads;
    const int cta = (seq * gridDim.y + rb_cta) * gridDim.x + split;
    if (row0 >= rows) return; // a row block past this sequence's rows: nothing to write

    const int tiles = (sq.kv_len + MLA_TILE - 1) / MLA_TILE;
    const int per = (tiles + p.num_splits - 1) / p.num_splits;
    const int t_begin = min(split * per, tiles), t_end = min(t_begin + per, tiles);
    run_piece<M, FP8, STAGES>(p, sq, row0, rows, t_begin, t_end, p.num_splits == 1 ? -1 : cta,
                              p.num_splits == 1, smem, w);
}

template <int M, bool FP8, int STAGES>
ap_status launch_decode(const mla_decode_params &p, cudaStream_t stream, ap_msgbuf *msg) {
    const int row_blocks = (p.max_q_len * p.num_heads + M - 1) / M;
    const dim3 grid = p.flat ? dim3(p.flat_ctas) : dim3(p.num_splits, row_blocks, p.num_seqs);
    mla_decode_kernel<M, FP8, STAGES>
        <<<grid, kThreads, Layout<M, FP8, STAGES>::kBytes, stream>>>(p);
    ap_status st = ap_cuda_launch_status(MLA_WHO, "mla_decode_kernel", msg);
    if (st != AP_OK || (p.num_splits == 1 && !p.flat)) return st;
    return mla_combine_run(&p, M, stream, msg);
}

template <int M, bool FP8, int STAGES> cudaError_t raise_smem() {
    return cudaFuncSetAttribute(mla_decode_kernel<M, FP8, STAGES>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                Layout<M, FP8, STAGES>::kBytes);
}

} // namespace

extern "C" ap_status mla_decode_setup(ap_msgbuf *msg) {
    const cudaError_t errs[] = {raise_smem<16, false, 2>(), raise_smem<16, true, 2>(),
                                raise_smem<64, false, 2>(), raise_smem<64, true, 2>(),
                                raise_smem<16, false, 3>(), raise_smem<16, true, 3>()};
    for (cudaError_t err : errs)
        if (err != cudaSuccess) return ap_cuda_status(err, MLA_WHO, "cudaFuncSetAttribute", msg);
    return mla_combine_setup(msg);
}

// Three stages (with Q in registers) exist for the 16-row kernels only: the 64-row ones have no
// shared memory left for a third 72 KB stage. Unset (stages 0), the 16-row kernel takes three
// (H100, 2026-11-23: fp8 B128 1.17-1.23x faster with three, bf16 B1 L32768 split 5-8% faster,
// bf16 B128 1% slower; H200, 2026-11-25, three calls: bf16 B128 L4096 0.152 ms with three
// against 0.188-0.190 with two, 1.24x). Option decode_stages 2 keeps the two-stage kernel.
extern "C" ap_status mla_decode_run(const mla_decode_params *p, void *stream_ptr, ap_msgbuf *msg) {
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    if (p->num_seqs == 0) return AP_OK;
    const bool fp8 = p->kv_dtype == AP_DTYPE_FP8_E4M3;
    if (mla_decode_block_rows(p->num_heads, p->max_q_len) == 16) {
        if (p->stages != 2)
            return fp8 ? launch_decode<16, true, 3>(*p, stream, msg)
                       : launch_decode<16, false, 3>(*p, stream, msg);
        return fp8 ? launch_decode<16, true, 2>(*p, stream, msg)
                   : launch_decode<16, false, 2>(*p, stream, msg);
    }
    return fp8 ? launch_decode<64, true, 2>(*p, stream, msg)
               : launch_decode<64, false, 2>(*p, stream, msg);
}
