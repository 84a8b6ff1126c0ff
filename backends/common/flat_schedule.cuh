// flat_schedule.cuh: the flat decode schedule's search, for every backend that spreads a batch's
// KV tiles evenly over a fixed grid (trtllm_mla's decode_flat.cuh, trtllm_mha's decode.cu).
// The batch's tiles are laid end to end, sequence after sequence (a backend says how many tiles a
// sequence has: 0 without query rows), and CTA c of G takes tiles [c W, (c + 1) W),
// W = ceil(total / G): every CTA the same share however the lengths are mixed. One warp finds a
// share from the device arrays alone (no workspace, nothing to reset: graph-capturable): the
// total and the longest sequence's tiles in one pass over the lengths, then the sequence holding
// tile c W (or any tile) by a warp scan (one pass up to 256 sequences, two past that: the second
// one's loads hit L1).
#ifndef AP_COMMON_FLAT_SCHEDULE_CUH
#define AP_COMMON_FLAT_SCHEDULE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kApFlatPerLane = 8; // sequences a lane reads at once: 256 per warp pass

__device__ __forceinline__ int ap_flat_warp_sum(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Inclusive prefix sum over the warp's lanes.
__device__ __forceinline__ int ap_flat_warp_scan(int v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

// The tiles of sequences base + lane * kApFlatPerLane .. + kApFlatPerLane - 1 (0 past num_seqs),
// all loads issued before any is used. TilesOf: int operator()(int seq) const.
template <class TilesOf>
__device__ __forceinline__ void ap_flat_lane_tiles(const TilesOf &tiles_of, int num_seqs, int base,
                                                   int lane, int (&t)[kApFlatPerLane]) {
#pragma unroll
    for (int i = 0; i < kApFlatPerLane; i++) {
        const int seq = base + lane * kApFlatPerLane + i;
        t[i] = seq < num_seqs ? tiles_of(seq) : 0;
    }
}

// The lane's tiles of the pass over sequences base..: the first 256 kept from the first load.
template <class TilesOf>
__device__ __forceinline__ void ap_flat_chunk_tiles(const TilesOf &tiles_of, int num_seqs, int base,
                                                    int lane, const int (&first)[kApFlatPerLane],
                                                    int (&t)[kApFlatPerLane]) {
    if (base == 0) {
#pragma unroll
        for (int i = 0; i < kApFlatPerLane; i++) t[i] = first[i];
    } else {
        ap_flat_lane_tiles(tiles_of, num_seqs, base, lane, t);
    }
}

// The batch's tiles as one warp sees them (every lane holds the same total and longest): the
// pass over the lengths is made on construction; find() then locates any tile. TilesOf: int
// operator()(int seq) const.
template <class TilesOf> struct ApFlatScan {
    const TilesOf &tiles_of;
    int num_seqs, lane;
    int first[kApFlatPerLane]; // the first 256 sequences' tiles, kept for find()
    int total, longest;

    __device__ __forceinline__ ApFlatScan(const TilesOf &t, int n, int l)
        : tiles_of(t), num_seqs(n), lane(l), total(0), longest(0) {
        ap_flat_lane_tiles(tiles_of, num_seqs, 0, lane, first);
        for (int base = 0; base < num_seqs; base += 32 * kApFlatPerLane) {
            int t[kApFlatPerLane];
            ap_flat_chunk_tiles(tiles_of, num_seqs, base, lane, first, t);
            int s = 0;
#pragma unroll
            for (int i = 0; i < kApFlatPerLane; i++) {
                s += t[i];
                longest = max(longest, t[i]);
            }
            total += ap_flat_warp_sum(s);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            longest = max(longest, __shfl_xor_sync(0xffffffffu, longest, o));
    }

    // The sequence holding tile `pos` (< total) and that sequence's first tile; false (nothing
    // set) for pos past the batch's tiles.
    __device__ __forceinline__ bool find(int pos, int &seq, int &seq_start) const {
        int carry = 0;
        for (int base = 0; base < num_seqs; base += 32 * kApFlatPerLane) {
            int t[kApFlatPerLane];
            ap_flat_chunk_tiles(tiles_of, num_seqs, base, lane, first, t);
            int s = 0;
#pragma unroll
            for (int i = 0; i < kApFlatPerLane; i++) s += t[i];
            const int incl = ap_flat_warp_scan(s, lane);
            const int start = carry + incl - s; // this lane's first tile
            const bool mine = pos >= start && pos < start + s;
            const unsigned hit = __ballot_sync(0xffffffffu, mine);
            if (hit != 0) {
                int sq = 0, sq_start = 0;
                if (mine) {
                    int at = start;
#pragma unroll
                    for (int i = 0; i < kApFlatPerLane; i++) {
                        if (pos >= at && pos < at + t[i]) {
                            sq = base + lane * kApFlatPerLane + i;
                            sq_start = at;
                        }
                        at += t[i];
                    }
                }
                const int src = __ffs(hit) - 1;
                seq = __shfl_sync(0xffffffffu, sq, src);
                seq_start = __shfl_sync(0xffffffffu, sq_start, src);
                return true;
            }
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
        return false;
    }
};

} // namespace

#endif // AP_COMMON_FLAT_SCHEDULE_CUH
