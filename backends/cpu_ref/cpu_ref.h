/* cpu_ref.h: what the files of the cpu_ref plugin share: the instance, the batch plan, helpers. */
#ifndef AP_CPU_REF_H
#define AP_CPU_REF_H

#include "plugin_api.h"

/* The batch of the last init_metadata, copied from the host mirrors so the forward calls need
 * no pointer into the caller's ap_batch. */
typedef struct cpu_plan {
    int ready; /* 1 after a successful init_metadata */
    ap_forward_mode mode;
    int32_t num_seqs;
    int32_t num_tokens;
    int32_t num_pages_total;
    int has_pages;            /* 0: an embedding batch without page arrays */
    int32_t *qo_indptr;       /* [num_seqs + 1] */
    int32_t *seq_lens;        /* [num_seqs] */
    int32_t *kv_page_indptr;  /* [num_seqs + 1], NULL without pages */
    int32_t *kv_page_indices; /* [num_pages_total], NULL without pages */
    int ragged;               /* 1: ABI 1.1's ragged K/V source (batch.kv_indptr) is set */
    int32_t kv_causal;        /* with `ragged`: 1 causal aligned to the end, 0 no mask */
    int32_t num_kv_tokens;    /* with `ragged`: kv_indptr[num_seqs] */
    int32_t *kv_indptr;       /* [num_seqs + 1] with `ragged`, else NULL */
} cpu_plan;

struct ap_backend {
    ap_model model; /* the model as validated; `name` is not kept (NULL) */
    cpu_plan plan;
};

/* A DLTensor seen as up to 4 dims of one element type, strides in elements. */
#define CPU_VIEW_MAX_DIMS 4
typedef enum cpu_elem {
    CPU_ELEM_F32,
    CPU_ELEM_BF16,
    CPU_ELEM_F16,
    CPU_ELEM_FP8_E4M3,
    CPU_ELEM_FP8_E5M2,
    CPU_ELEM_I32
} cpu_elem;

typedef struct cpu_view {
    char *base; /* data + byte_offset */
    cpu_elem elem;
    int ndim;
    int64_t shape[CPU_VIEW_MAX_DIMS];
    int64_t stride[CPU_VIEW_MAX_DIMS];
} cpu_view;

/* tensor.c */
ap_status cpu_view_make(const DLTensor *tensor, const char *what, cpu_view *out, ap_msgbuf *msg);
ap_status cpu_view_expect(const cpu_view *view, const char *what, int ndim, const int64_t *shape,
                          ap_msgbuf *msg);
int cpu_elem_is_float_activation(cpu_elem elem); /* f32, bf16 or f16 */
int cpu_elem_is_fp8(cpu_elem elem);
const char *cpu_elem_name(cpu_elem elem);
float cpu_view_get(const cpu_view *view, const int64_t *index);
void cpu_view_set(const cpu_view *view, const int64_t *index, float value);
int32_t cpu_view_get_i32(const cpu_view *view, int64_t i);

/* kv_store.c */
size_t cpu_kv_elem_bytes(ap_dtype dtype);
float cpu_kv_effective_scale(ap_dtype dtype, float scale);
ap_status cpu_kv_check(const ap_model *model, const ap_layer *layer, ap_msgbuf *msg);
ap_status cpu_kv_check_pages(const cpu_plan *plan, const ap_kv_cache *kv, ap_msgbuf *msg);
int64_t cpu_kv_slot_of(const cpu_plan *plan, const ap_kv_cache *kv, int32_t seq, int32_t pos);
void *cpu_kv_k_row(const ap_kv_cache *kv, int64_t slot, int32_t head);
void *cpu_kv_v_row(const ap_kv_cache *kv, int64_t slot, int32_t head);
void cpu_kv_store_row(ap_dtype dtype, void *row, const float *values, int32_t dim, float scale);
void cpu_kv_load_row(ap_dtype dtype, const void *row, float *values, int32_t dim);

/* validate.c: the dtypes cpu_ref serves, also published in its caps */
#define CPU_Q_DTYPES \
    (AP_DTYPE_BIT(AP_DTYPE_F32) | AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16))
#define CPU_KV_DTYPES \
    (AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16) | AP_DTYPE_BIT(AP_DTYPE_FP8_E4M3) | \
     AP_DTYPE_BIT(AP_DTYPE_FP8_E5M2))
ap_status cpu_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons);

/* plan.c */
ap_status cpu_plan_init(ap_backend *backend, const ap_batch *batch, ap_msgbuf *msg);
void cpu_plan_free(cpu_plan *plan);

/* attention.c */
ap_status cpu_forward(ap_backend *backend, const ap_layer *layer, const ap_forward_args *args,
                      ap_forward_mode mode, ap_msgbuf *msg);

/* rope.c, pack.c and merge.c: the hooks */
ap_status cpu_hook_append_kv(ap_backend *backend, const ap_layer *layer,
                             const ap_append_kv_args *args, void *stream, ap_msgbuf *msg);
ap_status cpu_hook_pack_prefix_chunk_kv(ap_backend *backend, const ap_pack_kv_args *args,
                                        void *stream, ap_msgbuf *msg);
ap_status cpu_hook_merge_state(ap_backend *backend, const ap_merge_state_args *args, void *stream,
                               ap_msgbuf *msg);

#endif /* AP_CPU_REF_H */
