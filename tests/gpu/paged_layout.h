/* paged_layout.h: a batch of sequences laid out over a paged KV cache in random page order. */
#ifndef AP_GPU_PAGED_LAYOUT_H
#define AP_GPU_PAGED_LAYOUT_H

#include "plugin_api.h"

/* One sequence of a batch: `prefix` tokens already cached, `q_len` new ones. */
typedef struct gpu_seq {
    int32_t prefix;
    int32_t q_len;
} gpu_seq;

/* The CSR arrays of ap_batch, built on the host. All int32 arrays live in one block (`ints`)
 * so a single copy mirrors them to the device; `off_*` are their offsets in that block. */
typedef struct gpu_layout {
    int32_t num_seqs;
    int32_t num_tokens;
    int32_t max_q_len;
    int32_t max_seq_len;
    int32_t page_size;
    int32_t num_pages_used; /* kv_page_indptr[num_seqs] */
    int32_t num_pages_pool; /* pages of the cache: the used ones and spares, shuffled together */
    int32_t *ints;
    size_t num_ints;
    size_t off_qo_indptr, off_kv_page_indptr, off_kv_page_indices, off_kv_last_page_len;
    size_t off_seq_lens, off_positions;
} gpu_layout;

/* Parse "prefix:q_len[xN],..." (e.g. "0:7,1031:333,4095:1x64") into a new array of sequences.
 * Returns AP_ERR_INVALID_ARGUMENT with a message on stderr for a malformed spec. */
ap_status gpu_seqs_parse(const char *spec, gpu_seq **out, int32_t *count);

/* Lay the sequences out over pages of `page_size` tokens: every sequence gets ceil(len / size)
 * pages taken from a shuffled pool with `spare_pages` extra pages that no sequence uses, so
 * pages are neither contiguous nor in order. */
ap_status gpu_layout_build(const gpu_seq *seqs, int32_t num_seqs, int32_t page_size,
                           int32_t spare_pages, uint64_t *rng, gpu_layout *out);
void gpu_layout_free(gpu_layout *layout);

/* Cache slot (page * page_size + offset) of position `pos` of sequence `seq`. */
int64_t gpu_layout_slot(const gpu_layout *layout, int32_t seq, int32_t pos);

/* Fill an ap_batch: host mirrors point into layout->ints, device arrays into `device_ints` (a
 * device copy of layout->ints), or into the host block when `device_ints` is NULL. */
void gpu_layout_batch(const gpu_layout *layout, ap_forward_mode mode, const int32_t *device_ints,
                      ap_batch *out);

/* An MHA model sized by the layout (its sequences, tokens, longest sequence and page size) with
 * one head dim for qk and v; causal, one layer, named "gpu". Callers change what differs. */
void gpu_layout_model(const gpu_layout *layout, ap_dtype q_dtype, ap_dtype kv_dtype,
                      int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim, ap_model *out);

/* The dense NHD cache over the layout's whole page pool, qk and v of one head dim. */
void gpu_layout_kv_cache(const gpu_layout *layout, ap_dtype kv_dtype, int32_t num_kv_heads,
                         int32_t head_dim, void *k_pages, void *v_pages, ap_kv_cache *out);

#endif /* AP_GPU_PAGED_LAYOUT_H */
