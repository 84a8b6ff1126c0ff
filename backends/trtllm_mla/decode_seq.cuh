// decode_seq.cuh: what both MLA decode kernels (decode.cu, decode_wgmma.cu) read of one
// sequence: its query rows, length and page list (seq_of), and which row of out / lse its query
// row gr writes (out_row). (Their Q loads still compute the q_nope / q_rope addresses each: a
// shared helper for those moved registers in both kernels' SASS, so it waits for a GPU run.)
#ifndef AP_TRTLLM_MLA_DECODE_SEQ_CUH
#define AP_TRTLLM_MLA_DECODE_SEQ_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "mla.h"

namespace {

struct Seq {
    int32_t q_begin, q_len, kv_len;
    const int32_t *pages;
};

// Sequence `seq`'s query rows, length and page list.
__device__ __forceinline__ Seq seq_of(const mla_decode_params &p, int seq) {
    Seq sq;
    sq.q_begin = __ldg(p.qo_indptr + seq);
    sq.q_len = __ldg(p.qo_indptr + seq + 1) - sq.q_begin;
    sq.kv_len = __ldg(p.seq_lens + seq);
    sq.pages = p.kv_page_indices + __ldg(p.kv_page_indptr + seq);
    return sq;
}

// The row of out (and lse) that query row gr of the sequence writes.
__device__ __forceinline__ int64_t out_row(const mla_decode_params &p, const Seq &sq, int gr) {
    const int tok = gr / p.num_heads, head = gr % p.num_heads;
    return static_cast<int64_t>(sq.q_begin + tok) * p.num_heads + head;
}

} // namespace

#endif // AP_TRTLLM_MLA_DECODE_SEQ_CUH
