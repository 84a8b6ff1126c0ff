/* glue.h: what the C files of the flashinfer_like plugin share: the instance and the batch plan. */
#ifndef AP_FIL_GLUE_H
#define AP_FIL_GLUE_H

#include "extend.h"
#include "fil.h"

#define FIL_DECODE_MIN_TILES 8 /* fewest KV tiles a decode worker gets when splitting */

/* The plan of the batch last given to init_metadata. Device arrays live in the instance's plan
 * buffer; the batch's own device arrays are borrowed until the next init_metadata. */
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
    const int32_t *slots;   /* device [num_tokens]: cache slot of each new token */
    fil_decode_plan decode; /* mode DECODE */
    fil_extend_plan extend; /* mode EXTEND */
} fil_batch_plan;

struct ap_backend {
    ap_model model; /* as validated; `name` not kept */
    int32_t device_ordinal;
    int32_t group;          /* query heads per KV head */
    int32_t split_kv;       /* 1: decode splits long sequences over several warps */
    int32_t max_workers;    /* decode warps resident at once on the whole GPU */
    int32_t target_workers; /* decode warps the split aims for (decode_warps_per_sm * SMs) */
    ap_kit_plan_buffer plan_buffer; /* the batch plan (decode split, slots, extend items): one
                                    * copy per batch */
    /* decode partial states */
    float *partial_out;
    float *partial_lse;
    fil_batch_plan plan;
    /* nvfp4 extend (extend_nvfp4.c): the batch's pages staged as 16-bit K and V, then indices */
    void *stage;
    size_t stage_bytes;
    int32_t stage_pages; /* pages of the planned batch (kv_page_indptr's total) */
};

/* plan.c */
size_t fil_plan_capacity(const ap_model *model, int32_t max_workers);
ap_status fil_plan_batch(ap_backend *backend, const ap_batch *batch, void *stream, ap_msgbuf *msg);

/* forward.c: the vtable's forward entries and the append_kv/1 hook (NULL instance included) */
ap_status fil_forward_decode(ap_backend *backend, const ap_layer *layer,
                             const ap_forward_args *args, void *stream, ap_msgbuf *msg);
ap_status fil_forward_extend(ap_backend *backend, const ap_layer *layer,
                             const ap_forward_args *args, void *stream, ap_msgbuf *msg);
/* The append_kv/1 hook: checks what the kernel relies on, then one fused launch. */
ap_status fil_append_kv(ap_backend *backend, const ap_layer *layer, const ap_append_kv_args *args,
                        void *stream, ap_msgbuf *msg);

/* The KV dtype decode's workspace is sized for: nvfp4 as fp8 until decode reads nvfp4 (until
 * then an nvfp4 model that passed validate() never decodes). */
static inline ap_dtype fil_decode_kv_dtype(const ap_model *m) {
    return m->kv_dtype == AP_DTYPE_NVFP4 && !FIL_NVFP4_DECODE ? AP_DTYPE_FP8_E4M3 : m->kv_dtype;
}

/* The layer's pages are read 16 bytes at a time (forward.c). */
ap_status fil_cache_aligned(const ap_layer *layer, ap_msgbuf *msg);

/* extend_nvfp4.c: extend over an nvfp4 cache. _reserve (init_metadata of an extend batch) sizes
 * the staging buffer for the batch's pages; _run dequantizes them into it (K exact, V times its
 * global scale, one rounding to the query's 16-bit type) and runs the 16-bit extend over it with
 * the K scale in the softmax scale. _free releases the buffer. */
ap_status fil_extend_nvfp4_reserve(ap_backend *backend, const ap_batch *batch, ap_msgbuf *msg);
ap_status fil_extend_nvfp4_run(ap_backend *backend, const ap_layer *layer,
                               const fil_attn_params *params, void *stream, ap_msgbuf *msg);
void fil_extend_nvfp4_free(ap_backend *backend);

/* validate.c */
ap_status fil_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons);
int fil_option_split_kv(const ap_options *options);         /* 1 unless split_kv: off */
int32_t fil_option_warps_per_sm(const ap_options *options); /* decode_warps_per_sm, default 4 */

#endif /* AP_FIL_GLUE_H */
