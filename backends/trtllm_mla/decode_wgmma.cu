// decode_wgmma.cu: MLA absorbed decode for 64-row blocks on Hopper (sm_90a): TMA + mbarriers +
// wgmma, one producer warp and two consumer warpgroups. Same math, row order, split-KV plan,
// partial states and combine (combine.cu) as decode.cu's 64-row kernel; bf16 latent cache.
//
// Shared memory (1024-aligned): Q [64][576] as nine 64-column blocks of 128-byte rows in the
// 128-byte swizzle (8 KB each, 72 KB), a 2-stage ring of latent tiles [64 tokens][576] in the same
// layout (TMA boxes of 64 columns x 32 rows, so pages of 32 and 64 both work), P [64][64] bf16
// (one swizzled block: the serial schedule's P, the seesaw's P_A), the row max / sum exchange, the
// seesaw's hand-over values and the barriers: 227 KB.
// Consumer warpgroup c (0, 1) computes S for keys 32c..32c+31 of the tile (wgmma m64n32, 36
// k-steps over 576), the two exchange their row maxima through shared memory, each writes its
// half of P (bf16), and then each accumulates O[:, 256c..256c+255] += P V over all 64 keys
// (wgmma m64n256k16, B = V rows MN-major): S is computed once, O is split by columns (128 fp32
// registers a thread).
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>

#include <atomic>

#include "../common/cp_async.cuh"
#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/pdl.cuh"
#include "decode_seq.cuh"
#include "mla.h"

#ifdef AP_KIT_HOPPER
#include "../common/sm90.cuh"
#include "../common/wgmma.cuh"
#endif

#define MLA_WG_WHO "trtllm_mla decode (wgmma)"

// 1 (default): the seesaw schedule (two tiles in flight, one per consumer warpgroup, see
// seesaw_loop); 0: the schedule before it (both warpgroups on one tile, S split by keys). Build
// the other with -DMLA_WG_SEESAW=0 to compare.
#ifndef MLA_WG_SEESAW
#define MLA_WG_SEESAW 1
#endif
// 1: the seesaw's two hand-overs (barriers A and B) wait in the arriving warpgroup too (bar.sync
// for bar.arrive): slower, for comparing compute-sanitizer's racecheck / synccheck reports, which
// may not model bar.arrive as the release the PTX memory model makes it. 0 (default): bar.arrive.
#ifndef MLA_WG_ARRIVE_SYNC
#define MLA_WG_ARRIVE_SYNC 0
#endif

#ifdef AP_KIT_HOPPER
namespace {

using namespace ap_sm90;

constexpr int kThreads = 384;               // producer warpgroup + two consumer warpgroups
constexpr int kBlockBytes = 64 * 128;       // one 64-column block of 64 rows
constexpr int kTileBytes = 9 * kBlockBytes; // Q or one latent tile: 72 KB
constexpr int kOffK = kTileBytes;
constexpr int kOffP = kOffK + 2 * kTileBytes;
constexpr int kOffRed = kOffP + kBlockBytes; // red_max [2][64], red_sum [2][64]
// The seesaw's hand-over values (Pair::xch, 256 floats) start at red_sum and run 512 bytes past
// it: xch's m_a / alpha_A share red_sum, which finish() writes once both warpgroups are past the
// last pair's reads of them; m_b / alpha_B, read after the last hand-over B, have their own bytes.
constexpr int kOffXch = kOffRed + 2 * 64 * 4;
constexpr int kOffBar = kOffXch + 4 * 64 * 4;
constexpr float kLog2e = 1.4426950408889634f;
// The most cache rows the TMA map may span: a box's row coordinate is a signed 32-bit value.
constexpr int64_t kMaxKvSlots = static_cast<int64_t>(1) << 31;

// full[stage][kb]: 64-column block kb of the stage's tile landed (both 32-row halves), so S can
// start on the first block while the others are in flight; empty_l[stage]: warpgroup 0's 4 warps
// are done with blocks 0..3 (V's columns 0..255, which only warpgroup 0's P V reads after S), and
// in stage 0 with its rope block too (S_A its only reader: P_A has its own buffer); empty[stage]:
// the 8 consumer warps released blocks 4..7 (V's columns 256..511), and in stage 1 its rope block,
// which holds P_B, read by both warpgroups' P V.
struct Bars {
    uint64_t full[2][9], empty_l[2], empty[2];
};
constexpr int kSmemBytes = kOffBar + static_cast<int>(sizeof(Bars)) + 1024; // + alignment slack
static_assert(kSmemBytes <= 232448, "over the H100's shared memory per block");

// Blocks kb0 .. kb1 - 1 of a stage's tile landed (phase `ph`), and block 8 (the rope block) with
// `rope`.
__device__ __forceinline__ void wait_blocks(uint64_t (&full)[9], uint32_t ph, int kb0, int kb1,
                                            bool rope) {
    for (int kb = kb0; kb < kb1; kb++) bar_wait(&full[kb], ph);
    if (rope) bar_wait(&full[8], ph);
}

// Byte offset of (row, 16-byte chunk) in a [64][576] tile of 64-column swizzled blocks.
__device__ __forceinline__ uint32_t sw_off(int row, int chunk) {
    return static_cast<uint32_t>((chunk >> 3) * kBlockBytes + row * 128 +
                                 (((chunk & 7) ^ (row & 7)) << 4));
}

// The producer's one thread: tiles t_begin..t_end into the ring, each 18 boxes (nine 64-column
// blocks x two 32-row halves), block kb completing on full[stage][kb]; a stage's first group
// (blocks 0..3, and 8 in stage 0) is reused once warpgroup 0 released it (empty_l: mid-pair for
// stage 0, while warpgroup 1 still multiplies by blocks 4..7), the rest once all 8 consumer warps
// released it (empty; see Bars). The loads carry an L2 evict-first policy (+0.5-2.6% on the
// H100, bench/results/2026-11-27-h100-h.md).
__device__ void produce(const CUtensorMap *map, const mla_decode_params &p, const Seq &sq,
                        uint8_t *k, Bars *b, int t_begin, int t_end) {
    const int npages = (sq.kv_len + p.page_size - 1) / p.page_size;
    const uint64_t policy = l2_evict_first(); // the tiles: read once per row block
    for (int tile = t_begin; tile < t_end; tile++) {
        const int i = tile - t_begin, st = i & 1;
        const uint32_t par = ((i >> 1) + 1) & 1;
        if (i >= 2) bar_wait(&b->empty_l[st], par);
        int slot[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            if (p.page_size == 64) {
                slot[half] = __ldg(sq.pages + tile) * 64 + half * 32;
            } else {
                int pi = 2 * tile + half;
                if (pi >= npages) pi = 2 * tile; // past the sequence: any loaded page, masked
                slot[half] = __ldg(sq.pages + pi) * 32;
            }
        }
        auto issue = [&](int kb) {
            bar_expect_tx(&b->full[st][kb], kBlockBytes);
#pragma unroll
            for (int half = 0; half < 2; half++)
                tma_load_hint(map, k + st * kTileBytes + kb * kBlockBytes + half * 4096,
                              &b->full[st][kb], kb * 64, 0, slot[half], policy);
        };
#pragma unroll
        for (int kb = 0; kb < 4; kb++) issue(kb);
        if (st == 0) issue(8); // stage 0's rope block: read by S_A only (P_A has its own buffer)
        if (i >= 2) bar_wait(&b->empty[st], par);
#pragma unroll
        for (int kb = 4; kb < 8; kb++) issue(kb);
        if (st == 1) issue(8); // stage 1's rope block holds P_B, which both P V read
    }
}

// Q rows row0.. of the sequence into shared memory (cp.async, in place from q_nope / q_rope;
// zero rows past the sequence's rows), by the 256 consumer threads.
__device__ __forceinline__ void load_q(const mla_decode_params &p, const Seq &sq, int row0,
                                       uint8_t *q, int ct) {
    const uint32_t base = smem_u32(q);
    const uint8_t *qn = static_cast<const uint8_t *>(p.q_nope);
    const uint8_t *qr = static_cast<const uint8_t *>(p.q_rope);
    const int rows = sq.q_len * p.num_heads;
    for (int i = ct; i < 64 * 72; i += 256) {
        const int r = i / 72, c = i % 72;
        const int gr = row0 + r;
        const bool valid = gr < rows;
        const int tok = valid ? gr / p.num_heads : 0, head = valid ? gr % p.num_heads : 0;
        const int64_t t = sq.q_begin + tok;
        const uint8_t *src =
            c < 64 ? qn + 2 * (t * p.q_stride_t + head * p.q_stride_h + c * 8)
                   : qr + 2 * (t * p.qr_stride_t + head * p.qr_stride_h + (c - 64) * 8);
        ap_cp_async_16(base + sw_off(r, c), src, valid);
    }
    ap_cp_async_commit();
    ap_cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// What one consumer thread is: warpgroup c, warp w of it, lane (g = lane / 4, t4 = lane % 4);
// its rows are w*16 + g and + 8.
struct Pos {
    int c, w, g, t4;
};

struct State {
    float o[128];
    float m_run[2], l_run[2];
};

// O[:, 256c..] += P V over the tile's 64 keys, issued as one commit group (not awaited).
__device__ __forceinline__ void pv_issue(float (&o)[128], const uint8_t *pm, const uint8_t *k,
                                         int c) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint64_t da = make_desc(pm + kk * 32, 16, 1024);
        const uint64_t db = make_desc(k + 4 * c * kBlockBytes + kk * 2048, kBlockBytes, 1024);
        wgmma_ss_n256t_bf16(o, da, db, 1);
    }
    wg_commit();
}

__device__ __forceinline__ void pv(float (&o)[128], const uint8_t *pm, const uint8_t *k, int c) {
    pv_issue(o, pm, k, c);
    wg_wait0();
}

// Keys past the sequence in its last tile (valid < 64 of them are real): zero warpgroup c's V
// columns (256c..) of those rows (the page may hold anything there, and 0 x NaN is NaN). tid: the
// thread's index in its warpgroup. The caller fences and syncs before a wgmma reads them.
__device__ __forceinline__ void zero_v_tail(uint8_t *k, int valid, int c, int tid) {
    for (int i = tid; i < (MLA_TILE - valid) * 32; i += 128) {
        const int row = valid + i / 32, blk = 4 * c + (i % 32) / 8, ch = i % 8;
        *reinterpret_cast<uint4 *>(k + blk * kBlockBytes + row * 128 + ch * 16) =
            make_uint4(0, 0, 0, 0);
    }
}

// Two adjacent keys' P of one row (bf16) into a 64 x 64 P block (128-byte swizzle).
__device__ __forceinline__ void store_p2(uint8_t *pm, int row, int key, float a, float b) {
    *reinterpret_cast<uint32_t *>(pm + row * 128 + (((key >> 3) ^ (row & 7)) << 4) +
                                  (key & 7) * 2) = ap_pack2<__nv_bfloat16>(a, b);
}

#if !MLA_WG_SEESAW
#include "decode_wgmma_serial.cuh"
#endif

#if MLA_WG_SEESAW
// ---- The seesaw schedule (MLA_WG_SEESAW 1, the default) ----
// Tiles come in pairs (A = t_begin + 2k in stage 0, B = A + 1 in stage 1, both stages' k-th use,
// so one mbarrier parity for the pair). Warpgroup 0 computes the whole S_A = Q K_A^T (wgmma
// m64n64, 36 k-steps), warpgroup 1 the whole S_B, each in its own registers; O is split by columns
// (warpgroup c holds O[:, 256c..256c+255]). One running row maximum m, handed over in a fixed
// order through shared memory (xch): m_prev -> WG0 (tile A) -> m_a -> WG1 (tile B) -> m_b -> WG0
// (next pair). Per pair, barriers named: A (WG0 arrives, WG1 syncs), B (WG1 arrives, WG0 syncs),
// W0 / W1 (one warpgroup's 128 threads):
//   WG0: S_A (block kb's 4 k-steps issued once full[0][kb] completed, so S starts while the
//        tile is still landing); P_A = 2^(S_A - m_a) (bf16) into its buffer (kOffP); m_a,
//        alpha_A = 2^(m_prev - m_a) into xch;
//        zero V_A's tail rows of columns 0..255; arrive A; sync W0; O_L *= alpha_A; O_L += P_A
//        V_A[L]; wait: release stage 0 (empty_l: the producer refills blocks 0..3 and 8 during
//        tile B; and empty); sync B (m_b, alpha_B = 2^(m_a - m_b) from xch); wait full[1][0..3, 8];
//        zero V_B's tail rows of columns 0..255, sync W0; O_L *= alpha_B; O_L += P_B V_B[L];
//        wait: release stage 1 (empty_l, empty).
//   WG1: S_B (as WG0's S_A, on full[1][*]; it runs while WG0 does its softmax); sync A (m_a,
//        alpha_A); wait full[0][4..7]; zero V_A's tail rows of columns 256..511, sync W1; O_R *=
//        alpha_A; issue O_R += P_A V_A[R]; while it runs: P_B = 2^(S_B - m_b) into K_B's rope
//        block, m_b and alpha_B into xch, zero V_B's tail rows of columns 256..511; arrive B;
//        wait: release stage 0; sync W1; O_R *= alpha_B; O_R += P_B V_B[R]; wait: release
//        stage 1.
// Every thread fences (fence.proxy.async) its P / xch / zero writes before the barrier that
// precedes their readers (the other warpgroup's loads, either warpgroup's wgmma). A warp skips
// an O rescale when none of its rows' maxima grew. Safety of reuse: xch[A] is rewritten by WG0 in
// pair k+1 only after it synced B of pair k, which WG1 arrives at after reading xch[A]; xch[B] is
// rewritten by WG1 only after sync A of pair k+1, which WG0 arrives at after reading xch[B] of
// pair k. A stage's blocks 0..3 (and stage 0's rope block) are refilled once warpgroup 0's 4
// warps released them (S and P V[L] are their only readers), the rest once all 8 consumer warps
// did (both P V of its tile completed; stage 1's rope block holds P_B). P_A's buffer is rewritten
// in pair k+1 after S_A of k+1, which waits for stage 0's blocks 4..7 of k+1, which the producer
// loads only after WG1's P_A V_A[R] of pair k completed. A pair without B (odd tile count): WG1
// skips S_B and P_B V_B, hands over m_b = m_a and alpha_B = 1; WG0 skips P_B V_B. Row sums: each
// warpgroup sums its own P (WG0 tile A, WG1 B), rescaled by every alpha; finish() adds the two.
// emu/seesaw_ring_sim.py models these barriers, release groups and buffers: keep it in step.
constexpr int kBarA = 2, kBarB = 3, kBarW = 4; // kBarW + c: warpgroup c's 128 threads

// Hand a pair's values over to the other warpgroup (it syncs on the same barrier).
__device__ __forceinline__ void hand_over(int bar) {
#if MLA_WG_ARRIVE_SYNC
    named_sync<256>(bar);
#else
    named_arrive<256>(bar);
#endif
}

// S = Q K^T over all 64 keys of the tile, by one warpgroup.
__device__ __forceinline__ void qk64(float (&s)[32], const uint8_t *q, const uint8_t *k,
                                     uint64_t (&full)[9], uint32_t ph) {
    wg_fence();
#pragma unroll
    for (int kb = 0; kb < 9; kb++) {
        bar_wait(&full[kb], ph); // block kb landed; the earlier blocks' wgmma run meanwhile
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const uint64_t da = make_desc(q + kb * kBlockBytes + kk * 32, 16, 1024);
            const uint64_t db = make_desc(k + kb * kBlockBytes + kk * 32, 16, 1024);
            wgmma_ss_n64_bf16(s, da, db, kb + kk > 0);
        }
    }
    wg_commit();
    wg_wait0();
}

// One whole tile's softmax step by one warpgroup: mask, row maxima over the 64 keys, the running
// maximum m (in: before the tile; out: with it), alpha = 2^(m_in - m_out), P (bf16) into pm (one
// 64 x 64 swizzled block), this thread's part of the row sums. The caller fences P.
__device__ __forceinline__ void tile_p(float (&s)[32], float (&m)[2], float (&alpha)[2],
                                       float (&rs)[2], const Pos &ps, const Seq &sq, int tile,
                                       const int (&limit)[2], float scale2, uint8_t *pm) {
    if (tile * MLA_TILE + MLA_TILE - 1 > sq.kv_len - sq.q_len) {
#pragma unroll
        for (int e = 0; e < 32; e++) {
            const int pos = tile * MLA_TILE + (e >> 2) * 8 + 2 * ps.t4 + (e & 1);
            if (pos > limit[(e >> 1) & 1]) s[e] = -INFINITY;
        }
    }
    float mx[2] = {-INFINITY, -INFINITY}, m_use[2];
#pragma unroll
    for (int e = 0; e < 32; e++) mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], s[e]);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m[h], mx[h] * scale2);
        m_use[h] = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = ex2(m[h] - m_use[h]);
        m[h] = m_new;
        rs[h] = 0.f;
    }
    const int r0 = ps.w * 16 + ps.g;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float a = ex2(s[4 * j + 2 * h] * scale2 - m_use[h]);
            const float b2 = ex2(s[4 * j + 2 * h + 1] * scale2 - m_use[h]);
            rs[h] += a + b2;
            store_p2(pm, r0 + 8 * h, j * 8 + 2 * ps.t4, a, b2);
        }
}

// O *= alpha per row; skipped by a warp none of whose rows' maximum grew (alpha exactly 1: ex2(0)).
__device__ __forceinline__ void scale_o(State &st, const float (&alpha)[2]) {
    if (__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) return;
#pragma unroll
    for (int i = 0; i < 128; i++) st.o[i] *= alpha[(i >> 1) & 1];
}

// What both warpgroups know of a pair.
struct Pair {
    int ta;      // tile A (B = ta + 1)
    uint32_t ph; // mbarrier parity of both stages
    bool has_b;  // tile B exists
    uint8_t *ka; // stage 0 (tile A); stage 1 follows
    float *xch;  // [0, 64): m_a, [64, 128): alpha_A, [128, 192): m_b, [192, 256): alpha_B
    uint8_t *pa; // P_A, one 64 x 64 swizzled block (P_B sits in stage 1's rope block)
};

// Warpgroup 0's share of a pair (see the protocol above).
__device__ __forceinline__ void pair_wg0(const Pair &pr, State &st, const Pos &ps, const Seq &sq,
                                         const uint8_t *q, Bars *b, const int (&limit)[2],
                                         float scale2) {
    uint8_t *ka = pr.ka, *kb = pr.ka + kTileBytes;
    const int r0 = ps.w * 16 + ps.g, tid = ps.w * 32 + ps.g * 4 + ps.t4;
    float s[32], alpha[2], rs[2];
    qk64(s, q, ka, b->full[0], pr.ph);
    tile_p(s, st.m_run, alpha, rs, ps, sq, pr.ta, limit, scale2, pr.pa);
    if (ps.t4 == 0)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            pr.xch[r0 + 8 * h] = st.m_run[h];
            pr.xch[64 + r0 + 8 * h] = alpha[h];
        }
    const int va = sq.kv_len - pr.ta * MLA_TILE;
    if (va < MLA_TILE) zero_v_tail(ka, va, 0, tid);
    fence_proxy_async(); // P, xch and zeroed rows: before the arrive and before any wgmma reads
    hand_over(kBarA);
    named_sync<128>(kBarW);
#pragma unroll
    for (int h = 0; h < 2; h++) st.l_run[h] = st.l_run[h] * alpha[h] + rs[h];
    scale_o(st, alpha);
    pv(st.o, pr.pa, ka, 0);
    release_stage(&b->empty_l[0]); // early: the producer refills stage 0 while tile B is worked
    release_stage(&b->empty[0]);
    named_sync<256>(kBarB);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        st.m_run[h] = pr.xch[128 + r0 + 8 * h];
        alpha[h] = pr.xch[192 + r0 + 8 * h];
    }
    if (!pr.has_b) return;
    wait_blocks(b->full[1], pr.ph, 0, 4, true); // V_B[L]'s TMA bytes visible to this warpgroup too
    const int vb = va - MLA_TILE;
    if (vb < MLA_TILE) {
        zero_v_tail(kb, vb, 0, tid);
        fence_proxy_async();
        named_sync<128>(kBarW);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) st.l_run[h] *= alpha[h];
    scale_o(st, alpha);
    pv(st.o, kb + 8 * kBlockBytes, kb, 0);
    release_stage(&b->empty_l[1]);
    release_stage(&b->empty[1]);
}

// Warpgroup 1's share of a pair (see the protocol above).
__device__ __forceinline__ void pair_wg1(const Pair &pr, State &st, const Pos &ps, const Seq &sq,
                                         const uint8_t *q, Bars *b, const int (&limit)[2],
                                         float scale2) {
    uint8_t *ka = pr.ka, *kb = pr.ka + kTileBytes;
    const int r0 = ps.w * 16 + ps.g, tid = ps.w * 32 + ps.g * 4 + ps.t4;
    float s[32], alpha[2], rs[2] = {0.f, 0.f}, alpha_b[2] = {1.f, 1.f};
    if (pr.has_b) {
        qk64(s, q, kb, b->full[1], pr.ph);
    }
    named_sync<256>(kBarA);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        st.m_run[h] = pr.xch[r0 + 8 * h];
        alpha[h] = pr.xch[64 + r0 + 8 * h];
    }
    // the TMA bytes of V_A[R] visible to this warpgroup too; not blocks 0..3 and 8, which the
    // producer may refill for the next pair once warpgroup 0 released them (a later phase)
    wait_blocks(b->full[0], pr.ph, 4, 8, false);
    const int va = sq.kv_len - pr.ta * MLA_TILE;
    if (va < MLA_TILE) {
        zero_v_tail(ka, va, 1, tid);
        fence_proxy_async();
        named_sync<128>(kBarW + 1);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) st.l_run[h] *= alpha[h];
    scale_o(st, alpha);
    pv_issue(st.o, pr.pa, ka, 1);
    if (pr.has_b) {
        tile_p(s, st.m_run, alpha_b, rs, ps, sq, pr.ta + 1, limit, scale2, kb + 8 * kBlockBytes);
        if (va - MLA_TILE < MLA_TILE) zero_v_tail(kb, va - MLA_TILE, 1, tid);
    }
    if (ps.t4 == 0)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            pr.xch[128 + r0 + 8 * h] = st.m_run[h];
            pr.xch[192 + r0 + 8 * h] = alpha_b[h];
        }
    fence_proxy_async(); // P, xch and zeroed rows: before the arrive and before any wgmma reads
    hand_over(kBarB);
    wg_wait0();
    release_stage(&b->empty[0]);
    if (!pr.has_b) return;
    named_sync<128>(kBarW + 1);
#pragma unroll
    for (int h = 0; h < 2; h++) st.l_run[h] = st.l_run[h] * alpha_b[h] + rs[h];
    scale_o(st, alpha_b);
    pv(st.o, kb + 8 * kBlockBytes, kb, 1);
    release_stage(&b->empty[1]);
}

// The consumers' main loop over the CTA's tiles, in pairs.
template <int C>
__device__ __forceinline__ void seesaw_loop(State &st, const Pos &ps, const Seq &sq, uint8_t *base,
                                            Bars *b, const int (&limit)[2], float scale2,
                                            int t_begin, int t_end) {
    for (int ta = t_begin; ta < t_end; ta += 2) {
        const Pair pr = {
            ta,           static_cast<uint32_t>(((ta - t_begin) >> 1) & 1), ta + 1 < t_end,
            base + kOffK, reinterpret_cast<float *>(base + kOffXch),        base + kOffP};
        if constexpr (C == 0)
            pair_wg0(pr, st, ps, sq, base, b, limit, scale2);
        else
            pair_wg1(pr, st, ps, sq, base, b, limit, scale2);
    }
}
#endif

// End: row sums of both warpgroups, then this warpgroup's 256 columns of the rows to out, or to
// the CTA's partial slot when the KV is split (as decode.cu's rows_finish).
__device__ void finish(const mla_decode_params &p, const Seq &sq, State &st, float *red_sum,
                       const Pos &ps, int row0, int rows, int cta) {
    const int r0 = ps.w * 16 + ps.g;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        st.l_run[h] += __shfl_xor_sync(0xffffffffu, st.l_run[h], 1);
        st.l_run[h] += __shfl_xor_sync(0xffffffffu, st.l_run[h], 2);
        if (ps.t4 == 0) red_sum[ps.c * 64 + r0 + 8 * h] = st.l_run[h];
    }
    // Both warpgroups reach this through their own consume<C>: the non-aligned barrier (no wgmma
    // follows). The hand-overs before wgmma (Q loaded, A, B) stay aligned: ptxas serializes the
    // wgmma after a non-aligned one (sm90.cuh), so synccheck reports those as divergent.
    named_sync_split<256>(1);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + 8 * h, gr = row0 + r;
        const float l = red_sum[r] + red_sum[64 + r];
        const float lse2 = l > 0.f ? st.m_run[h] + log2f(l) : -INFINITY;
        const float outs = (l > 0.f ? 1.f / l : 0.f) * p.kv_scale;
        if (gr >= rows) continue;
        if (p.num_splits == 1) {
            const int64_t orow = out_row(p, sq, gr);
            uint8_t *dst = static_cast<uint8_t *>(p.out) + orow * MLA_LATENT * 2;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const int d = ps.c * 256 + j * 8 + 2 * ps.t4;
                *reinterpret_cast<uint32_t *>(dst + d * 2) = ap_pack2<__nv_bfloat16>(
                    st.o[4 * j + 2 * h] * outs, st.o[4 * j + 2 * h + 1] * outs);
            }
            if (p.lse != NULL && ps.c == 0 && ps.t4 == 0) p.lse[orow] = lse2 * 0.69314718055994531f;
        } else {
            const int64_t prow = static_cast<int64_t>(cta) * 64 + r;
            float *dst = p.partial_out + prow * MLA_LATENT;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const int d = ps.c * 256 + j * 8 + 2 * ps.t4;
                *reinterpret_cast<float2 *>(dst + d) =
                    make_float2(st.o[4 * j + 2 * h] * outs, st.o[4 * j + 2 * h + 1] * outs);
            }
            if (ps.c == 0 && ps.t4 == 0) p.partial_lse[prow] = lse2;
        }
    }
}

// Consumer warpgroup C (one instantiation each, so no accumulator crosses a divergent branch:
// ptxas would serialize the wgmma, C7520).
template <int C>
__device__ void consume(const mla_decode_params &p, const Seq &sq, uint8_t *base, Bars *b, int row0,
                        int rows, int cta, int t_begin, int t_end) {
    const int ct = threadIdx.x - 128, lane = ct & 31;
    const Pos ps = {C, (ct >> 5) & 3, lane >> 2, lane & 3};
    uint8_t *q = base;
    float *red = reinterpret_cast<float *>(base + kOffRed);
    load_q(p, sq, row0, q, ct);
    named_sync<256>(1);
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int gr = row0 + ps.w * 16 + ps.g + 8 * h;
        limit[h] = sq.kv_len - sq.q_len + (gr < rows ? gr / p.num_heads : 0);
    }
    const float scale2 = p.sm_scale * p.kv_scale * kLog2e;
    State st;
#pragma unroll
    for (int i = 0; i < 128; i++) st.o[i] = 0.f;
    st.m_run[0] = st.m_run[1] = -INFINITY;
    st.l_run[0] = st.l_run[1] = 0.f;
#if MLA_WG_SEESAW
    seesaw_loop<C>(st, ps, sq, base, b, limit, scale2, t_begin, t_end);
#else
    serial_loop(st, ps, sq, base, b, limit, scale2, red, t_begin, t_end);
#endif
    ap_pdl_launch_dependents();
    finish(p, sq, st, red + 128, ps, row0, rows, cta);
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_wgmma_kernel(const __grid_constant__ CUtensorMap map,
                            const __grid_constant__ mla_decode_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                ~static_cast<uintptr_t>(1023));
    Bars *b = reinterpret_cast<Bars *>(base + kOffBar);
    const int split = blockIdx.x, rb_cta = blockIdx.y, seq = blockIdx.z;
    const Seq sq = seq_of(p, seq);
    const int row0 = rb_cta * 64, rows = sq.q_len * p.num_heads;
    const int cta = (seq * gridDim.y + rb_cta) * gridDim.x + split;
    if (row0 >= rows) return; // a row block past this sequence's rows: nothing to write
    const int tiles = (sq.kv_len + MLA_TILE - 1) / MLA_TILE;
    const int per = (tiles + p.num_splits - 1) / p.num_splits;
    const int t_begin = min(split * per, tiles), t_end = min(t_begin + per, tiles);
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; s++) {
            for (int kb = 0; kb < 9; kb++) bar_init(&b->full[s][kb], 1);
            bar_init(&b->empty_l[s], 4); // warpgroup 0's warps
            bar_init(&b->empty[s], 8);   // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        regs_dec<40>();
        if (threadIdx.x == 0) produce(&map, p, sq, base + kOffK, b, t_begin, t_end);
    } else {
        regs_inc<232>();
        if (threadIdx.x < 256)
            consume<0>(p, sq, base, b, row0, rows, cta, t_begin, t_end);
        else
            consume<1>(p, sq, base, b, row0, rows, cta, t_begin, t_end);
    }
#endif
}

// The latent cache as a 3-D map {576 columns, 1, slots}: boxes of 64 columns x 32 rows, 128-byte
// swizzle; slots = num_pages * page_size of the cache (every box the producer asks for lies in a
// page of the sequence).
int make_kv_map(CUtensorMap *map, const void *kv, int64_t slots) {
    EncodeTiledFn fn = encode_tiled_fn();
    if (fn == nullptr) return -1;
    const cuuint64_t dims[3] = {MLA_ROW, 1, static_cast<cuuint64_t>(slots)};
    const cuuint64_t strides[2] = {MLA_ROW * 2, MLA_ROW * 2};
    const cuuint32_t box[3] = {64, 1, 32};
    const cuuint32_t estride[3] = {1, 1, 1};
    const CUresult r =
        fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void *>(kv), dims, strides, box,
           estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -2;
}

int device_is_sm90() {
    static std::atomic<int> cached{-1};
    int v = cached.load();
    if (v >= 0) return v;
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    v = major == 9 && minor == 0;
    cached.store(v);
    return v;
}

} // namespace

extern "C" int mla_decode_wgmma_covers(const mla_decode_params *p) {
    return p->kv_dtype == AP_DTYPE_BF16 &&
           mla_decode_block_rows(p->num_heads, p->max_q_len) == 64 &&
           (p->page_size == 32 || p->page_size == 64) && p->kv_slots > 0 &&
           p->kv_slots <= kMaxKvSlots && (reinterpret_cast<uintptr_t>(p->kv_pages) & 15) == 0 &&
           encode_tiled_fn() != nullptr && device_is_sm90();
}

extern "C" ap_status mla_decode_wgmma_run(const mla_decode_params *p, void *stream_ptr,
                                          ap_msgbuf *msg) {
    if (p->num_seqs == 0) return AP_OK;
    static std::atomic<uint64_t> ready{0};
    ap_status st =
        ap_cuda_smem_optin_once(mla_decode_wgmma_kernel, kSmemBytes, ready, MLA_WG_WHO, msg);
    if (st != AP_OK) return st;
    CUtensorMap map;
    if (p->kv_slots <= 0 || p->kv_slots > kMaxKvSlots) {
        ap_msgbuf_add(msg, "%s: the latent cache has %lld rows (1 .. 2^31 needed)", MLA_WG_WHO,
                      static_cast<long long>(p->kv_slots));
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (make_kv_map(&map, p->kv_pages, p->kv_slots) != 0) {
        ap_msgbuf_add(msg, "%s: cuTensorMapEncodeTiled failed for the latent cache", MLA_WG_WHO);
        return AP_ERR_CUDA;
    }
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    const int row_blocks = (p->max_q_len * p->num_heads + 63) / 64;
    dim3 grid(p->num_splits, row_blocks, p->num_seqs);
    mla_decode_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(map, *p);
    st = ap_cuda_launch_status(MLA_WG_WHO, "mla_decode_wgmma_kernel", msg);
    if (st != AP_OK || p->num_splits == 1) return st;
    return mla_combine_run(p, 64, stream, msg);
}

#else // no sm_90a code in this build: decode.cu serves every case

extern "C" int mla_decode_wgmma_covers(const mla_decode_params *p) {
    (void)p;
    return 0;
}

extern "C" ap_status mla_decode_wgmma_run(const mla_decode_params *p, void *stream_ptr,
                                          ap_msgbuf *msg) {
    (void)p;
    (void)stream_ptr;
    ap_msgbuf_add(msg, "%s: not built (no sm_90a code)", MLA_WG_WHO);
    return AP_ERR_UNSUPPORTED;
}

#endif
