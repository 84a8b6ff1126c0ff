// decode_flat.cuh: the flat schedule of the MLA decode (decode.cu) and its combine (combine.cu).
// The batch's KV tiles are laid end to end, sequence after sequence (a sequence without query rows
// has none), and CTA c of G takes tiles [c W, (c + 1) W), W = ceil(total / G): every CTA the same
// share however the lengths are mixed (one long sequence among short ones is spread over many
// SMs instead of holding one). A CTA's share is one or more pieces of sequences; a sequence cut
// between CTAs c0 < .. < c1 leaves partial states: CTA c's piece in slot 2c when the piece is the
// CTA's first, 2c + 1 when it is its last and not its first. Where cutting would not pay, the
// CTAs take whole sequences instead (flat_share's `whole`). The schedule is computed on the
// device from qo_indptr and seq_lens by every CTA of the decode and of the combine alike (no
// workspace, nothing to reset: graph-capturable).
#ifndef AP_TRTLLM_MLA_DECODE_FLAT_CUH
#define AP_TRTLLM_MLA_DECODE_FLAT_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "mla.h"

namespace {

constexpr int kFlatPerLane = 8; // sequences a lane reads at once: 256 per warp pass

// KV tiles of sequence `seq` in the flat order: its 64-token tiles, or 0 without query rows.
__device__ __forceinline__ int flat_seq_tiles(const mla_decode_params &p, int seq) {
    const int q = __ldg(p.qo_indptr + seq + 1) - __ldg(p.qo_indptr + seq);
    const int kv = __ldg(p.seq_lens + seq);
    return q > 0 && kv > 0 ? (kv + MLA_TILE - 1) / MLA_TILE : 0;
}

// The tiles of sequences base + lane * kFlatPerLane .. + kFlatPerLane - 1 (0 past num_seqs),
// all loads issued before any is used.
__device__ __forceinline__ void flat_lane_tiles(const mla_decode_params &p, int base, int lane,
                                                int (&t)[kFlatPerLane]) {
#pragma unroll
    for (int i = 0; i < kFlatPerLane; i++) {
        const int seq = base + lane * kFlatPerLane + i;
        t[i] = seq < p.num_seqs ? flat_seq_tiles(p, seq) : 0;
    }
}

__device__ __forceinline__ int flat_warp_sum(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Inclusive prefix sum over the warp's lanes.
__device__ __forceinline__ int flat_warp_scan(int v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

// One CTA's share. Cut (whole == 0): tiles [begin, end) of the flat order, `seq` holding tile
// begin (-1 when the share is empty), `seq_start` that sequence's first tile, per = W. Whole:
// sequences cta, cta + ctas, ... each whole, no partial state (below).
struct FlatShare {
    int begin, end, seq, seq_start, per, whole;
};

// The lane's tiles of the pass over sequences base..: the first 256 kept from the first load.
__device__ __forceinline__ void flat_chunk_tiles(const mla_decode_params &p, int base, int lane,
                                                 const int (&first)[kFlatPerLane],
                                                 int (&t)[kFlatPerLane]) {
    if (base == 0) {
#pragma unroll
        for (int i = 0; i < kFlatPerLane; i++) t[i] = first[i];
    } else {
        flat_lane_tiles(p, base, lane, t);
    }
}

// CTA `cta` of `ctas`: one warp's work (every lane returns the same share). The total and the
// longest sequence's tiles first, then (cut) the sequence holding tile `begin`: one pass over the
// lengths up to 256 sequences, two past that (the second one's loads hit L1).
// Whole sequences per CTA when cutting would not pay: when the longest sequence times the waves
// of whole sequences (ceil(num_seqs / ctas)) is within W + W / 8 + 4 tiles. A cut costs each CTA
// a second pipeline fill and the batch a combine; a batch of equal lengths (B128 L4096 H16 on 132
// SMs: 64 tiles against W = 63) runs faster whole (H100, 2026-11-27, call 14: 0.2196 ms whole
// against 0.2414 cut), a skewed one (one 32768 among 63 of 1024) cut (0.0720 against the split
// grid's 0.5846, call 15).
__device__ __forceinline__ FlatShare flat_share(const mla_decode_params &p, int cta, int ctas,
                                                int lane) {
    int first[kFlatPerLane]; // the first 256 sequences' tiles, kept for the search
    flat_lane_tiles(p, 0, lane, first);
    int total = 0, longest = 0;
    for (int base = 0; base < p.num_seqs; base += 32 * kFlatPerLane) {
        int t[kFlatPerLane];
        flat_chunk_tiles(p, base, lane, first, t);
        int s = 0;
#pragma unroll
        for (int i = 0; i < kFlatPerLane; i++) {
            s += t[i];
            longest = max(longest, t[i]);
        }
        total += flat_warp_sum(s);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        longest = max(longest, __shfl_xor_sync(0xffffffffu, longest, o));
    FlatShare f;
    f.per = (total + ctas - 1) / ctas;
    f.begin = min(cta * f.per, total);
    f.end = min(f.begin + f.per, total);
    f.seq = -1;
    f.seq_start = f.begin;
    const int waves = (p.num_seqs + ctas - 1) / ctas;
    f.whole = p.flat == 1 && static_cast<int64_t>(longest) * waves <= f.per + f.per / 8 + 4;
    if (f.whole || f.begin >= f.end) return f;
    int carry = 0;
    for (int base = 0; base < p.num_seqs; base += 32 * kFlatPerLane) {
        int t[kFlatPerLane];
        flat_chunk_tiles(p, base, lane, first, t);
        int s = 0;
#pragma unroll
        for (int i = 0; i < kFlatPerLane; i++) s += t[i];
        const int incl = flat_warp_scan(s, lane);
        const int start = carry + incl - s; // this lane's first tile
        const bool mine = f.begin >= start && f.begin < start + s;
        const unsigned hit = __ballot_sync(0xffffffffu, mine);
        if (hit != 0) {
            int seq = 0, seq_start = 0;
            if (mine) {
                int at = start;
#pragma unroll
                for (int i = 0; i < kFlatPerLane; i++) {
                    if (f.begin >= at && f.begin < at + t[i]) {
                        seq = base + lane * kFlatPerLane + i;
                        seq_start = at;
                    }
                    at += t[i];
                }
            }
            const int src = __ffs(hit) - 1;
            f.seq = __shfl_sync(0xffffffffu, seq, src);
            f.seq_start = __shfl_sync(0xffffffffu, seq_start, src);
            return f;
        }
        carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    return f; // not reached for a consistent batch: begin < total
}

// The CTA's share through shared memory (`at`: 6 ints): warp 0 computes it, every thread gets it.
// Ends with a barrier.
__device__ __forceinline__ FlatShare flat_share_cta(const mla_decode_params &p, int cta, int ctas,
                                                    int *at) {
    if (threadIdx.x < 32) {
        const FlatShare f = flat_share(p, cta, ctas, static_cast<int>(threadIdx.x));
        if (threadIdx.x == 0) {
            at[0] = f.begin, at[1] = f.end, at[2] = f.seq;
            at[3] = f.seq_start, at[4] = f.per, at[5] = f.whole;
        }
    }
    __syncthreads();
    return FlatShare{at[0], at[1], at[2], at[3], at[4], at[5]};
}

} // namespace

#endif // AP_TRTLLM_MLA_DECODE_FLAT_CUH
