/* mha.h: what the trtllm_mha plugin glue (C) and its CUDA kernels (.cu) say to each other. */
#ifndef AP_MHA_H
#define AP_MHA_H

#include "plugin_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MHA_NAME "trtllm_mha"
#define MHA_MAX_GROUP 32  /* query heads per KV head */
#define MHA_MAX_Q_LEN 8   /* new tokens per sequence the decode kernel takes (MTP) */
#define MHA_BLOCK_ROWS 64 /* (token, head) rows of one sequence and KV head per CTA */
#define MHA_MAX_SPLITS 64 /* KV splits per (sequence, row block) at most */
#define MHA_HEAD_DIMS_TEXT "64, 128 or 256"
/* Option nvfp4_keys_m (a measurement knob): auto takes the keys-on-M decode kernel
 * (decode_keys_m.cuh) for <= 8 rows per (sequence, KV head): at D = 128 its v2 over two adjacent
 * KV heads per CTA (an even num_kv_heads; else one head per CTA), at D = 64 its first form; v2
 * the v2 with one KV head per CTA; v1 the first form at D = 128 too; off nvfp4's rows-on-M
 * kernel. MHA_KEYS_M_V2H is no option value: the kernel choice auto makes where two heads pair
 * up (mha_decode_keys_m_for). */
#define MHA_KEYS_M_OFF 0
#define MHA_KEYS_M_AUTO 1
#define MHA_KEYS_M_V1 2
#define MHA_KEYS_M_V2 3
#define MHA_KEYS_M_V2H 4
/* Option decode_schedule: auto and split take the split grid (a CTA per (split, KV head, row
 * block, sequence), placed by the hardware); flat the flat schedule (decode_flat.cuh: one wave of
 * persistent CTAs, each streaming an equal share of the batch's stages, units cut between CTAs and
 * merged by a combine) wherever the kernel set has it (rows on M: 16-bit and fp8 caches at
 * D <= 128; elsewhere the split grid). Flat is for batches of very uneven lengths: H100,
 * 2026-11-27 (call 25): B64 with one sequence of 32768 among 63 of 1024, bf16 0.1635-0.1684 ms
 * against the split grid's 0.4871-0.4877, fp8 0.0931-0.0948 against 0.2894; on equal lengths it
 * is 3-11% slower (B64 L4096 bf16 0.3891 against 0.3748-0.3771, fp8 0.2183 against 0.1974:
 * a static share cannot follow the SMs' uneven rates as the hardware's CTA placement does). */
#define MHA_SCHEDULE_FLAT 0
#define MHA_SCHEDULE_SPLIT 1
/* Option short_extend: which kernel runs an extend of 2..MHA_MAX_Q_LEN new tokens per sequence.
 * decode: the decode kernel, always. auto: the kit's Hopper prefill (split-KV) where the decode
 * kernel has more than one warp's 16 rows per (sequence, KV head) and so fewer key warps
 * (mha_decode_key_warps), for the shapes measured faster that way (plan.c's
 * mha_short_extend_prefill); else the decode kernel. prefill: the kit's prefill wherever it can
 * take the batch (a 16-bit cache of the query's type, the host mirrors, the Hopper kernel). An
 * engine that captures short extends in a graph (not promised: the caps say decode only) sets
 * decode: a prefill plan is the host's, and a captured launch would replay the old batch's. */
#define MHA_SHORT_EXTEND_DECODE 0
#define MHA_SHORT_EXTEND_AUTO 1
#define MHA_SHORT_EXTEND_PREFILL 2

/* ---------------------------------------------------------------------------------------------
 * Decode and multi-token decode (decode.cu). The rows of one (sequence, KV head) are its
 * (new token, query head of the group) pairs, token major: row r = token * group + head. A CTA
 * takes MHA_BLOCK_ROWS of them and split s of num_splits of the sequence's KV tiles, found on
 * the device from seq_lens, so nothing the host computes depends on the lengths (graph capture).
 * ------------------------------------------------------------------------------------------- */
typedef struct mha_decode_params {
    const void *q;       /* [T][Hq][D] of q_dtype, dense */
    void *out;           /* [T][Hq][D] of q_dtype, dense */
    float *lse;          /* [T][Hq] natural log, or NULL */
    ap_dtype q_dtype;    /* BF16 or F16 */
    ap_dtype kv_dtype;   /* q_dtype, FP8_E4M3 or NVFP4 */
    const void *k_pages; /* NHD [page][slot][Hk][D] (nvfp4: D / 2 bytes a row) */
    const void *v_pages;
    const void *k_scales; /* nvfp4: [page][slot][Hk][D / 16] e4m3 block scales */
    const void *v_scales;
    float k_scale; /* fp8: value = stored * k_scale; nvfp4: the global scale; else 1 */
    float v_scale;
    float sm_scale;
    int32_t head_dim;
    int32_t page_size; /* 16, 32 or 64 */
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t num_seqs;
    int32_t max_q_len; /* grid size: rows per (sequence, KV head) at most max_q_len * group */
    const int32_t *qo_indptr;      /* device [num_seqs + 1] */
    const int32_t *kv_page_indptr; /* device [num_seqs + 1] */
    const int32_t *kv_page_indices;
    const int32_t *seq_lens; /* device [num_seqs] */
    int32_t num_splits;      /* CTAs per (sequence, KV head, row block); 1 writes out directly */
    int32_t flat_ctas;       /* > 0: the flat schedule on this many CTAs (decode_flat.cuh) where
                                the kernel set has it (rows on M), else the split grid */
    int32_t keys_m;          /* MHA_KEYS_M_*: <= 8 rows per KV head, nvfp4's decode_keys_m.cuh */
    float *partial_out;      /* [ctas][MHA_BLOCK_ROWS][D] when num_splits > 1; flat: [2 x
                                flat_ctas][MHA_BLOCK_ROWS][D] */
    float *partial_lse;      /* [ctas][MHA_BLOCK_ROWS] base 2 */
} mha_decode_params;

/* Warps of a CTA that split each step's keys (1, 2 or 4; plan.c): 4 when one sequence's rows
 * of a KV head fit one warp (<= 16) and D <= 128, 2 when they fit 32 rows, else 1. A CTA then
 * holds MHA_BLOCK_ROWS / key_warps rows. */
int32_t mha_decode_key_warps(int32_t group, int32_t max_q_len, int32_t head_dim);

/* Whether option short_extend (MHA_SHORT_EXTEND_*) sends an extend of max_q_len new tokens a
 * sequence (2..MHA_MAX_Q_LEN) of this model to the kit's prefill kernel, by shape: decode never;
 * prefill for a 16-bit cache of the query's type; auto where that was measured faster (plan.c).
 * The batch's host mirrors and the Hopper kernel are the caller's to check. */
int32_t mha_short_extend_prefill(int32_t option, int32_t max_q_len, const ap_model *model,
                                 int32_t num_seqs, int32_t max_seq_len, int32_t split_kv);
/* Row blocks per (sequence, KV head) for this group, query length and key warps. */
int32_t mha_decode_row_blocks(int32_t group, int32_t max_q_len, int32_t key_warps);
/* Splits per CTA from the batch's shape only (plan.c); `slots` is a wave (CTAs resident per SM
 * times SMs). ctas * splits * heads_per_cta <= MHA_SPLIT_WAVES * slots when splits > 1. */
#define MHA_SPLIT_WAVES 3
int32_t mha_decode_num_splits(int32_t num_seqs, int32_t num_kv_heads, int32_t group,
                              int32_t max_q_len, int32_t head_dim, int32_t slots,
                              int32_t max_splits, int32_t heads_per_cta);
/* KV heads one decode CTA takes: 2 for option nvfp4_keys_m auto where the two-head kernel serves
 * (nvfp4, D = 128, group x max_q_len <= 8, an even num_kv_heads), else 1. The CTAs of a batch
 * are then num_seqs x num_kv_heads / 2; the partial slots stay one per (sequence, KV head,
 * split), so splits x CTAs x heads_per_cta <= MHA_SPLIT_WAVES x slots bounds the workspace. */
int32_t mha_decode_heads_per_cta(ap_dtype kv_dtype, int32_t head_dim, int32_t group,
                                 int32_t max_q_len, int32_t num_kv_heads, int32_t keys_m);
/* keys_m as the kernels take it: MHA_KEYS_M_V2H where two heads pair up (heads_per_cta 2), the
 * one-head v2 (option v2) as auto's one-head kernel, else keys_m. */
int32_t mha_decode_keys_m_for(int32_t keys_m, int32_t heads_per_cta);
/* CTAs of the model's decode kernel resident on one SM (occupancy), on the current device;
 * rows (a (sequence, KV head)'s rows, group x max_q_len) and keys_m pick the kernel; flat: its
 * flat-schedule kernel (0 when the set has none). */
ap_status mha_decode_ctas_per_sm(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype,
                                 int32_t key_warps, int32_t rows, int32_t keys_m, int32_t flat,
                                 int32_t *out, ap_msgbuf *msg);
/* Raise the kernels' shared-memory limits on the current device (once per instance). */
ap_status mha_decode_setup(ap_msgbuf *msg);
ap_status mha_decode_run(const mha_decode_params *params, void *stream, ap_msgbuf *msg);

/* The split-KV combine (combine.cu): the partial states of a decode launch with num_splits > 1
 * into the output rows and LSE. */
typedef struct mha_combine_params {
    void *out;
    float *lse;
    ap_dtype q_dtype;
    const int32_t *qo_indptr;
    const float *partial_out;
    const float *partial_lse;
    int32_t head_dim, group, num_qo_heads, num_kv_heads, num_seqs, num_splits;
    int32_t row_blocks, block_rows;
    /* the flat schedule's combine (flat_ctas > 0): its decode grid and stage size */
    const int32_t *seq_lens;
    int32_t flat_ctas, stage_keys;
} mha_combine_params;

ap_status mha_combine_run(const mha_combine_params *params, void *stream, ap_msgbuf *msg);

/* ---------------------------------------------------------------------------------------------
 * The cache slots of a batch's new tokens (combine.cu), computed on the device from the batch's
 * device arrays: token i of sequence s sits at position seq_len - q_len + i.
 * ------------------------------------------------------------------------------------------- */
typedef struct mha_slots_params {
    const int32_t *qo_indptr;
    const int32_t *kv_page_indptr;
    const int32_t *kv_page_indices;
    const int32_t *seq_lens;
    int32_t num_seqs;
    int32_t num_tokens;
    int32_t page_size;
    int32_t *slots; /* [num_tokens] out */
} mha_slots_params;

ap_status mha_slots_run(const mha_slots_params *params, void *stream, ap_msgbuf *msg);

#ifdef __cplusplus
}
#endif

#endif /* AP_MHA_H */
