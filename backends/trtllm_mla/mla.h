/* mla.h: what the trtllm_mla plugin glue (C) and its CUDA kernels (.cu) say to each other. */
#ifndef AP_MLA_H
#define AP_MLA_H

#include "plugin_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MLA_LATENT 512  /* kv_lora_rank: c, and V, and each output row */
#define MLA_ROPE 64     /* qk_rope_head_dim: k_pe and q_rope */
#define MLA_ROW 576     /* one latent cache row: c then k_pe */
#define MLA_TILE 64     /* KV tokens per decode step */
#define MLA_MAX_Q_LEN 4 /* query tokens per sequence the absorbed kernel serves (MTP) */

/* ---------------------------------------------------------------------------------------------
 * Absorbed decode (decode.cu). Rows of one sequence are its (query token, head) pairs, token
 * major: row r = token * num_heads + head. A CTA takes `block_rows` (16 or 64) rows of one
 * sequence and a contiguous share of its KV tiles (split s of num_splits); with num_splits > 1
 * the CTAs leave partial states that the combine kernel merges. Every CTA derives its range from
 * seq_lens on the device, so nothing on the host depends on the lengths (graph capture).
 * ------------------------------------------------------------------------------------------- */
typedef struct mla_decode_params {
    const void *q_nope; /* [T][H][512] bf16, element (t, h, d) at t * q_stride_t + h * q_stride_h */
    const void *q_rope; /* [T][H][64] bf16, likewise with the rope strides */
    int64_t q_stride_t, q_stride_h, qr_stride_t, qr_stride_h;
    void *out;            /* [T][H][512] bf16, dense */
    float *lse;           /* [T][H] natural log, or NULL */
    const void *kv_pages; /* [pages][page_size][576] of kv_dtype */
    ap_dtype kv_dtype;    /* BF16 or FP8_E4M3 (value = stored * kv_scale) */
    float kv_scale;
    float sm_scale;
    int32_t page_size; /* 32 or 64 */
    int32_t num_heads;
    int32_t num_seqs;
    int32_t max_q_len;             /* grid size: rows per sequence at most max_q_len * num_heads */
    const int32_t *qo_indptr;      /* device [num_seqs + 1] */
    const int32_t *kv_page_indptr; /* device [num_seqs + 1] */
    const int32_t *kv_page_indices;
    const int32_t *seq_lens; /* device [num_seqs] */
    int32_t num_splits;      /* CTAs per (sequence, row block); 1 writes out directly */
    float *partial_out;      /* [slots][block_rows][512], used when num_splits > 1 or flat */
    float *partial_lse;      /* [slots][block_rows] base-2 */
    /* The flat schedule (decode.cu, one row block per sequence; decode_flat.cuh): flat_ctas CTAs
     * (one per SM) each take an equal share of the batch's KV tiles laid end to end, sequence
     * after sequence; a sequence cut between CTAs leaves partial states in slots 2c (CTA c's
     * first piece) or 2c + 1 (its last), merged by the flat combine. Both kernels compute the
     * schedule from qo_indptr and seq_lens themselves. flat 1: whole sequences per CTA where
     * cutting would not pay (decode_flat.cuh); 2: every share cut (a measurement knob). */
    int32_t flat;
    int32_t flat_ctas;
    int32_t use_pdl;  /* 1: launch the combine with programmatic dependent launch */
    int32_t stages;   /* cp.async stages of the 16-row kernel: 2, 3 (Q in registers), 0: by dtype */
    int64_t kv_slots; /* rows of the cache, num_pages * page_size (the wgmma kernel's TMA map) */
} mla_decode_params;

/* Rows a CTA takes for this head count and query length: 16 when one sequence has at most 16
 * rows (H16 single token), else 64. */
int32_t mla_decode_block_rows(int32_t num_heads, int32_t max_q_len);
/* Splits per (sequence, row block): enough CTAs to cover the SMs once, at most `max_splits`. */
int32_t mla_decode_num_splits(int32_t num_seqs, int32_t num_heads, int32_t max_q_len,
                              int32_t sm_count, int32_t max_splits);
/* Raise the kernels' shared-memory limits on the current device (once per instance). */
ap_status mla_decode_setup(ap_msgbuf *msg);
ap_status mla_decode_run(const mla_decode_params *params, void *stream, ap_msgbuf *msg);
/* The split-KV combine (combine.cu): merges the num_splits partial states of every row that a
 * decode kernel of `block_rows` rows per CTA (16 or 64) left in partial_out / partial_lse into out
 * and lse; PDL when params->use_pdl. */
ap_status mla_combine_run(const mla_decode_params *params, int32_t block_rows, void *stream,
                          ap_msgbuf *msg);
/* The combine's carveout set to the decode kernels' (no per-SM reconfiguration between them);
 * once per instance, from mla_decode_setup. */
ap_status mla_combine_setup(ap_msgbuf *msg);

/* The wgmma decode for 64-row blocks (decode_wgmma.cu, sm_90a builds on an sm_90 device): 1 when it
 * serves these params (bf16 cache, 64-row blocks, pages 32 / 64), else 0 (decode.cu serves them).
 * Same params, plan, partial states and combine as mla_decode_run. */
int mla_decode_wgmma_covers(const mla_decode_params *params);
ap_status mla_decode_wgmma_run(const mla_decode_params *params, void *stream, ap_msgbuf *msg);

/* ---------------------------------------------------------------------------------------------
 * pack_prefix_chunk_kv/1 (pack.cu): k_out = fp8([k_nope | k_pe]), v_out = fp8(v).
 * ------------------------------------------------------------------------------------------- */
typedef struct mla_pack_params {
    const void *k_nope; /* [T][H][nope], element strides below */
    const void *k_pe;   /* [T][rope] (broadcast over heads) */
    const void *v;      /* [T][H][dv] */
    int64_t kn_stride_t, kn_stride_h, kn_stride_d;
    int64_t pe_stride_t, pe_stride_d;
    int64_t v_stride_t, v_stride_h, v_stride_d;
    ap_dtype in_dtype; /* BF16, F16 or F32 */
    void *k_out;       /* [T][H][nope + rope] fp8 e4m3, dense */
    void *v_out;       /* [T][H][dv] fp8 e4m3, dense */
    int64_t tokens;
    int32_t heads, nope_dim, rope_dim, v_dim;
    float k_scale, v_scale;
    float k_rcp, v_rcp; /* set by mla_pack_run: ap_e4m3_div_rcp of the scales (0: divide) */
    int32_t use_pdl;
} mla_pack_params;

ap_status mla_pack_run(const mla_pack_params *params, void *stream, ap_msgbuf *msg);

/* ---------------------------------------------------------------------------------------------
 * The MLA append_kv/1 (append.cu): RoPE on the new k_pe (and on q_rope when given), quantize,
 * write the latent rows [c | k_pe] into their cache slots, in one kernel.
 * ------------------------------------------------------------------------------------------- */
typedef struct mla_append_params {
    const void *k; /* [T][576] rows (c then k_pe), row stride k_stride_t, bf16 */
    int64_t k_stride_t;
    const void *q; /* [T][H][q_dim] bf16 or NULL; its last rotary_dim dims are rotated */
    void *q_out;   /* like q, may alias it */
    int64_t q_stride_t, q_stride_h, qo_stride_t, qo_stride_h;
    int32_t q_dim;
    int32_t num_heads;
    void *kv_pages; /* [num_slots][576] of kv_dtype */
    ap_dtype kv_dtype;
    float k_scale;
    float k_rcp; /* set by mla_append_run: ap_e4m3_div_rcp(k_scale) (0: divide) */
    int64_t num_slots;
    const int32_t *positions;
    const int32_t *out_loc;
    int64_t positions_stride, out_loc_stride;
    const float *cos_sin; /* [max_position][rotary_dim] */
    int32_t max_position;
    int32_t rotary_dim; /* 64: the k_pe part, the last 64 of each latent row */
    int32_t is_neox;
    int64_t num_tokens;
} mla_append_params;

ap_status mla_append_run(const mla_append_params *params, void *stream, ap_msgbuf *msg);

/* ---------------------------------------------------------------------------------------------
 * merge_state/1 (merge_state.cu)
 * ------------------------------------------------------------------------------------------- */
typedef struct mla_merge_params {
    const void *o_a;
    const float *lse_a;
    const void *o_b;
    const float *lse_b;
    void *o;
    float *lse;     /* or NULL */
    ap_dtype dtype; /* BF16, F16 or F32 */
    int64_t rows;   /* tokens * heads */
    int32_t dim;
} mla_merge_params;

ap_status mla_merge_run(const mla_merge_params *params, void *stream, ap_msgbuf *msg);

#ifdef __cplusplus
}
#endif

#endif /* AP_MLA_H */
