/* glue.h: what the C files of the trtllm_mha plugin share: the instance, the plan, the checks. */
#ifndef AP_MHA_GLUE_H
#define AP_MHA_GLUE_H

#include "backends/common/kit.h"
#include "backends/common/prefill.h"
#include "mha.h"

/* The batch last given to init_metadata. A decode batch (or an extend of 1..8 new tokens per
 * sequence) keeps only the batch's scalars and device arrays, and its slots are computed by a
 * kernel: nothing comes from a host mirror, so the calls after it are capturable. A longer
 * extend (prefill) runs the kit's prefill kernel, planned from the host mirrors. */
typedef struct mha_plan {
    int ready;
    ap_forward_mode mode;
    int prefill;    /* max_q_len > MHA_MAX_Q_LEN: the kit's prefill kernel */
    int32_t staged; /* prefill over a copy staged to 16 bits: nvfp4, or fp8 on the Hopper kernel */
    int32_t fresh;  /* prefill: no sequence holds keys before its new tokens (ap_kit_batch_fresh) */
    int32_t num_seqs;
    int32_t num_tokens;
    int32_t max_q_len;
    int32_t num_splits;
    int32_t flat_ctas; /* the flat schedule's grid (one wave), or 0: the split grid */
    const int32_t *qo_indptr;
    const int32_t *kv_page_indptr;
    const int32_t *kv_page_indices;
    const int32_t *kv_last_page_len;
    const int32_t *seq_lens;
    ap_kit_prefill_plan prefill_plan;
} mha_plan;

struct ap_backend {
    ap_model model; /* as validated; `name` not kept */
    int32_t device_ordinal;
    int32_t sm_count;
    int32_t split_kv;     /* 0: option split_kv off */
    int32_t keys_m;       /* MHA_KEYS_M_*: option nvfp4_keys_m */
    int32_t schedule;     /* MHA_SCHEDULE_*: option decode_schedule */
    int32_t short_extend; /* MHA_SHORT_EXTEND_*: option short_extend */
    int32_t wave_slots;   /* decode CTAs resident at once: occupancy x sm_count */
    int32_t flat_slots;   /* the same for the flat kernel (q_len 1); 0: none, or not option flat */
    float *partial_out;   /* [max(MHA_SPLIT_WAVES * wave_slots, 2 * flat_slots)][MHA_BLOCK_ROWS]
                             [head_dim] */
    float *partial_lse;
    int32_t *slots;                    /* [max_tokens]: the new tokens' cache slots */
    ap_kit_plan_buffer prefill_buffer; /* the kit prefill's work list, bytes 0 when not served */
    ap_kit_nvfp4_stager stage;         /* nvfp4 prefill: the batch's pages staged as 16-bit */
    mha_plan plan;
};

/* validate.c */
ap_status mha_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons);
/* 1 unless the auto | off option `key` (split_kv, nvfp4_keys_m) is off. */
int mha_option_auto(const ap_options *options, const char *key);
/* Option nvfp4_keys_m as MHA_KEYS_M_OFF / AUTO / V1 / V2 (validated: anything else refused). */
int32_t mha_option_keys_m(const ap_options *options);
/* Option decode_schedule as MHA_SCHEDULE_SPLIT (auto, split) or MHA_SCHEDULE_FLAT. */
int32_t mha_option_schedule(const ap_options *options);
/* Option short_extend as MHA_SHORT_EXTEND_AUTO (auto), _DECODE or _PREFILL. */
int32_t mha_option_short_extend(const ap_options *options);
/* 1 when the kit's prefill kernel serves this model's long extends (dtypes, group <= 8). */
int mha_prefill_served(const ap_model *model);

/* forward.c */
ap_status mha_init_metadata(ap_backend *b, const ap_batch *batch, void *stream, ap_msgbuf *msg);
ap_status mha_forward_decode(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg);
ap_status mha_forward_extend(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg);

/* hooks.c */
ap_status mha_hook_append_kv(ap_backend *b, const ap_layer *layer, const ap_append_kv_args *args,
                             void *stream, ap_msgbuf *msg);
ap_status mha_hook_cuda_graph(ap_backend *b, int32_t max_batch, void *stream, ap_msgbuf *msg);

#endif /* AP_MHA_GLUE_H */
