/* gpu_cases.h: the shapes, dtypes and batches every GPU backend is checked on. */
#ifndef AP_GPU_CASES_H
#define AP_GPU_CASES_H

#include "plugin_api.h"

/* Where a case's keys and values come from. */
typedef enum gpu_source {
    GPU_SOURCE_PAGED = 0,  /* the paged cache (the default: every case written before the others) */
    GPU_SOURCE_RAGGED = 1, /* ABI 1.1's ragged source: each sequence's whole context (prefix and
                            * new tokens) as rows of k / v by kv_indptr, no cache; kv_causal is
                            * the case's causal; K/V of the query type or kv_dtype fp8_e4m3 */
    GPU_SOURCE_SKIP_KV = 2 /* embedding skip-KV: an embedding model with prefix caching off, no
                            * page arrays, k / v the new tokens' own rows (every prefix 0) */
} gpu_source;

/* One check: a model shape, a batch (gpu_seqs_parse syntax) and how to run it. */
typedef struct gpu_case {
    char name[64];
    ap_forward_mode mode;
    ap_dtype q_dtype;
    ap_dtype kv_dtype;
    int32_t page_size;
    int32_t head_dim; /* qk and v */
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t causal;
    int32_t save_kv; /* 1: the forward writes the new tokens' k/v; 0: they are in the cache */
    int32_t quick;   /* in the small subset run under compute-sanitizer */
    const char *seqs;
    int32_t rotary_dim; /* > 0: check the append_kv/1 hook (RoPE + quantize + paged write) */
    int32_t is_neox;    /* append cases: 1 rotates pairs (i, i + rotary_dim/2), 0 (2i, 2i+1) */
    gpu_source source;  /* 0: the paged cache */
    int32_t head_dim_v; /* ragged and skip-KV cases: v and out width (0: head_dim, qk = v) */
} gpu_case;

/* Fill `out` (room for `capacity`) with every case; returns how many were written. */
size_t gpu_cases_all(gpu_case *out, size_t capacity);

#endif /* AP_GPU_CASES_H */
