// combine.cu: the split-KV combine of trtllm_mha's decode, and the new tokens' cache slots.
#include <cuda_runtime.h>
#include <math.h>

#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/paged_kv.cuh"
#include "../common/pdl.cuh"
#include "../common/softmax_state.cuh"
#include "decode_flat.cuh"
#include "mha.h"

namespace {

constexpr int kThreads = 128;

constexpr int kDims = 32; // head dims per combine CTA
static_assert(MHA_MAX_SPLITS <= 64, "a warp reads a row's split LSEs in two loads per lane");

// One CTA per (32 head dims, sequence, KV head, row block) of the decode grid. Per row, one warp
// reads the splits' LSEs once (lanes over splits) and leaves the normalised weights in shared
// memory:  M = max_s lse2_s, w_s = 2^(lse2_s - M) / sum_s 2^(lse2_s - M),
// lse = ln2 (M + log2 sum_s 2^(lse2_s - M))                              (softmax_state.cuh);
// then every thread sums o = sum_s w_s o_s for its (row, dim), coalesced over the dims.
// Split 0 always holds key 0, which every row sees, so the sum is never 0. Partial slot of split
// s: ((seq * gridDim.y + blockIdx.y) * splits + s) * MHA_BLOCK_ROWS + local row.
template <typename QT>
__global__ void __launch_bounds__(kThreads) mha_combine_kernel(const mha_combine_params p) {
    __shared__ float weight[MHA_BLOCK_ROWS][MHA_MAX_SPLITS];
    // The batch's arrays are inputs of the decode grid, not its outputs: read before the wait.
    const int seq = blockIdx.z, kv_head = blockIdx.y / p.row_blocks,
              block = blockIdx.y % p.row_blocks;
    const int q_start = __ldg(p.qo_indptr + seq);
    const int rows_all = (__ldg(p.qo_indptr + seq + 1) - q_start) * p.group;
    const int rows = min(p.block_rows, rows_all - block * p.block_rows);
    if (rows <= 0) return; // uniform over the CTA
    ap_pdl_wait();         // launched while the decode grid drains: its partial states next
    const int64_t first = ((int64_t)seq * gridDim.y + blockIdx.y) * p.num_splits;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int local = warp; local < rows; local += kThreads / 32) {
        float x[2], m = -INFINITY;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int s = lane + 32 * h;
            x[h] =
                s < p.num_splits ? p.partial_lse[(first + s) * MHA_BLOCK_ROWS + local] : -INFINITY;
            m = fmaxf(m, x[h]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float w[2], sum = 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            w[h] = lane + 32 * h < p.num_splits ? ap_softmax_merge_weight(x[h], m) : 0.f;
            sum += w[h];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (lane + 32 * h < p.num_splits) weight[local][lane + 32 * h] = w[h] / sum;
        if (lane == 0 && blockIdx.x == 0 && p.lse != NULL) {
            const int r = block * p.block_rows + local;
            p.lse[(int64_t)(q_start + r / p.group) * p.num_qo_heads + kv_head * p.group +
                  r % p.group] = ap_lse2_to_ln(m + log2f(sum));
        }
    }
    __syncthreads();
    const int64_t split_stride = (int64_t)MHA_BLOCK_ROWS * p.head_dim;
    for (int i = threadIdx.x; i < rows * kDims; i += kThreads) {
        const int local = i / kDims, d = blockIdx.x * kDims + i % kDims;
        const float *po = p.partial_out + (first * MHA_BLOCK_ROWS + local) * p.head_dim + d;
        float acc = 0.f;
#pragma unroll 8
        for (int s = 0; s < p.num_splits; s++) acc += weight[local][s] * po[s * split_stride];
        const int r = block * p.block_rows + local;
        const int64_t row =
            (int64_t)(q_start + r / p.group) * p.num_qo_heads + kv_head * p.group + r % p.group;
        static_cast<QT *>(p.out)[row * p.head_dim + d] = ap_from_float<QT>(acc);
    }
}

// The flat schedule's combine (decode_flat.cuh): CTA (x, b - 1) serves head dims 32 x .. of the
// boundary b (1..G - 1) between decode CTAs b - 1 and b. Warp 0 finds the unit holding stage b W
// as the decode's CTAs found their shares; the CTA merges it when it is cut there and starts in
// CTA b - 1's share (the unit's first cut: every cut unit is merged once). Its pieces: CTA
// c0 = b - 1 in slot 2 c0 (the unit is c0's first piece) or 2 c0 + 1 (its last), CTAs b .. c1 in
// slot 2 c (each one's first piece). Per row, one warp reads the pieces' LSEs (lanes over pieces):
// M = max lse2, W = sum_s 2^(lse2_s - M); then per (row, dim) o = sum_s 2^(lse2_s - M) o_s / W
// (softmax_state.cuh), lse = ln2 (M + log2 W). The piece holding key 0 sees every row, so M is
// finite; a piece past a row's causal limit has lse2 = -inf: weight 0.
template <typename QT>
__global__ void __launch_bounds__(kThreads) mha_flat_combine_kernel(const mha_combine_params p) {
    __shared__ int at[5];
    __shared__ float2 mw[MHA_BLOCK_ROWS]; // per row: M and 1 / W
    const int b = (int)blockIdx.y + 1, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 0) {
        const mha_flat_tiles tiles = {p.qo_indptr, p.seq_lens,   p.num_kv_heads,
                                      p.group,     p.block_rows, p.stage_keys};
        const ApFlatScan<mha_flat_tiles> scan(tiles, p.num_seqs, lane);
        const int per = (scan.total + p.flat_ctas - 1) / p.flat_ctas;
        const int pos = b * per;
        int seq = -1, seq_start = 0, unit_start = 0, stages = 0, unit = 0;
        if (pos < scan.total && scan.find(pos, seq, seq_start)) {
            stages = mha_flat_stages(__ldg(p.seq_lens + seq), p.stage_keys);
            unit = (pos - seq_start) / stages;
            unit_start = seq_start + unit * stages;
        }
        if (lane == 0) {
            // merged here: cut at pos, first cut at b
            const bool mine = seq >= 0 && unit_start < pos && unit_start >= pos - per;
            at[0] = mine ? seq : -1;
            at[1] = unit;
            at[2] = unit_start / per;                  // c0
            at[3] = (unit_start + stages - 1) / per;   // c1
            at[4] = unit_start == at[2] * per ? 0 : 1; // c0's slot: 2 c0 + at[4]
        }
    }
    __syncthreads();
    const int seq = at[0];
    if (seq < 0) return; // uniform over the CTA
    const int q_start = __ldg(p.qo_indptr + seq);
    const int q_len = __ldg(p.qo_indptr + seq + 1) - q_start;
    const int blocks = mha_flat_blocks(q_len, p.group, p.block_rows);
    const int kv_head = at[1] / blocks, block = at[1] - kv_head * blocks;
    const int c0 = at[2], pieces = at[3] - at[2] + 1;
    const int64_t slot0 = 2 * (int64_t)c0 + at[4];
    const int rows = min(p.block_rows, q_len * p.group - block * p.block_rows);
    ap_pdl_wait(); // the partial states are the decode grid's
    for (int local = warp; local < rows; local += kThreads / 32) {
        float m = -INFINITY;
        for (int k = lane; k < pieces; k += 32) {
            const int64_t slot = k == 0 ? slot0 : 2 * (int64_t)(c0 + k);
            m = fmaxf(m, p.partial_lse[slot * MHA_BLOCK_ROWS + local]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float sum = 0.f;
        for (int k = lane; k < pieces; k += 32) {
            const int64_t slot = k == 0 ? slot0 : 2 * (int64_t)(c0 + k);
            sum += ap_softmax_merge_weight(p.partial_lse[slot * MHA_BLOCK_ROWS + local], m);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) mw[local] = make_float2(m, 1.f / sum);
        if (lane == 0 && blockIdx.x == 0 && p.lse != NULL) {
            const int r = block * p.block_rows + local;
            p.lse[(int64_t)(q_start + r / p.group) * p.num_qo_heads + kv_head * p.group +
                  r % p.group] = ap_lse2_to_ln(m + log2f(sum));
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * kDims; i += kThreads) {
        const int local = i / kDims, d = blockIdx.x * kDims + i % kDims;
        const float2 row_mw = mw[local];
        float acc = 0.f;
#pragma unroll 4
        for (int k = 0; k < pieces; k++) {
            const int64_t slot = k == 0 ? slot0 : 2 * (int64_t)(c0 + k);
            const float wk =
                ap_softmax_merge_weight(p.partial_lse[slot * MHA_BLOCK_ROWS + local], row_mw.x);
            acc += wk * p.partial_out[(slot * MHA_BLOCK_ROWS + local) * p.head_dim + d];
        }
        const int r = block * p.block_rows + local;
        const int64_t row =
            (int64_t)(q_start + r / p.group) * p.num_qo_heads + kv_head * p.group + r % p.group;
        static_cast<QT *>(p.out)[row * p.head_dim + d] = ap_from_float<QT>(acc * row_mw.y);
    }
}

// The slots of a batch's new tokens, one thread per token: sequence by a binary search of
// qo_indptr, position seq_len - q_len + i, slot through the page table.
__global__ void mha_slots_kernel(const mha_slots_params p, int log2_page_size) {
    const int token = blockIdx.x * blockDim.x + threadIdx.x;
    if (token >= p.num_tokens) return;
    int lo = 0, hi = p.num_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (__ldg(p.qo_indptr + mid) <= token)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int q_start = __ldg(p.qo_indptr + lo), q_len = __ldg(p.qo_indptr + lo + 1) - q_start;
    const int pos = __ldg(p.seq_lens + lo) - q_len + (token - q_start);
    const int32_t *pages = p.kv_page_indices + __ldg(p.kv_page_indptr + lo);
    p.slots[token] = (int32_t)ap_paged_slot(pages, pos, log2_page_size);
}

} // namespace

extern "C" ap_status mha_combine_run(const mha_combine_params *p, void *stream, ap_msgbuf *msg) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (p->flat_ctas > 0) {
        if (p->flat_ctas == 1) return AP_OK; // one CTA cuts nothing
        const dim3 fgrid(p->head_dim / kDims, p->flat_ctas - 1);
        const cudaError_t err =
            p->q_dtype == AP_DTYPE_BF16
                ? ap_launch(mha_flat_combine_kernel<__nv_bfloat16>, fgrid, dim3(kThreads), 0, s,
                            true, *p)
                : ap_launch(mha_flat_combine_kernel<__half>, fgrid, dim3(kThreads), 0, s, true, *p);
        ap_status st = ap_cuda_status(err, MHA_NAME ": decode", "mha_flat_combine_kernel", msg);
        if (st != AP_OK) return st;
        return ap_cuda_launch_status(MHA_NAME ": decode", "mha_flat_combine_kernel", msg);
    }
    const dim3 grid(p->head_dim / kDims, p->num_kv_heads * p->row_blocks, p->num_seqs);
    // programmatic dependent launch: the combine's launch overlaps the decode grid's tail
    const cudaError_t err =
        p->q_dtype == AP_DTYPE_BF16
            ? ap_launch(mha_combine_kernel<__nv_bfloat16>, grid, dim3(kThreads), 0, s, true, *p)
            : ap_launch(mha_combine_kernel<__half>, grid, dim3(kThreads), 0, s, true, *p);
    ap_status st = ap_cuda_status(err, MHA_NAME ": decode", "mha_combine_kernel", msg);
    if (st != AP_OK) return st;
    return ap_cuda_launch_status(MHA_NAME ": decode", "mha_combine_kernel", msg);
}

extern "C" ap_status mha_slots_run(const mha_slots_params *p, void *stream, ap_msgbuf *msg) {
    if (p->num_tokens == 0 || p->num_seqs == 0) return AP_OK;
    const int log2_page = ap_page_shift(p->page_size);
    if (log2_page < 0) {
        ap_msgbuf_add(msg, MHA_NAME ": slots: page size %d is not a power of two", p->page_size);
        return AP_ERR_UNSUPPORTED;
    }
    const int blocks = (p->num_tokens + 255) / 256;
    mha_slots_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(*p, log2_page);
    return ap_cuda_launch_status(MHA_NAME ": slots", "mha_slots_kernel", msg);
}
