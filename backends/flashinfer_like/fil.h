/* fil.h: what the flashinfer_like plugin glue (C) and its CUDA kernels (.cu) say to each other. */
#ifndef AP_FIL_H
#define AP_FIL_H

#include "plugin_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The paged KV cache as the kernels read it (layout NHD, see plugin_api.h). */
typedef struct fil_paged_kv {
    const void *k_pages;     /* [num_pages][page_size][num_kv_heads][head_dim] of kv_dtype */
    const void *v_pages;
    ap_dtype kv_dtype;       /* BF16, F16 or FP8_E4M3 */
    int32_t page_size;
    int32_t num_kv_heads;
    int32_t head_dim;        /* qk and v head dims are equal in this backend */
    float k_scale;           /* fp8: real = stored * scale; ignored otherwise */
    float v_scale;
    const int32_t *kv_page_indptr;   /* device [num_seqs + 1] */
    const int32_t *kv_page_indices;  /* device */
    const int32_t *kv_last_page_len; /* device [num_seqs] */
} fil_paged_kv;

/* One attention call: queries, outputs and the paged KV they read. */
typedef struct fil_attn_params {
    const void *q;           /* [num_tokens][num_qo_heads][head_dim] of q_dtype */
    void *out;               /* [num_tokens][num_qo_heads][head_dim] of q_dtype */
    float *lse;              /* [num_tokens][num_qo_heads] natural log, or NULL */
    ap_dtype q_dtype;        /* BF16 or F16 */
    int32_t num_seqs;
    int32_t num_tokens;
    int32_t num_qo_heads;
    float sm_scale;
    int32_t causal;
    const int32_t *qo_indptr; /* device [num_seqs + 1] */
    fil_paged_kv kv;
} fil_attn_params;

#ifdef __cplusplus
}
#endif

#endif /* AP_FIL_H */
