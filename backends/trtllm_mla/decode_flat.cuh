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

#include "../common/flat_schedule.cuh"
#include "mla.h"

namespace {

// KV tiles of sequence `seq` in the flat order: its 64-token tiles, or 0 without query rows.
__device__ __forceinline__ int flat_seq_tiles(const mla_decode_params &p, int seq) {
    const int q = __ldg(p.qo_indptr + seq + 1) - __ldg(p.qo_indptr + seq);
    const int kv = __ldg(p.seq_lens + seq);
    return q > 0 && kv > 0 ? (kv + MLA_TILE - 1) / MLA_TILE : 0;
}

struct FlatTiles {
    const mla_decode_params &p;
    __device__ __forceinline__ int operator()(int seq) const {
        return flat_seq_tiles(p, seq);
    }
};

// One CTA's share. Cut (whole == 0): tiles [begin, end) of the flat order, `seq` holding tile
// begin (-1 when the share is empty), `seq_start` that sequence's first tile, per = W. Whole:
// sequences cta, cta + ctas, ... each whole, no partial state (below).
struct FlatShare {
    int begin, end, seq, seq_start, per, whole;
};

// CTA `cta` of `ctas`: one warp's work (every lane returns the same share), the kit's scan
// (flat_schedule.cuh) over the sequences' 64-token tiles.
// Whole sequences per CTA when cutting would not pay: when the longest sequence times the waves
// of whole sequences (ceil(num_seqs / ctas)) is within W + W / 8 + 4 tiles. A cut costs each CTA
// a second pipeline fill and the batch a combine; a batch of equal lengths (B128 L4096 H16 on 132
// SMs: 64 tiles against W = 63) runs faster whole (H100, 2026-11-27, call 14: 0.2196 ms whole
// against 0.2414 cut), a skewed one (one 32768 among 63 of 1024) cut (0.0720 against the split
// grid's 0.5846, call 15).
__device__ __forceinline__ FlatShare flat_share(const mla_decode_params &p, int cta, int ctas,
                                                int lane) {
    const FlatTiles tiles{p};
    const ApFlatScan<FlatTiles> scan(tiles, p.num_seqs, lane);
    FlatShare f;
    f.per = (scan.total + ctas - 1) / ctas;
    f.begin = min(cta * f.per, scan.total);
    f.end = min(f.begin + f.per, scan.total);
    f.seq = -1;
    f.seq_start = f.begin;
    const int waves = (p.num_seqs + ctas - 1) / ctas;
    f.whole = p.flat == 1 && static_cast<int64_t>(scan.longest) * waves <= f.per + f.per / 8 + 4;
    if (f.whole || f.begin >= f.end) return f;
    scan.find(f.begin, f.seq, f.seq_start);
    return f; // seq stays -1 only for an inconsistent batch (begin < total)
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
