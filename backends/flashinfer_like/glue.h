/* glue.h: what the C files of the flashinfer_like plugin share: the instance and the batch plan. */
#ifndef AP_FIL_GLUE_H
#define AP_FIL_GLUE_H

#include "extend.h"
#include "fil.h"

#define FIL_DECODE_MIN_TILES 8 /* fewest KV tiles a decode worker gets when splitting */

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
    ap_kit_nvfp4_stager stage;
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

/* extend_nvfp4.c: extend over a staged cache (nvfp4, or fp8 on the Hopper kernel). _reserve
 * (init_metadata) sizes the staging buffer for an extend batch's pages, or sets *replan where an
 * fp8 cache cannot be staged for want of memory (the caller plans it again for the mma.sync
 * kernel); _run dequantizes the pages into it (K exact, V times its scale, one rounding to the
 * query's 16-bit type) and runs the 16-bit extend over it with the K scale in the softmax scale.
 * _free releases the buffer. */
ap_status fil_extend_nvfp4_reserve(ap_backend *backend, const ap_batch *batch, int32_t *replan,
                                   ap_msgbuf *msg);
ap_status fil_extend_nvfp4_run(ap_backend *backend, const ap_layer *layer,
                               const ap_forward_args *args, void *stream, ap_msgbuf *msg);
void fil_extend_nvfp4_free(ap_backend *backend);

/* validate.c */
ap_status fil_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons);
int fil_option_split_kv(const ap_options *options); /* 1 unless split_kv: off */
/* decode_warps_per_sm, default 4 (nvfp4: 16, capped by the occupancy) */
int32_t fil_option_warps_per_sm(const ap_options *options, ap_dtype kv_dtype);

#endif /* AP_FIL_GLUE_H */
