/* prefill.h: the kit's one prefill (extend) attention kernel on tensor cores: host plan, GPU run. */
#ifndef AP_COMMON_PREFILL_H
#define AP_COMMON_PREFILL_H

#include "kit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the kernel serves (ap_kit_prefill_check_config says so line by line):
 *   - a paged K/V source (the cache: page table, any page size >= 1, powers of two the fast
 *     case) with equal head dims qk = v = 64, 128 or 256;
 *   - a ragged K/V source (sequence i's keys are rows kv_indptr[i] .. kv_indptr[i+1] of dense
 *     k [kv][Hkv][qk] and v [kv][Hkv][v] tensors) with head dims qk = v = 64, 128 or 256
 *     (fa_varlen's raw k/v, embedding skip-KV) or qk 192 / v 128 (MLA's MHA form); a sequence
 *     with no key writes out 0 and lse -inf;
 *   - queries and outputs BF16 or F16; K/V of the query type or FP8_E4M3 (real = stored *
 *     k_scale / v_scale, dequantized in shared memory);
 *   - group sizes num_qo_heads / num_kv_heads of 1..AP_KIT_PREFILL_MAX_GROUP, the group's query
 *     heads packed into one CTA's rows; causal aligned to the end (query row j of a sequence
 *     with q_len rows and kv_len keys sees keys 0 .. kv_len - q_len + j) or no mask; LSE
 *     (natural log) optional. */
#define AP_KIT_PREFILL_MAX_GROUP 8

/* Inputs of the plan: the batch's host mirrors and the model's shape. The K/V lengths come from
 * kv_indptr_host (ragged source) when it is set, else from the page table. */
typedef struct ap_kit_prefill_plan_args {
    int32_t num_seqs;
    const int32_t *qo_indptr_host;        /* [num_seqs + 1] */
    const int32_t *kv_page_indptr_host;   /* [num_seqs + 1], paged source */
    const int32_t *kv_last_page_len_host; /* [num_seqs], in 1..page_size, paged source */
    int32_t page_size;                    /* paged source */
    const int32_t *kv_indptr_host;        /* [num_seqs + 1], ragged source, or NULL */
    int32_t head_dim_qk;
    int32_t head_dim_v;
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t causal;
    int32_t tile_rows;      /* packed query rows per CTA: 0 picks the built one (benchmark builds
                             * offer more) */
    void *host_scratch;     /* buffer_bytes of host memory (pageable is fine) */
    void *device_buffer;    /* buffer_bytes of device memory, 16-byte aligned: the work list */
    size_t buffer_bytes;    /* at least ap_kit_prefill_plan_bytes() for this model */
    int32_t caller_uploads; /* 1: no copy here; the caller moves host_scratch's first
                             * num_items * 16 bytes and sets plan->items (with its plan
                             * buffer, one copy per batch) */
    ap_dtype kv_dtype;      /* the calls' K/V dtype: BF16 / F16 let the Hopper kernel take the
                             * plan where it serves the shape (prefill_hopper.h); AP_DTYPE_NONE
                             * (unset) keeps the mma.sync kernel's plan */
    int32_t *tile_counters; /* device, two int32 at 0 (ap_kit_plan_buffer's), or NULL: the
                             * Hopper kernel's dynamic schedule, which leaves them at 0; the
                             * plan's launches must not run concurrently */
    /* The plan buffer whose split workspace (its `split`, grown by ap_kit_device_reserve) a
     * split-KV plan uses, or NULL: no split. A Hopper plan whose work tiles fill at most half
     * the GPU's SMs cuts each one's keys into `splits` parts (ap_kit_prefill_split_count), each
     * part a work tile of its own, and merges the parts' partial rows after the kernel
     * (ap_kit_merge_rows_run): a short chunk over a long prefix then runs on every SM instead
     * of a few. The plan's launches share the workspace, one after another on one stream. */
    ap_kit_plan_buffer *split_space;
} ap_kit_prefill_plan_args;

/* The work list of one batch, shared by every layer: one item per (sequence, query tile), the
 * most KV tiles first so the longest CTAs start early. Each item runs once per KV head. */
typedef struct ap_kit_prefill_plan {
    int32_t num_items;   /* 0: nothing to compute (every q_len is 0) */
    int32_t tile_rows;   /* packed query rows per CTA: tile_tokens * group <= tile_rows */
    int32_t tile_tokens; /* new tokens of one sequence per item */
    int32_t head_dim_qk; /* what the plan was built for; ap_kit_prefill_run checks them */
    int32_t head_dim_v;
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t causal;
    int32_t ragged;
    const void *items;      /* device_buffer, filled by an async copy on the plan's stream */
    int32_t hopper;         /* 1: items of the Hopper kernel's work tiles (prefill_hopper.h) */
    int32_t num_q_tokens;   /* qo_indptr_host[num_seqs] */
    int32_t num_kv_rows;    /* kv_indptr_host[num_seqs] (ragged source), else 0 */
    int32_t *tile_counters; /* the args' */
    int32_t min_kv_tiles;   /* the fewest KV tiles of a work tile (the last item's), 0 if none
                             * or where a split plan's part may have none */
    int32_t splits;         /* 1, or split-KV's parts of every work tile (args' split_space) */
    void *split_out;        /* the parts' rows [tokens][splits][Hq][head_dim_v] of Q's dtype */
    float *split_lse;       /* [tokens][splits][Hq] */
} ap_kit_prefill_plan;

/* One layer's call. Exactly one source: kv_indptr set (ragged: k, v) or not (paged). */
typedef struct ap_kit_prefill_params {
    const void *q;    /* [num_tokens][num_qo_heads][head_dim_qk] of q_dtype, dense */
    void *out;        /* [num_tokens][num_qo_heads][head_dim_v] of q_dtype, dense */
    float *lse;       /* [num_tokens][num_qo_heads] natural log, or NULL */
    ap_dtype q_dtype; /* BF16 or F16 */
    ap_dtype kv_dtype;
    int32_t head_dim_qk;
    int32_t head_dim_v;
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t causal;
    float sm_scale;
    float k_scale; /* read only for fp8 K/V */
    float v_scale;
    const int32_t *qo_indptr; /* device [num_seqs + 1] */
    /* paged source: the NHD cache [page][page_size][num_kv_heads][head_dim] */
    const void *k_pages;
    const void *v_pages;
    int32_t page_size;
    const int32_t *kv_page_indptr;
    const int32_t *kv_page_indices;
    const int32_t *kv_last_page_len;
    /* ragged source: k [kv][num_kv_heads][head_dim_qk], v [kv][num_kv_heads][head_dim_v], dense,
     * 16-byte aligned */
    const void *k;
    const void *v;
    const int32_t *kv_indptr; /* device [num_seqs + 1], or NULL for the paged source */
} ap_kit_prefill_params;

/* Adds one line to `reasons` ("who: ...") for every part of this configuration the kernel does
 * not serve and returns AP_ERR_UNSUPPORTED, or returns AP_OK. page_size is read only for the
 * paged source. No GPU work: callable from validate(). */
ap_status ap_kit_prefill_check_config(int32_t ragged, int32_t head_dim_qk, int32_t head_dim_v,
                                      ap_dtype q_dtype, ap_dtype kv_dtype, int32_t num_qo_heads,
                                      int32_t num_kv_heads, int32_t page_size, const char *who,
                                      ap_msgbuf *reasons);

/* Bytes of host scratch and of device buffer (each) a plan needs for batches of at most
 * max_tokens new tokens over at most max_batch sequences. 0 for an unsupported shape. */
size_t ap_kit_prefill_plan_bytes(int32_t max_tokens, int32_t max_batch, int32_t head_dim_qk,
                                 int32_t head_dim_v, int32_t num_qo_heads, int32_t num_kv_heads);

/* The arguments every plan of a paged-source batch starts from: the batch's host mirrors
 * (qo_indptr, kv_page_indptr, kv_last_page_len) and the model's page size, head dims, heads and
 * causality; the rest zero. The caller adds its buffers, the K/V dtype and the split space. */
ap_kit_prefill_plan_args ap_kit_prefill_paged_args(const ap_model *model, const ap_batch *batch);

/* Builds the work list from the host mirrors of a batch (the core's checks passed: indptrs
 * from 0, never decreasing; with causal every kv_len >= q_len) and copies it to device_buffer on
 * `stream` (a cudaStream_t or NULL); AP_ERR_UNSUPPORTED for a sequence past the kernel's int32
 * positions. host_scratch may be reused as soon as this returns when it is pageable; when it is
 * pinned, only after `stream` has passed this point. */
ap_status ap_kit_prefill_plan_build(const ap_kit_prefill_plan_args *args, void *stream,
                                    ap_kit_prefill_plan *plan, const char *who, ap_msgbuf *msg);

/* Runs one layer of the planned batch on `stream`. params' batch arrays must be the device
 * arrays of the batch the plan was built from. Returns AP_ERR_UNSUPPORTED for what
 * ap_kit_prefill_check_config refuses, AP_ERR_INVALID_ARGUMENT when params disagree with the
 * plan, AP_ERR_CUDA when the launch fails. */
ap_status ap_kit_prefill_run(const ap_kit_prefill_params *params, const ap_kit_prefill_plan *plan,
                             void *stream, const char *who, ap_msgbuf *msg);

/* ap_kit_prefill_plan_build of a paged batch over the model's cache with the staged K/V type
 * (args->kv_dtype set here to ap_kit_staged_kv_dtype), then ap_kit_stage_reserve for the batch's
 * `pages` of `stager`: *staged says whether the calls run over the staged copy; an fp8 cache
 * without memory to stage it is planned again as stored (kv_dtype fp8_e4m3, the mma.sync
 * kernel). kit_prefill_staged.c; trtllm_mha's prefill and fa_varlen's paged source. */
ap_status ap_kit_prefill_plan_staged(ap_kit_prefill_plan_args *args, const ap_model *model,
                                     int32_t pages, ap_kit_nvfp4_stager *stager, void *stream,
                                     ap_kit_prefill_plan *plan, int32_t *staged, const char *who,
                                     ap_msgbuf *msg);

/* 1 when a plan built for the paged source may run over the ragged one as it is (its `ragged`
 * set, the same items: a fresh prefill's K/V read in place): a Hopper plan whose work tiles the
 * ragged source's kernel shares (every head dim but 64, where the ragged kernel's tiles are 192
 * rows and the paged one's 128), or any mma.sync plan. 0 otherwise. */
int32_t ap_kit_prefill_plan_ragged_ok(const ap_kit_prefill_plan *plan);

/* A fresh prefill (`fresh`: ap_kit_batch_fresh of its batch) whose save_kv copied its k / v into
 * a cache of the activations' own 16-bit type (not a staged nvfp4 or fp8 one: that holds the
 * quantized values): the cache then holds exactly args->k / args->v, the whole K/V, and the
 * kernel reads them in place, contiguous rows instead of one TMA box per page (SGLang's
 * flashinfer backend does the same: ragged prefill for the new tokens, paged only for a prefix).
 * Where `plan` allows it (ap_kit_prefill_plan_ragged_ok), points `params` at args->k / v over its
 * qo_indptr, sets `ragged` to the plan's copy for that source (num_tokens K/V rows) and returns
 * 1; else returns 0 and leaves both alone. */
int32_t ap_kit_prefill_fresh_in_place(const ap_kit_prefill_plan *plan, int32_t fresh,
                                      const ap_model *model, const ap_layer *layer,
                                      const ap_forward_args *args, int32_t num_tokens,
                                      ap_kit_prefill_params *params, ap_kit_prefill_plan *ragged);

#ifdef __cplusplus
}
#endif

#endif /* AP_COMMON_PREFILL_H */
