/* fav.h: what fa_varlen's C glue files say to each other: the instance, its plan, its limits. */
#ifndef AP_FA_VARLEN_FAV_H
#define AP_FA_VARLEN_FAV_H

#include <stddef.h>
#include <string.h>

#include "backends/common/kit.h"
#include "backends/common/prefill.h"

#define FAV_NAME "fa_varlen"

/* The limits, stated once: the caps, validate() and the plan read them. The kernel behind them
 * is the kit's prefill kernel (prefill.h), which serves these head dims over both sources. */
#define FAV_MAX_GROUP AP_KIT_PREFILL_MAX_GROUP
#define FAV_HEAD_DIMS_TEXT "64, 128 or 256 (qk = v)"
static inline int fav_head_dim_served(int32_t d) {
    return d == 64 || d == 128 || d == 256;
}

/* How the instance gets its keys (decided at create, from the model and the options). */
typedef enum fav_kv_mode {
    FAV_KV_CACHED = 0, /* the paged cache: save_kv writes the new tokens, attention reads it */
    FAV_KV_SKIP = 1    /* embedding skip-KV: no cache at all; keys are the raw k/v rows */
} fav_kv_mode;

/* The `fa_varlen.embedding_skip_kv` option. */
typedef enum fav_skip_option {
    FAV_SKIP_AUTO = 0, /* skip when the model is an embedding model and prefix caching is off */
    FAV_SKIP_ON = 1,   /* insist on it (validate refuses where it cannot hold) */
    FAV_SKIP_OFF = 2   /* always the cached path */
} fav_skip_option;

/* One batch's plan, shared by every layer. */
typedef enum fav_source {
    FAV_SOURCE_PAGED = 0, /* the cache's page table (new tokens written by save_kv first) */
    FAV_SOURCE_RAGGED = 1 /* rows of args k / v: ABI 1.1's kv_indptr, or skip-KV's qo_indptr */
} fav_source;

typedef struct fav_plan {
    int ready;
    ap_forward_mode mode;
    fav_source source;
    int skip_kv;           /* the ragged source is the new tokens' own k/v (no kv_indptr) */
    int has_pages;         /* the batch had page arrays: save_kv possible */
    int32_t num_tokens;    /* rows of q / out */
    int32_t num_kv_tokens; /* rows of k / v in the ragged source */
    int32_t max_page;      /* largest page index (paged source) */
    const int32_t *qo_indptr;
    const int32_t *kv_indptr; /* ragged: device rows of k / v per sequence */
    const int32_t *kv_page_indptr;
    const int32_t *kv_page_indices;
    const int32_t *kv_last_page_len;
    const int32_t *slots; /* device [num_tokens]: where save_kv writes each new token */
    ap_kit_prefill_plan prefill;
    int32_t staged; /* paged fp8 cache staged to 16 bits for the Hopper kernel (the kit's stager) */
} fav_plan;

struct ap_backend {
    ap_model model;
    int32_t device_ordinal;
    fav_kv_mode kv_mode;
    int rounds;                /* option schedule: rounds (no tile counters for the plan) */
    ap_kit_plan_buffer buffer; /* slots, then the prefill's work items: one upload per batch */
    size_t item_bytes;         /* the work items' capacity */
    ap_kit_nvfp4_stager stage; /* a paged fp8 batch's pages as 16 bits (fav_plan.staged) */
    fav_plan plan;
};

/* validate.c */
ap_status fav_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons);
fav_kv_mode fav_kv_mode_of(const ap_model *model, const ap_options *options);
int fav_option_rounds(const ap_options *options);

/* plan.c */
size_t fav_plan_item_bytes(const ap_model *m);
size_t fav_plan_buffer_bytes(const ap_model *m);
ap_status fav_init_metadata(ap_backend *b, const ap_batch *batch, void *stream, ap_msgbuf *msg);

/* forward.c */
ap_status fav_forward_extend(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg);
ap_status fav_forward_decode(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg);

#endif /* AP_FA_VARLEN_FAV_H */
