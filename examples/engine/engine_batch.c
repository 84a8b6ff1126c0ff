/* engine_batch.c: the engine's sequences, their pages, one forward's CSR batch and the KV cache. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

ap_status eng_sequences_make(eng_sequences *seqs, eng_rng *rng, int32_t num_seqs,
                             int32_t prompt_len, int32_t steps, int32_t page_size) {
    memset(seqs, 0, sizeof(*seqs));
    if (num_seqs < 1 || prompt_len < 1 || steps < 0 || page_size < 1)
        return AP_ERR_INVALID_ARGUMENT;
    seqs->num_seqs = num_seqs;
    seqs->page_size = page_size;
    int64_t longest = (int64_t)prompt_len + steps;
    seqs->pages_per_seq = (int32_t)((longest + page_size - 1) / page_size);
    /* One spare page nobody owns, so page 0 is not always the first page of sequence 0. */
    int64_t pool = (int64_t)num_seqs * seqs->pages_per_seq + 1;
    if (pool > INT32_MAX) return AP_ERR_INVALID_ARGUMENT;
    seqs->num_pages = (int32_t)pool;
    seqs->prompt_lens = calloc((size_t)num_seqs, sizeof(int32_t));
    seqs->seq_lens = calloc((size_t)num_seqs, sizeof(int32_t));
    seqs->page_table = calloc((size_t)pool, sizeof(int32_t));
    if (!seqs->prompt_lens || !seqs->seq_lens || !seqs->page_table) {
        eng_sequences_free(seqs);
        return AP_ERR_OUT_OF_MEMORY;
    }
    /* A mix of short and long prompts, the last one always the longest allowed. */
    for (int32_t i = 0; i < num_seqs; i++)
        seqs->prompt_lens[i] = i == num_seqs - 1 ? prompt_len : eng_rng_range(rng, 1, prompt_len);
    /* Shuffled pages (Fisher-Yates): page tables that are not the identity catch indexing bugs. */
    for (int32_t p = 0; p < seqs->num_pages; p++) seqs->page_table[p] = p;
    for (int32_t p = seqs->num_pages - 1; p > 0; p--) {
        int32_t q = eng_rng_range(rng, 0, p);
        int32_t swap = seqs->page_table[p];
        seqs->page_table[p] = seqs->page_table[q];
        seqs->page_table[q] = swap;
    }
    return AP_OK;
}

void eng_sequences_free(eng_sequences *seqs) {
    free(seqs->prompt_lens);
    free(seqs->seq_lens);
    free(seqs->page_table);
    memset(seqs, 0, sizeof(*seqs));
}

enum { ENG_QO_INDPTR, ENG_PAGE_INDPTR, ENG_PAGE_INDICES, ENG_LAST_LEN, ENG_SEQ_LENS, ENG_POS };

/* Fill the host arrays for the next forward and advance the sequences' lengths. */
static void eng_batch_fill(eng_batch *b, eng_sequences *seqs, ap_forward_mode mode) {
    int32_t **h = b->host;
    int32_t tokens = 0, pages = 0, max_q = 0, max_seq = 0;
    h[ENG_QO_INDPTR][0] = 0;
    if (h[ENG_PAGE_INDPTR] != NULL) h[ENG_PAGE_INDPTR][0] = 0;
    for (int32_t i = 0; i < seqs->num_seqs; i++) {
        int32_t q_len = mode == AP_MODE_EXTEND ? seqs->prompt_lens[i] : 1;
        int32_t prefix = mode == AP_MODE_EXTEND ? 0 : seqs->seq_lens[i];
        int32_t seq_len = prefix + q_len;
        seqs->seq_lens[i] = seq_len;
        for (int32_t j = 0; j < q_len; j++) h[ENG_POS][tokens + j] = prefix + j;
        tokens += q_len;
        h[ENG_QO_INDPTR][i + 1] = tokens;
        h[ENG_SEQ_LENS][i] = seq_len;
        int32_t num_pages = (seq_len + seqs->page_size - 1) / seqs->page_size;
        if (h[ENG_PAGE_INDPTR] != NULL) {
            for (int32_t p = 0; p < num_pages; p++)
                h[ENG_PAGE_INDICES][pages + p] = seqs->page_table[i * seqs->pages_per_seq + p];
            pages += num_pages;
            h[ENG_PAGE_INDPTR][i + 1] = pages;
            h[ENG_LAST_LEN][i] = seq_len - (num_pages - 1) * seqs->page_size;
        }
        if (q_len > max_q) max_q = q_len;
        if (seq_len > max_seq) max_seq = seq_len;
    }
    ap_batch *batch = &b->batch;
    batch->struct_size = sizeof(ap_batch);
    batch->mode = mode;
    batch->num_seqs = seqs->num_seqs;
    batch->num_tokens = tokens;
    batch->max_q_len = max_q;
    batch->max_seq_len = max_seq;
    batch->num_pages_total = pages;
}

ap_status eng_batch_make(eng_batch *b, eng_sequences *seqs, ap_forward_mode mode, int with_pages,
                         const eng_memory *memory) {
    memset(b, 0, sizeof(*b));
    int32_t n = seqs->num_seqs;
    int64_t tokens = 0;
    for (int32_t i = 0; i < n; i++) tokens += mode == AP_MODE_EXTEND ? seqs->prompt_lens[i] : 1;
    b->counts[ENG_QO_INDPTR] = (size_t)n + 1;
    b->counts[ENG_SEQ_LENS] = (size_t)n;
    b->counts[ENG_POS] = (size_t)tokens;
    if (with_pages) {
        b->counts[ENG_PAGE_INDPTR] = (size_t)n + 1;
        b->counts[ENG_PAGE_INDICES] = (size_t)n * (size_t)seqs->pages_per_seq;
        b->counts[ENG_LAST_LEN] = (size_t)n;
    }
    ap_status status = AP_OK;
    for (int a = 0; a < 6 && status == AP_OK; a++) {
        if (b->counts[a] == 0) continue;
        size_t bytes = b->counts[a] * sizeof(int32_t);
        b->host[a] = calloc(1, bytes);
        if (b->host[a] == NULL)
            status = AP_ERR_OUT_OF_MEMORY;
        else if (memory->on_device)
            status = eng_mem_alloc(memory, bytes, 256, (void **)&b->device[a]);
    }
    if (status != AP_OK) {
        eng_batch_free(b, memory);
        return status;
    }
    eng_batch_fill(b, seqs, mode);
    for (int a = 0; a < 6 && status == AP_OK && memory->on_device; a++)
        if (b->device[a] != NULL)
            status =
                eng_mem_upload(memory, b->device[a], b->host[a], b->counts[a] * sizeof(int32_t));
    int32_t **arrays = memory->on_device ? b->device : b->host;
    ap_batch *batch = &b->batch;
    batch->qo_indptr = arrays[ENG_QO_INDPTR];
    batch->kv_page_indptr = arrays[ENG_PAGE_INDPTR];
    batch->kv_page_indices = arrays[ENG_PAGE_INDICES];
    batch->kv_last_page_len = arrays[ENG_LAST_LEN];
    batch->seq_lens = arrays[ENG_SEQ_LENS];
    batch->positions = arrays[ENG_POS];
    batch->qo_indptr_host = b->host[ENG_QO_INDPTR];
    batch->kv_page_indptr_host = b->host[ENG_PAGE_INDPTR];
    batch->kv_page_indices_host = b->host[ENG_PAGE_INDICES];
    batch->kv_last_page_len_host = b->host[ENG_LAST_LEN];
    batch->seq_lens_host = b->host[ENG_SEQ_LENS];
    batch->positions_host = b->host[ENG_POS];
    if (status != AP_OK) eng_batch_free(b, memory);
    return status;
}

ap_batch eng_batch_host(const eng_batch *b) {
    ap_batch batch = b->batch;
    batch.qo_indptr = batch.qo_indptr_host;
    batch.kv_page_indptr = batch.kv_page_indptr_host;
    batch.kv_page_indices = batch.kv_page_indices_host;
    batch.kv_last_page_len = batch.kv_last_page_len_host;
    batch.seq_lens = batch.seq_lens_host;
    batch.positions = batch.positions_host;
    return batch;
}

void eng_batch_free(eng_batch *b, const eng_memory *memory) {
    for (int a = 0; a < 6; a++) {
        free(b->host[a]);
        if (b->device[a] != NULL) eng_mem_free(memory, b->device[a]);
    }
    memset(b, 0, sizeof(*b));
}

ap_status eng_cache_make(eng_cache *cache, const ap_model *model, const ap_kv_spec *spec,
                         int32_t num_pages, const eng_memory *memory) {
    memset(cache, 0, sizeof(*cache));
    ap_kv_cache *kv = &cache->kv;
    kv->struct_size = sizeof(ap_kv_cache);
    kv->layout = AP_KV_LAYOUT_NHD;
    kv->dtype = model->kv_dtype;
    kv->page_size = model->page_size;
    kv->num_pages = num_pages;
    kv->num_kv_heads = model->num_kv_heads;
    kv->head_dim_qk = model->head_dim_qk;
    kv->head_dim_v = model->head_dim_v;
    cache->k_bytes = spec->k_bytes_per_page * (size_t)num_pages;
    cache->v_bytes = spec->v_bytes_per_page * (size_t)num_pages;
    cache->scale_bytes = spec->scale_bytes_per_page * (size_t)num_pages;
    size_t align = spec->alignment ? spec->alignment : 256;
    void **slots[4] = {&kv->k_pages, &kv->v_pages, &kv->k_block_scales, &kv->v_block_scales};
    size_t sizes[4] = {cache->k_bytes, cache->v_bytes, cache->scale_bytes, cache->scale_bytes};
    ap_status status = AP_OK;
    for (int i = 0; i < 4 && status == AP_OK; i++) {
        if (sizes[i] == 0) continue; /* MLA's single latent has no V pages */
        status = eng_mem_alloc(memory, sizes[i], align, slots[i]);
        /* Zeroed so a backend reading a slot it never wrote gives a wrong answer, not NaN noise. */
        if (status == AP_OK) status = eng_mem_zero(memory, *slots[i], sizes[i]);
    }
    if (status != AP_OK) eng_cache_free(cache, memory);
    return status;
}

void eng_cache_free(eng_cache *cache, const eng_memory *memory) {
    void *pointers[4] = {cache->kv.k_pages, cache->kv.v_pages, cache->kv.k_block_scales,
                         cache->kv.v_block_scales};
    for (int i = 0; i < 4; i++)
        if (pointers[i] != NULL) eng_mem_free(memory, pointers[i]);
    memset(cache, 0, sizeof(*cache));
}
