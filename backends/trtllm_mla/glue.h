/* glue.h: what the C files of the trtllm_mla plugin share: the instance, the plan, the checks. */
#ifndef AP_MLA_GLUE_H
#define AP_MLA_GLUE_H

#include "backends/common/kit.h"
#include "backends/common/prefill.h"
#include "mla.h"

#define MLA_NAME "trtllm_mla"
#define MLA_MAX_SPLITS 256 /* KV splits per (sequence, row block) at most */

/* The batch last given to init_metadata. Nothing here comes from a host mirror: the kernels read
 * the batch's device arrays, so a planned call is capturable in a CUDA graph. */
typedef struct mla_plan {
    int ready;
    ap_forward_mode mode;
    int ragged; /* the batch names a ragged K/V source: MLA's MHA form (prefill.c) */
    int32_t num_seqs;
    int32_t num_tokens;
    int32_t max_q_len;
    int32_t num_splits;
    int32_t flat; /* decode.cu's kernels take the flat schedule (one row block per sequence):
                   * 1, or 2 with every share cut (option decode_schedule: cut); else 0 */
    const int32_t *qo_indptr;
    const int32_t *kv_page_indptr;
    const int32_t *kv_page_indices;
    const int32_t *seq_lens;
    /* ragged only: the kit's prefill work list, planned from the batch's host mirrors */
    const int32_t *kv_indptr;
    int32_t num_kv_tokens;
    ap_kit_prefill_plan prefill;
} mla_plan;

struct ap_backend {
    ap_model model; /* as validated; `name` not kept */
    int32_t device_ordinal;
    int32_t sm_count;
    int32_t split_kv; /* 0: option split_kv off */
    int32_t flat;     /* option decode_schedule: 1 flat (unset), 0 split, 2 cut */
    int32_t use_pdl;
    int32_t stages;     /* option decode_stages */
    float *partial_out; /* [2 * sm_count * 64][512]: split-KV partial states */
    float *partial_lse;
    ap_kit_plan_buffer prefill_buffer; /* the MHA-form prefill's work list (prefill.c) */
    mla_plan plan;
};

/* validate.c */
ap_status mla_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons);
int mla_option_split_kv(const ap_options *options);
int mla_option_flat(
    const ap_options *options); /* decode_schedule: 1 flat (unset), 0 split, 2 cut */
int mla_option_stages(const ap_options *options); /* decode_stages: 0 (unset), 2 or 3 */

/* tensor.c: DLTensor checks shared by the forwards and the hooks */
#define MLA_DATA(t) ((char *)(t)->data + (t)->byte_offset)
/* A tensor of `ndim` dims, dtype, on our GPU, the last dim dense; each other stride (elements) in
 * strides_out. `shape` entries < 0 match anything. With `vec` the base and every outer stride
 * keep 16-byte alignment (the kernels' vector accesses). */
ap_status mla_tensor_check(const DLTensor *t, const char *what, int ndim, const int64_t *shape,
                           ap_dtype dtype, int32_t ordinal, int vec, int64_t *strides_out,
                           ap_msgbuf *msg);
int mla_dl_dtype(DLDataType t, ap_dtype *out); /* 1 and the dtype for bf16, f16, f32, fp8 */
ap_status mla_layer_check(const ap_backend *b, const ap_layer *layer, ap_msgbuf *msg);

/* forward.c */
ap_status mla_forward_decode(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg);
ap_status mla_forward_extend(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg);

/* prefill.c: MLA's MHA-form prefill over the ragged K/V source, on the kit's prefill kernel */
ap_status mla_prefill_alloc(ap_backend *b, ap_msgbuf *msg);
void mla_prefill_free(ap_backend *b);
ap_status mla_prefill_plan(ap_backend *b, const ap_batch *batch, void *stream, ap_msgbuf *msg);
ap_status mla_prefill_forward(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                              void *stream, ap_msgbuf *msg);

/* hooks.c */
ap_status mla_hook_append_kv(ap_backend *b, const ap_layer *layer, const ap_append_kv_args *args,
                             void *stream, ap_msgbuf *msg);
ap_status mla_hook_pack(ap_backend *b, const ap_pack_kv_args *args, void *stream, ap_msgbuf *msg);
ap_status mla_hook_merge_state(ap_backend *b, const ap_merge_state_args *args, void *stream,
                               ap_msgbuf *msg);
ap_status mla_hook_cuda_graph(ap_backend *b, int32_t max_batch, void *stream, ap_msgbuf *msg);

#endif /* AP_MLA_GLUE_H */
