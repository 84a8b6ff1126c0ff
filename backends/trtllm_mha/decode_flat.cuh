// decode_flat.cuh: the flat schedule of trtllm_mha's decode (decode.cu) and its combine
// (combine.cu), on the kit's search (../common/flat_schedule.cuh).
// A unit is one (sequence, KV head, row block); each unit of a sequence has that sequence's
// stages (ceil(seq_len / stage keys)). The batch's stages are laid end to end, sequence after
// sequence, unit after unit within it (KV head major, then row block), and persistent CTA c of G
// (G = one wave: CTAs per SM x SMs) takes stages [c W, (c + 1) W), W = ceil(total / G). A CTA
// streams its share through one ring: the loads of the next unit's stages are in flight while it
// finishes the current one, so there is one pipeline fill per CTA, not one per unit, and no
// wave tail. A unit cut between CTAs c0 < .. < c1 leaves partial states (slot 2c when the piece
// is CTA c's first, 2c + 1 when it is its last and not its first) that the combine merges; a
// unit whole in one CTA is written out directly. Everything is found on the device from
// qo_indptr and seq_lens (graph-capturable; no workspace to reset).
#ifndef AP_TRTLLM_MHA_DECODE_FLAT_CUH
#define AP_TRTLLM_MHA_DECODE_FLAT_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "../common/flat_schedule.cuh"

namespace {

// Row blocks of a sequence with q_len new tokens.
__device__ __forceinline__ int mha_flat_blocks(int q_len, int group, int block_rows) {
    return (q_len * group + block_rows - 1) / block_rows;
}

// Stages of each of a sequence's units.
__device__ __forceinline__ int mha_flat_stages(int seq_len, int stage_keys) {
    return (seq_len + stage_keys - 1) / stage_keys;
}

// The stages of sequence `seq` in the flat order (the kit's TilesOf): 0 without query rows or
// keys.
struct mha_flat_tiles {
    const int32_t *qo_indptr, *seq_lens;
    int num_kv_heads, group, block_rows, stage_keys;
    __device__ __forceinline__ int operator()(int seq) const {
        const int q = __ldg(qo_indptr + seq + 1) - __ldg(qo_indptr + seq);
        const int kv = __ldg(seq_lens + seq);
        return q > 0 && kv > 0 ? num_kv_heads * mha_flat_blocks(q, group, block_rows) *
                                     mha_flat_stages(kv, stage_keys)
                               : 0;
    }
};

} // namespace

#endif // AP_TRTLLM_MHA_DECODE_FLAT_CUH
