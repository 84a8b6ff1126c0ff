/* fil.h: what the flashinfer_like plugin glue (C) and its CUDA kernels (.cu) say to each other. */
#ifndef AP_FIL_H
#define AP_FIL_H

#include "backends/common/kit.h"
#include "backends/common/prefill.h"
#include "fil_limits.h"
#include "plugin_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every message starts with the backend's name, once, then the step:
 * "flashinfer_like: decode: ...". */
#define FIL_NAME "flashinfer_like"

/* The launchers (decode.cu, extend.c) take the vtable entry's own arguments: the model, the
 * layer (its KV cache and scales), the forward's tensors, and the batch plan below; nothing is
 * repacked between the entry and the kernels' argument structs. */

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

/* The plan of the batch last given to init_metadata (plan.c). Device arrays live in the
 * instance's plan buffer; the batch's own device arrays are borrowed until the next
 * init_metadata. */
typedef struct fil_batch_plan {
    int ready;
    ap_forward_mode mode;
    int32_t num_seqs;
    int32_t num_tokens;
    int32_t max_page_index;   /* largest page index any sequence names, -1 if none */
    const int32_t *qo_indptr; /* the batch's device arrays */
    const int32_t *kv_page_indptr;
    const int32_t *kv_page_indices;
    const int32_t *kv_last_page_len;
    const int32_t *slots;       /* device [num_tokens]: cache slot of each new token */
    fil_decode_plan decode;     /* mode DECODE */
    ap_kit_prefill_plan extend; /* mode EXTEND (extend.h: fil_extend_plan) */
    int32_t extend_fresh;       /* EXTEND: 1 when no sequence has a cached prefix (every KV length
                                 * equals its new tokens): the saved k / v are then the whole K/V,
                                 * readable as a ragged source (extend.c) */
    int32_t extend_staged;      /* EXTEND: the cache is staged to 16 bits first (extend_nvfp4.c):
                                 * nvfp4 always, fp8 where the plan is the Hopper kernel's */
} fil_batch_plan;

/* Warps that run at once on `sm_count` SMs for this shape (the planner's budget), after raising
 * the kernel's shared-memory limit on the current device. AP_ERR_UNSUPPORTED for shapes not
 * compiled, AP_ERR_CUDA when the runtime fails. */
ap_status fil_decode_max_workers(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype,
                                 int32_t sm_count, int32_t *out, ap_msgbuf *msg);

/* Runs one layer of a planned decode batch on `stream`: the decode kernel, then the merge when
 * plan->decode.num_merges > 0. Query token i belongs to sequence i; q, out and lse are dense
 * (the core checked them), the layer's cache is model's (kv dtype, heads, head dim). */
ap_status fil_decode_run(const ap_model *model, const ap_layer *layer, const ap_forward_args *args,
                         const fil_batch_plan *plan, void *stream, ap_msgbuf *msg);

#ifdef __cplusplus
}
#endif

#endif /* AP_FIL_H */
