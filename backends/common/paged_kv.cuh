// paged_kv.cuh: addressing of the paged NHD KV cache ([page][slot][head][dim]) on the device.
#ifndef AP_COMMON_PAGED_KV_CUH
#define AP_COMMON_PAGED_KV_CUH

#include <stdint.h>

// Where token `pos` of a sequence lives: its cache slot page * page_size + offset, found through
// the sequence's page list (kv_page_indices + kv_page_indptr[seq]). Page sizes are powers of two
// here, so the division is a shift.
__device__ __forceinline__ int64_t ap_paged_slot(const int32_t *seq_pages, int32_t pos,
                                                 int32_t log2_page_size) {
    int32_t page = __ldg(seq_pages + (pos >> log2_page_size));
    int32_t offset = pos & ((1 << log2_page_size) - 1);
    return ((int64_t)page << log2_page_size) + offset;
}

// The shift of a power-of-two page size, or -1 for any other: the host picks the shift path.
static inline int ap_page_shift(int32_t page_size) {
    return page_size > 0 && (page_size & (page_size - 1)) == 0 ? __builtin_ctz(page_size) : -1;
}

// Element offset of the row (slot, head) in an NHD cache with `num_heads` heads of `head_dim`.
__device__ __forceinline__ int64_t ap_paged_row(int64_t slot, int32_t head, int32_t num_heads,
                                                int32_t head_dim) {
    return (slot * num_heads + head) * (int64_t)head_dim;
}

#endif // AP_COMMON_PAGED_KV_CUH
