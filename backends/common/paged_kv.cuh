// paged_kv.cuh: addressing of the paged NHD KV cache ([page][slot][head][dim]) on the device.
#ifndef AP_COMMON_PAGED_KV_CUH
#define AP_COMMON_PAGED_KV_CUH

#include <stdint.h>

// A sequence's token `pos` lives in entry pos / page_size of its page list (kv_page_indices +
// kv_page_indptr[seq]), at cache slot page * page_size + pos % page_size. Any page size works;
// POW2 (a compile-time flag, or a run-time branch on page_shift >= 0 around a straight run of
// code for each) turns the division into a shift by page_shift = log2(page_size), the remainder
// into a mask and the multiply into a shift. The lookup is two steps so a kernel can load its page
// numbers early and compute the slots later.

// The entry of the page list that holds position pos.
template <bool POW2>
__device__ __forceinline__ int32_t ap_page_entry(int32_t pos, int32_t page_size,
                                                 int32_t page_shift) {
    return POW2 ? pos >> page_shift : pos / page_size;
}

// The cache slot of position pos, given the page that entry ap_page_entry(pos) names.
template <bool POW2>
__device__ __forceinline__ int64_t ap_page_slot(int32_t page, int32_t pos, int32_t page_size,
                                                int32_t page_shift) {
    if constexpr (POW2) return ((int64_t)page << page_shift) + (pos & (page_size - 1));
    return (int64_t)page * page_size +
           (pos - ap_page_entry<false>(pos, page_size, page_shift) * page_size);
}

// Both steps for a power-of-two page size known only by its shift.
__device__ __forceinline__ int64_t ap_paged_slot(const int32_t *seq_pages, int32_t pos,
                                                 int32_t log2_page_size) {
    const int32_t page_size = 1 << log2_page_size;
    const int32_t page = __ldg(seq_pages + ap_page_entry<true>(pos, page_size, log2_page_size));
    return ap_page_slot<true>(page, pos, page_size, log2_page_size);
}

// The shift of a power-of-two page size, or -1 for any other: the host picks the shift path
// (POW2) with it.
static inline int ap_page_shift(int32_t page_size) {
    return page_size > 0 && (page_size & (page_size - 1)) == 0 ? __builtin_ctz(page_size) : -1;
}

// Element offset of the row (slot, head) in an NHD cache with `num_heads` heads of `head_dim`.
__device__ __forceinline__ int64_t ap_paged_row(int64_t slot, int32_t head, int32_t num_heads,
                                                int32_t head_dim) {
    return (slot * num_heads + head) * (int64_t)head_dim;
}

#endif // AP_COMMON_PAGED_KV_CUH
