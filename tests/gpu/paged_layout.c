/* paged_layout.c: parse batch specs and build shuffled page tables for GPU tests and benchmarks. */
#include "paged_layout.h"

#include <stdio.h>
#include <stdlib.h>

#include "gpu_rand.h"

static int gpu_spec_number(const char **cursor, long *out) {
    char *end = NULL;
    long value = strtol(*cursor, &end, 10);
    if (end == *cursor || value < 0 || value > (1L << 30)) return 0;
    *cursor = end;
    *out = value;
    return 1;
}

ap_status gpu_seqs_parse(const char *spec, gpu_seq **out, int32_t *count) {
    size_t cap = 16, n = 0;
    gpu_seq *seqs = malloc(cap * sizeof *seqs);
    const char *cursor = spec;
    if (seqs == NULL) return AP_ERR_OUT_OF_MEMORY;
    while (*cursor != '\0') {
        long prefix = 0, q_len = 0, repeat = 1;
        if (!gpu_spec_number(&cursor, &prefix) || *cursor++ != ':' ||
            !gpu_spec_number(&cursor, &q_len) || q_len < 1)
            goto bad;
        if (*cursor == 'x') {
            cursor++;
            if (!gpu_spec_number(&cursor, &repeat) || repeat < 1) goto bad;
        }
        if (*cursor == ',')
            cursor++;
        else if (*cursor != '\0')
            goto bad;
        for (long i = 0; i < repeat; i++) {
            if (n == cap) {
                gpu_seq *grown = realloc(seqs, 2 * cap * sizeof *seqs);
                if (grown == NULL) {
                    free(seqs);
                    return AP_ERR_OUT_OF_MEMORY;
                }
                seqs = grown;
                cap *= 2;
            }
            seqs[n++] = (gpu_seq){(int32_t)prefix, (int32_t)q_len};
        }
    }
    if (n == 0) goto bad;
    *out = seqs;
    *count = (int32_t)n;
    return AP_OK;
bad:
    fprintf(stderr, "bad batch spec \"%s\" near \"%s\" (want prefix:q_len[xN],...)\n", spec,
            cursor);
    free(seqs);
    return AP_ERR_INVALID_ARGUMENT;
}

static int32_t gpu_pages_for(int32_t tokens, int32_t page_size) {
    return (tokens + page_size - 1) / page_size;
}

ap_status gpu_layout_build(const gpu_seq *seqs, int32_t num_seqs, int32_t page_size,
                           int32_t spare_pages, uint64_t *rng, gpu_layout *out) {
    gpu_layout l = {0};
    int32_t *pool = NULL;
    l.num_seqs = num_seqs;
    l.page_size = page_size;
    for (int32_t i = 0; i < num_seqs; i++) {
        int32_t len = seqs[i].prefix + seqs[i].q_len;
        l.num_tokens += seqs[i].q_len;
        l.num_pages_used += gpu_pages_for(len, page_size);
        if (seqs[i].q_len > l.max_q_len) l.max_q_len = seqs[i].q_len;
        if (len > l.max_seq_len) l.max_seq_len = len;
    }
    l.num_pages_pool = l.num_pages_used + spare_pages;
    l.off_qo_indptr = 0;
    l.off_kv_page_indptr = l.off_qo_indptr + (size_t)num_seqs + 1;
    l.off_kv_page_indices = l.off_kv_page_indptr + (size_t)num_seqs + 1;
    l.off_kv_last_page_len = l.off_kv_page_indices + (size_t)l.num_pages_used;
    l.off_seq_lens = l.off_kv_last_page_len + (size_t)num_seqs;
    l.off_positions = l.off_seq_lens + (size_t)num_seqs;
    l.num_ints = l.off_positions + (size_t)l.num_tokens;
    l.ints = calloc(l.num_ints, sizeof(int32_t));
    pool = malloc((size_t)l.num_pages_pool * sizeof *pool);
    if (l.ints == NULL || pool == NULL) {
        free(l.ints);
        free(pool);
        return AP_ERR_OUT_OF_MEMORY;
    }
    /* Fisher-Yates over the whole pool: used pages land anywhere, spares between them. */
    for (int32_t p = 0; p < l.num_pages_pool; p++) pool[p] = p;
    for (int32_t p = l.num_pages_pool - 1; p > 0; p--) {
        int32_t j = (int32_t)gpu_rand_below(rng, (uint32_t)p + 1);
        int32_t swap = pool[p];
        pool[p] = pool[j];
        pool[j] = swap;
    }
    int32_t *qo_indptr = l.ints + l.off_qo_indptr;
    int32_t *page_indptr = l.ints + l.off_kv_page_indptr;
    int32_t *page_indices = l.ints + l.off_kv_page_indices;
    int32_t *last_page_len = l.ints + l.off_kv_last_page_len;
    int32_t *seq_lens = l.ints + l.off_seq_lens;
    int32_t *positions = l.ints + l.off_positions;
    int32_t token = 0, page = 0;
    for (int32_t i = 0; i < num_seqs; i++) {
        int32_t len = seqs[i].prefix + seqs[i].q_len;
        int32_t pages = gpu_pages_for(len, page_size);
        qo_indptr[i] = token;
        page_indptr[i] = page;
        for (int32_t p = 0; p < pages; p++) page_indices[page + p] = pool[page + p];
        last_page_len[i] = len - (pages - 1) * page_size;
        seq_lens[i] = len;
        for (int32_t j = 0; j < seqs[i].q_len; j++) positions[token + j] = seqs[i].prefix + j;
        token += seqs[i].q_len;
        page += pages;
    }
    qo_indptr[num_seqs] = token;
    page_indptr[num_seqs] = page;
    free(pool);
    *out = l;
    return AP_OK;
}

void gpu_layout_free(gpu_layout *layout) {
    free(layout->ints);
    layout->ints = NULL;
}

int64_t gpu_layout_slot(const gpu_layout *layout, int32_t seq, int32_t pos) {
    const int32_t *page_indptr = layout->ints + layout->off_kv_page_indptr;
    const int32_t *page_indices = layout->ints + layout->off_kv_page_indices;
    int32_t page = page_indices[page_indptr[seq] + pos / layout->page_size];
    return (int64_t)page * layout->page_size + pos % layout->page_size;
}

void gpu_layout_batch(const gpu_layout *layout, ap_forward_mode mode, const int32_t *device_ints,
                      ap_batch *out) {
    const int32_t *host = layout->ints;
    const int32_t *dev = device_ints != NULL ? device_ints : host;
    *out = (ap_batch){
        .struct_size = sizeof(ap_batch),
        .mode = mode,
        .num_seqs = layout->num_seqs,
        .num_tokens = layout->num_tokens,
        .max_q_len = layout->max_q_len,
        .max_seq_len = layout->max_seq_len,
        .num_pages_total = layout->num_pages_used,
        .qo_indptr = dev + layout->off_qo_indptr,
        .kv_page_indptr = dev + layout->off_kv_page_indptr,
        .kv_page_indices = dev + layout->off_kv_page_indices,
        .kv_last_page_len = dev + layout->off_kv_last_page_len,
        .seq_lens = dev + layout->off_seq_lens,
        .positions = dev + layout->off_positions,
        .qo_indptr_host = host + layout->off_qo_indptr,
        .kv_page_indptr_host = host + layout->off_kv_page_indptr,
        .kv_page_indices_host = host + layout->off_kv_page_indices,
        .kv_last_page_len_host = host + layout->off_kv_last_page_len,
        .seq_lens_host = host + layout->off_seq_lens,
        .positions_host = host + layout->off_positions,
    };
}

void gpu_layout_model(const gpu_layout *layout, ap_dtype q_dtype, ap_dtype kv_dtype,
                      int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim, ap_model *out) {
    *out = (ap_model){
        .struct_size = sizeof(ap_model),
        .name = "gpu",
        .kind = AP_ATTN_MHA,
        .num_qo_heads = num_qo_heads,
        .num_kv_heads = num_kv_heads,
        .head_dim_qk = head_dim,
        .head_dim_v = head_dim,
        .dtype = q_dtype,
        .kv_dtype = kv_dtype,
        .page_size = layout->page_size,
        .num_layers = 1,
        .causal = 1,
        .max_batch = layout->num_seqs,
        .max_tokens = layout->num_tokens,
        .max_kv_len = layout->max_seq_len,
    };
}

void gpu_layout_kv_cache(const gpu_layout *layout, ap_dtype kv_dtype, int32_t num_kv_heads,
                         int32_t head_dim, void *k_pages, void *v_pages, ap_kv_cache *out) {
    *out = (ap_kv_cache){
        .struct_size = sizeof(ap_kv_cache),
        .layout = AP_KV_LAYOUT_NHD,
        .dtype = kv_dtype,
        .page_size = layout->page_size,
        .num_pages = layout->num_pages_pool,
        .num_kv_heads = num_kv_heads,
        .head_dim_qk = head_dim,
        .head_dim_v = head_dim,
        .k_pages = k_pages,
        .v_pages = v_pages,
    };
}
