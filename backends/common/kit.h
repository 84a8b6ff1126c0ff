/* kit.h: the host side of the CUDA backend kit: what a CUDA plugin's C glue and launchers share. */
#ifndef AP_COMMON_KIT_H
#define AP_COMMON_KIT_H

#include "plugin_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every message a kit function writes starts with `who`, the backend's name, then names the step
 * that failed and CUDA's own words: "flashinfer_like: cudaMalloc: out of memory (...)". */

/* ---------------------------------------------------------------------------------------------
 * The CUDA runtime behind plain C (kit_runtime.cu), so the C glue needs no CUDA header. Streams
 * and events are opaque pointers. Failures return AP_ERR_CUDA, or AP_ERR_OUT_OF_MEMORY for
 * allocations, with the runtime's message (ap_cuda_status in cuda_status.cuh).
 * ------------------------------------------------------------------------------------------- */

ap_status ap_kit_set_device(int32_t ordinal, const char *who, ap_msgbuf *msg);
ap_status ap_kit_device_alloc(size_t bytes, void **out, const char *who, ap_msgbuf *msg);
void ap_kit_device_free(void *ptr); /* NULL is a no-op */
/* Grow-only (kit_reserve.c): *buffer holds at least `need` bytes after AP_OK; a smaller one is
 * freed first (cudaFree waits for the kernels still reading it) and `need` allocated; on failure
 * none is left (*bytes 0). */
ap_status ap_kit_device_reserve(void **buffer, size_t *bytes, size_t need, const char *who,
                                ap_msgbuf *msg);
ap_status ap_kit_pinned_alloc(size_t bytes, void **out, const char *who, ap_msgbuf *msg);
void ap_kit_pinned_free(void *ptr); /* NULL is a no-op */
/* An asynchronous host-to-device copy on `stream`; `what` names it in a failure. */
ap_status ap_kit_copy_to_device(void *dst, const void *src, size_t bytes, void *stream,
                                const char *who, const char *what, ap_msgbuf *msg);
ap_status ap_kit_event_create(void **out, const char *who, ap_msgbuf *msg);
void ap_kit_event_destroy(void *event); /* NULL is a no-op */
ap_status ap_kit_event_record(void *event, void *stream, const char *who, ap_msgbuf *msg);
/* Blocks the host until the event has passed. */
ap_status ap_kit_event_wait(void *event, const char *who, ap_msgbuf *msg);

/* ---------------------------------------------------------------------------------------------
 * The build's GPU targets (kit_host.c): meson's cuda-archs list, passed as AP_CUDA_ARCHS
 * ("90a,90,ptx90"), as the caps' arch table. "90a" is sm_90a SASS, "90" sm_90 SASS and "ptx90"
 * compute_90 PTX: the spelling meson turns into -gencode, so caps name exactly what was built.
 * ------------------------------------------------------------------------------------------- */

/* The table (parsed once, thread-safe) and its length. */
size_t ap_kit_cuda_archs(const ap_arch_target **out);

/* ---------------------------------------------------------------------------------------------
 * Options and the device (kit_host.c), for validate()
 * ------------------------------------------------------------------------------------------- */

/* The value of backend option `key` (the last one given), or NULL when absent. */
const char *ap_kit_option(const ap_options *options, const char *key);

/* One backend option a validate() accepts: its key, and its values either as a '|' list
 * ("auto|off") or by a check (`valid`, then `expect` says what it wants, "1..16"). */
typedef struct ap_kit_option_rule {
    const char *key;
    const char *values;              /* "a|b|c", or NULL with `valid` */
    int (*valid)(const char *value); /* 1: accepted */
    const char *expect;              /* with `valid`: "1..16" */
} ap_kit_option_rule;

/* Checks every extra option against the rules: adds "who: option KEY is 'V', not a or b" for a
 * value outside its rule and "who: unknown option 'K' (known: a, b)" for a key without one.
 * Returns 1 when any was refused. (The ap_options struct_size is the caller's to check.) */
int ap_kit_options_refuse(const ap_options *options, const ap_kit_option_rule *rules,
                          size_t num_rules, const char *who, ap_msgbuf *reasons);

/* The model a validate() may read at all: given, and a struct of this ABI's size. AP_OK, or
 * AP_ERR_INVALID_ARGUMENT (NULL) / AP_ERR_REFUSED (an older ABI's model) with the reason. */
ap_status ap_kit_model_readable(const ap_model *model, const char *who, ap_msgbuf *reasons);

/* The model's batch limits a backend sizes its buffers by: 1..2^max_batch_log2 sequences and
 * 1..2^max_tokens_log2 new tokens. Adds one reason and returns 1 when they are out of range. */
int ap_kit_model_limits_refuse(const ap_model *model, int32_t max_batch_log2,
                               int32_t max_tokens_log2, const char *who, ap_msgbuf *reasons);

/* The device checks every CUDA backend makes: a usable GPU of compute capability >= min_major.0
 * with SMs. Adds one reason per failure and returns 1 when it refuses, else 0. */
int ap_kit_device_refuses(const ap_device *device, int32_t min_major, const char *who,
                          ap_msgbuf *reasons);

/* ---------------------------------------------------------------------------------------------
 * Tensors and the cache (kit_host.c)
 * ------------------------------------------------------------------------------------------- */

/* The first element of a DLTensor. */
static inline void *ap_kit_data(const DLTensor *t) {
    return (char *)t->data + t->byte_offset;
}

/* AP_OK when t is NULL or its first element is `alignment`-byte aligned, else AP_ERR_UNSUPPORTED
 * with a message naming the tensor (the core checks shapes, dtypes and density, not this). */
ap_status ap_kit_aligned(const DLTensor *t, const char *what, size_t alignment, const char *who,
                         ap_msgbuf *msg);

/* get_kv_spec for an NHD cache of the model's kv_dtype: a page of K holds page_size x
 * num_kv_heads x head_dim_qk elements, one of V head_dim_v; nvfp4 adds one block-scale byte per
 * 16 values (plugin_api.h); bases `alignment`-byte aligned. */
ap_status ap_kit_kv_spec_nhd(const ap_model *model, size_t alignment, ap_kv_spec *out,
                             const char *who, ap_msgbuf *msg);

/* ---------------------------------------------------------------------------------------------
 * The batch, from its host mirrors (kit_batch.c), for a plan that indexes by it
 * ------------------------------------------------------------------------------------------- */

/* The batch rules of plugin_api.h's promise that a plan's indexing depends on, checked once more
 * from the host mirrors: the core checks them before init_metadata, but a third-party core may
 * not, and a plan that trusted a wrapped indptr would write outside its arrays. Checks the mode,
 * the counts against the model's max_batch and max_tokens, that every array and mirror is set,
 * both indptrs (from 0 to their totals, never decreasing: compared before subtracting, so int32
 * wrap cannot pass), per sequence 0 <= q_len <= seq_len (exactly 1 in decode) and
 * seq_len == (pages - 1) * page_size + last_page_len with pages >= 1 (no sequence without a
 * page), and every page index >= 0 with its slots below 2^31. *max_page receives the largest
 * page index. Returns AP_ERR_INVALID_ARGUMENT or AP_ERR_SHAPE_MISMATCH with a message naming the
 * sequence or the entry. */
ap_status ap_kit_batch_check(const ap_batch *batch, const ap_model *model, int32_t *max_page,
                             const char *who, ap_msgbuf *msg);

/* 1 when no sequence of a paged batch holds keys before its new tokens (from its host mirrors
 * qo_indptr_host, kv_page_indptr_host, kv_last_page_len_host; 0 when one is missing). */
int32_t ap_kit_batch_fresh(const ap_batch *batch, int32_t page_size);

/* The K/V type a prefill plan over the model's paged cache names for the kernel (the plan args'
 * kv_dtype): an nvfp4 or fp8_e4m3 cache is staged to the query's 16-bit type (the stager, below),
 * so the plan can be the Hopper kernel's; any other cache is read as stored. An fp8 cache is
 * staged only where the plan then is the Hopper kernel's and the staging buffer can be had
 * (ap_kit_stage_reserve); otherwise the mma.sync kernel reads it as stored. Staging pays at
 * every chunk measured: 4 to 4096 new tokens over 8192 cached, 1.6-2.1x faster than the mma.sync
 * kernel over fp8 (H200, bench/results/2026-11-28-h200-b.md). */
ap_dtype ap_kit_staged_kv_dtype(const ap_model *m);

/* ---------------------------------------------------------------------------------------------
 * The batch plan buffer (kit_plan_buffer.c): a plan is written in pinned host memory and moved to
 * the device in one copy per batch, shared by every layer. The next plan waits until the last
 * copy has left the host buffer.
 * ------------------------------------------------------------------------------------------- */

typedef struct ap_kit_plan_buffer {
    void *host; /* pinned, `bytes` */
    void *dev;  /* device, `bytes` */
    size_t bytes;
    void *copied;     /* event: the last copy out of `host` has finished */
    int copy_pending; /* 1 while a recorded copy may still read `host` */
    /* device, two int32 past `bytes` (16-byte aligned), 0 from the allocation on and never
     * uploaded over: the Hopper prefill's dynamic schedule (prefill.h, tile_counters), whose
     * launches leave them at 0 */
    int32_t *tile_counters;
    /* device, `split_bytes`, or NULL: the split-KV workspace of the Hopper prefill's split plans
     * (prefill.h, ap_kit_prefill_plan.splits), grown by the plan (ap_kit_device_reserve) */
    void *split;
    size_t split_bytes;
} ap_kit_plan_buffer;

/* Allocates `bytes` of each side (the device side 16 bytes more, tile_counters at 0) and the
 * event; on failure the buffer is left for _free. */
ap_status ap_kit_plan_buffer_alloc(ap_kit_plan_buffer *buffer, size_t bytes, const char *who,
                                   ap_msgbuf *msg);
/* Waits for a pending copy, then frees everything (the device must be current). */
void ap_kit_plan_buffer_free(ap_kit_plan_buffer *buffer);
/* Waits until the host side may be rewritten: call before writing a new plan. */
ap_status ap_kit_plan_buffer_begin(ap_kit_plan_buffer *buffer, const char *who, ap_msgbuf *msg);
/* Copies the first `bytes` of the host side to the device on `stream`: the batch's one upload. */
ap_status ap_kit_plan_buffer_upload(ap_kit_plan_buffer *buffer, size_t bytes, void *stream,
                                    const char *who, ap_msgbuf *msg);

/* ---------------------------------------------------------------------------------------------
 * The merge of partial attention states (merge_states.cu): pairs (sequence, KV head) whose KV
 * was cut over several workers each left partials (o_p normalised, lse2_p base-2 log-sum-exp of
 * the scaled logits, softmax_state.cuh); one launch combines them into the output rows and LSE.
 * ------------------------------------------------------------------------------------------- */

/* One pair cut into several parts: its partials are [first_partial, end_partial). */
typedef struct ap_kit_merge {
    int32_t seq;
    int32_t kv_head;
    int32_t first_partial;
    int32_t end_partial;
} ap_kit_merge;

typedef struct ap_kit_merge_args {
    const ap_kit_merge *merges; /* device [num_merges] */
    int32_t num_merges;         /* 0: nothing to do */
    const float *partial_out;   /* device [partials][group][head_dim] */
    const float *partial_lse;   /* device [partials][group] */
    ap_dtype out_dtype;         /* BF16 or F16 */
    int32_t group;              /* query heads per KV head */
    int32_t head_dim;           /* a multiple of 4, at most 512 */
    int32_t num_qo_heads;
    void *out;  /* [tokens][num_qo_heads][head_dim]: row seq, head kv_head * group + h */
    float *lse; /* [tokens][num_qo_heads] natural log, or NULL */
} ap_kit_merge_args;

ap_status ap_kit_merge_states_run(const ap_kit_merge_args *args, void *stream, const char *who,
                                  ap_msgbuf *msg);

/* The merge of the Hopper prefill's split-KV partials (a split plan's workspace): row (token t,
 * head h) of out and lse from its `parts` partials, part s at row (t x parts + s) x heads + h of
 * partial_out [tokens][parts][heads][width] (each normalised by its own sum, in out's dtype) and
 * partial_lse (natural log; -inf: a part with no key, weight 0). A row with no key anywhere gets
 * 0 and -inf, as the unsplit kernel writes it. */
typedef struct ap_kit_merge_rows_args {
    const void *partial_out;
    const float *partial_lse;
    int32_t tokens;
    int32_t heads;
    int32_t parts;
    int32_t width;      /* a multiple of 8, at most 1024 */
    ap_dtype out_dtype; /* BF16 or F16 */
    void *out;          /* [tokens][heads][width] */
    float *lse;         /* [tokens][heads], or NULL */
} ap_kit_merge_rows_args;

ap_status ap_kit_merge_rows_run(const ap_kit_merge_rows_args *args, void *stream, const char *who,
                                ap_msgbuf *msg);

/* ---------------------------------------------------------------------------------------------
 * The KV append (append_rope.cu): one kernel family writes new tokens' K and V into their slots
 * of an NHD cache, with RoPE on q and k first when asked (the append_kv/1 hook). The cache
 * element is the float32 value (rotated, for k) converted once: bf16/f16 round to nearest even;
 * fp8 e4m3 stores sat(x / scale) with a true division (host_numeric.h's ap_float_to_fp8_e4m3);
 * nvfp4 quantizes each block of 16 values with `scale` as the global scale, the very code of
 * backends/numeric/nvfp4_host.h, values and block scales into their pages. Byte-exact with
 * cpu_ref.
 * ------------------------------------------------------------------------------------------- */

typedef struct ap_kit_append_rope_args {
    const void *q; /* [num_tokens][num_qo_heads][head_dim] of in_dtype, or NULL: no q */
    void *q_out;   /* q's strides; may alias q */
    const void *k; /* [num_tokens][num_kv_heads][head_dim] of in_dtype */
    const void *v; /*   likewise; rows dense and 16-byte aligned, strides below */
    int64_t q_stride_token, q_stride_head; /* in elements, multiples of 8 */
    int64_t k_stride_token, k_stride_head;
    int64_t v_stride_token, v_stride_head;
    ap_dtype in_dtype; /* BF16 or F16 */
    void *k_pages;     /* NHD cache of kv_dtype, 16-byte aligned */
    void *v_pages;
    void *k_block_scales; /* nvfp4: [slot][head][head_dim / 16] e4m3 bytes, else NULL */
    void *v_block_scales;
    ap_dtype kv_dtype;      /* BF16, F16, FP8_E4M3 or NVFP4 */
    const int32_t *out_loc; /* device: token t's slot at out_loc[t * out_loc_stride]; a token */
    int64_t out_loc_stride; /*   whose slot is < 0 or >= num_slots is left unwritten */
    int64_t num_slots;
    const int32_t *positions; /* device, read only with rotary_dim > 0; a position outside */
    int64_t positions_stride; /*   [0, max_position) leaves the token unwritten */
    const float *cos_sin;     /* [max_position][rotary_dim] (plugin_api.h's append_kv/1) */
    int32_t max_position;
    int32_t rotary_dim; /* 0: no RoPE (q must be NULL); else even, <= head_dim */
    int32_t is_neox;
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t head_dim; /* qk and v alike: a multiple of 8 up to 256 (nvfp4: of 16) */
    int64_t num_tokens;
    float k_scale; /* fp8: the divisor; nvfp4: the global scale; ignored for 16-bit caches */
    float v_scale;
} ap_kit_append_rope_args;

ap_status ap_kit_append_rope_run(const ap_kit_append_rope_args *args, void *stream, const char *who,
                                 ap_msgbuf *msg);

/* save_kv's append: the same kernel without RoPE, from the plan's slot list. */
typedef struct ap_kit_append_args {
    const void *k; /* [num_tokens][num_kv_heads][head_dim] of in_dtype, rows 16-byte */
    const void *v; /*   aligned; strides of the first two dims in elements below */
    int64_t k_stride_token, k_stride_head;
    int64_t v_stride_token, v_stride_head;
    ap_dtype in_dtype; /* BF16 or F16 */
    void *k_pages;     /* NHD cache of kv_dtype: [page][slot][head][head_dim] */
    void *v_pages;
    ap_dtype kv_dtype; /* BF16, F16, FP8_E4M3 or NVFP4 (as ap_kit_append_rope_args) */
    int32_t num_kv_heads;
    int32_t head_dim; /* a multiple of 8 (nvfp4: of 16) */
    float k_scale;
    float v_scale;
    const int32_t *slots; /* device [num_tokens]: page * page_size + offset; < 0 skips */
    int32_t num_tokens;
    void *k_block_scales; /* nvfp4 only, else NULL */
    void *v_block_scales;
} ap_kit_append_args;

ap_status ap_kit_paged_append_run(const ap_kit_append_args *args, void *stream, const char *who,
                                  ap_msgbuf *msg);

/* kit_append_entry.c: the ABI's cache writes on that kernel, for every MHA backend.
 * ap_kit_cache_aligned: the layer's pages (and nvfp4 block scales) 16-byte aligned, else
 * AP_ERR_UNSUPPORTED with the reason. ap_kit_append_kv: append_kv/1 whole (alignment, device,
 * arguments from the model, the layer's cache and the hook's tensors, one launch).
 * ap_kit_save_kv: forward's save_kv, args->k / v into the planned slots (num_tokens of them). */
ap_status ap_kit_cache_aligned(const ap_layer *layer, const char *who, ap_msgbuf *msg);
ap_status ap_kit_append_kv(const ap_model *model, int32_t device_ordinal, const ap_layer *layer,
                           const ap_append_kv_args *args, void *stream, const char *who,
                           ap_msgbuf *msg);
ap_status ap_kit_save_kv(const ap_model *model, const ap_layer *layer, const ap_forward_args *args,
                         const int32_t *slots, int32_t num_tokens, void *stream, const char *who,
                         ap_msgbuf *msg);

/* ---------------------------------------------------------------------------------------------
 * NVFP4 (and fp8) staging (nvfp4_stage.cu): the pages a batch reads, dequantized into a compact
 * 16-bit cache for kernels that read 16-bit K/V (the extends on the Hopper prefill kernel, whose
 * paged source takes 16-bit K/V only; an fp8 cache is staged only where that kernel runs).
 * Staged page j is cache page page_indices[j]; element = 16-bit(e2m1 * e4m3 * multiplier[kv]),
 * the product exact in float32 and one rounding to the 16-bit type (multiplier 1: exact, every
 * e2m1 * e4m3 is a bf16 and a half). K (kv 0) and V (kv 1) in one launch.
 * ------------------------------------------------------------------------------------------- */

typedef struct ap_kit_nvfp4_stage_args {
    const void *pages[2];        /* nvfp4 values [page][page_size][heads][head_dim / 2] */
    const void *block_scales[2]; /* [page][page_size][heads][head_dim / 16] */
    float multiplier[2];
    void *out[2];                /* [num_pages][page_size][heads][head_dim] of out_dtype */
    ap_dtype out_dtype;          /* BF16 or F16 */
    const int32_t *page_indices; /* device [num_pages] */
    int32_t *staged_indices;     /* device [num_pages]: receives 0 .. num_pages - 1, or NULL */
    int32_t num_pages;
    int32_t page_size;
    int32_t num_kv_heads;
    int32_t head_dim;  /* a multiple of 16 */
    ap_dtype in_dtype; /* FP8_E4M3: fp8 pages [page][page_size][heads][head_dim] (no block
                        * scales; element = 16-bit(e4m3 * multiplier[kv])); else nvfp4 */
} ap_kit_nvfp4_stage_args;

ap_status ap_kit_nvfp4_stage_run(const ap_kit_nvfp4_stage_args *args, void *stream, const char *who,
                                 ap_msgbuf *msg);

/* kit_nvfp4_extend.c: extend over an nvfp4 cache on the 16-bit prefill kernel, for any backend.
 * At init_metadata of an extend batch, _reserve sizes (grow-only) the device buffer for the
 * batch's `pages` (kv_page_indptr's total); per layer, _run dequantizes them, in the batch's
 * page-list order, into a compact cache of the query's type and fills `out`: a copy of the layer
 * whose cache is that copy (K exact with k_scale folded into sm_scale, V times v_scale) and the
 * page indices 0 .. pages - 1 to plan-read it with the batch's own kv_page_indptr. An fp8_e4m3
 * cache is staged the same way (no block scales; every e4m3 value is a bf16 and a half). */
typedef struct ap_kit_nvfp4_stager {
    void *buffer;
    size_t bytes;
    int32_t pages; /* of the reserved batch */
} ap_kit_nvfp4_stager;

typedef struct ap_kit_nvfp4_staged {
    ap_layer layer; /* layer.kv points at kv below: keep the struct where it is while used */
    ap_kv_cache kv;
    const int32_t *page_indices; /* device [pages] */
} ap_kit_nvfp4_staged;

size_t ap_kit_nvfp4_stage_bytes(const ap_model *model, int32_t pages);

/* After a prefill plan over the model's paged cache that named ap_kit_staged_kv_dtype(model):
 * whether the batch's `pages` are staged, *staged (an nvfp4 cache always; an fp8 one where
 * `plan_hopper`), with the stager reserved for them. An fp8 cache whose staging buffer cannot be
 * allocated is read as stored instead: *staged 0, *replan 1 (the caller plans the batch again
 * with kv_dtype fp8_e4m3, for the mma.sync kernel, as before fp8 was staged), AP_OK, and the
 * allocation's message taken back out of `msg`; a serving engine's memory, filled by its KV
 * pool, then costs speed, not the call. Any other failure is returned. */
ap_status ap_kit_stage_reserve(ap_kit_nvfp4_stager *stager, const ap_model *model, int32_t pages,
                               int32_t plan_hopper, int32_t *staged, int32_t *replan,
                               const char *who, ap_msgbuf *msg);
void ap_kit_nvfp4_stager_free(ap_kit_nvfp4_stager *stager);
ap_status ap_kit_nvfp4_stager_run(const ap_kit_nvfp4_stager *stager, const ap_model *model,
                                  const ap_layer *layer, const int32_t *page_indices, void *stream,
                                  ap_kit_nvfp4_staged *out, const char *who, ap_msgbuf *msg);

#ifdef __cplusplus
}
#endif

#endif /* AP_COMMON_KIT_H */
