/* fil.h: what the flashinfer_like plugin glue (C) and its CUDA kernels (.cu) say to each other. */
#ifndef AP_FIL_H
#define AP_FIL_H

#include "backends/common/kit.h"
#include "fil_limits.h"
#include "plugin_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every message starts with the backend's name, once, then the step:
 * "flashinfer_like: decode: ...". */
#define FIL_NAME "flashinfer_like"

/* The paged KV cache as the kernels read it (layout NHD, see plugin_api.h). */
typedef struct fil_paged_kv {
    const void *k_pages; /* [num_pages][page_size][num_kv_heads][head_dim] of kv_dtype */
    const void *v_pages;
    ap_dtype kv_dtype; /* BF16, F16 or FP8_E4M3 */
    int32_t page_size;
    int32_t num_kv_heads;
    int32_t head_dim; /* qk and v head dims are equal in this backend */
    float k_scale;    /* fp8: real = stored * scale; ignored otherwise */
    float v_scale;
    const int32_t *kv_page_indptr;   /* device [num_seqs + 1] */
    const int32_t *kv_page_indices;  /* device */
    const int32_t *kv_last_page_len; /* device [num_seqs] */
} fil_paged_kv;

/* One attention call: queries, outputs and the paged KV they read. */
typedef struct fil_attn_params {
    const void *q;    /* [num_tokens][num_qo_heads][head_dim] of q_dtype */
    void *out;        /* [num_tokens][num_qo_heads][head_dim] of q_dtype */
    float *lse;       /* [num_tokens][num_qo_heads] natural log, or NULL */
    ap_dtype q_dtype; /* BF16 or F16 */
    int32_t num_seqs;
    int32_t num_tokens;
    int32_t num_qo_heads;
    float sm_scale;
    int32_t causal;
    const int32_t *qo_indptr; /* device [num_seqs + 1] */
    fil_paged_kv kv;
} fil_attn_params;

/* ---------------------------------------------------------------------------------------------
 * Decode (decode.cu): one warp streams the KV of one or more (sequence, KV head, token range)
 * segments, 16 tokens a step (32 for fp8 KV up to D128), for all query heads of the group at
 * once. The host plans the segments (split-KV); pairs cut over several warps leave partial states
 * that a merge combines.
 * ------------------------------------------------------------------------------------------- */

#define FIL_DECODE_TILE 16 /* the planner's unit: segments start on multiples of it */
#define FIL_DECODE_WARPS 4 /* warps per CTA; each warp is an independent worker */

/* One segment: tokens [begin, end) of sequence `seq` under KV head `kv_head`. */
typedef struct fil_decode_seg {
    int32_t seq;
    int32_t kv_head;
    int32_t begin;
    int32_t end;
} fil_decode_seg;

/* The decode work list of one batch (device arrays) and the workspace of its partial states. */
typedef struct fil_decode_plan {
    int32_t num_workers;          /* warps with work; 0: nothing to do */
    int32_t num_merges;           /* pairs that need the merge kernel */
    const int32_t *worker_indptr; /* [num_workers + 1] into segs */
    const fil_decode_seg *segs;   /* worker w runs segs[worker_indptr[w] .. [w+1]) in order */
    const int32_t *seg_partial;   /* per seg: its partial slot, or -1 to write out directly */
    const ap_kit_merge *merges;   /* [num_merges]: pairs cut over several warps */
    float *partial_out;           /* [slots][group][head_dim]: normalised, v_scale applied */
    float *partial_lse;           /* [slots][group]: base-2 log-sum-exp of the scaled logits */
} fil_decode_plan;

/* Warps that run at once on `sm_count` SMs for this shape (the planner's budget), after raising
 * the kernel's shared-memory limit on the current device. AP_ERR_UNSUPPORTED for shapes not
 * compiled, AP_ERR_CUDA when the runtime fails. */
ap_status fil_decode_max_workers(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype,
                                 int32_t sm_count, int32_t *out, ap_msgbuf *msg);

/* Runs one layer of a planned decode batch on `stream`: the decode kernel, then the merge when
 * plan->num_merges > 0. Query token i belongs to sequence i; q, out and lse are dense. */
ap_status fil_decode_run(const fil_attn_params *params, const fil_decode_plan *plan, void *stream,
                         ap_msgbuf *msg);

#ifdef __cplusplus
}
#endif

#endif /* AP_FIL_H */
