/* extend.h: flashinfer_like's extend (prefill): the kit's prefill kernel over the paged cache. */
#ifndef AP_FIL_EXTEND_H
#define AP_FIL_EXTEND_H

#include "backends/common/prefill.h"
#include "fil.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the extend kernel serves (fil_extend_check_config says so line by line):
 *   head dims 64, 128, 256 (qk == v); queries and outputs BF16 or F16; KV cache of the query
 *   type or FP8_E4M3 (dequantized on load); any page size >= 1 (powers of two are the fast
 *   case); any group size num_qo_heads / num_kv_heads from 1 to 8; causal or not; LSE optional.
 * Every new token's K/V must already be in the cache when fil_extend_run is called. */

/* The work list of one batch (the kit's prefill plan), shared by every layer. */
typedef ap_kit_prefill_plan fil_extend_plan;

/* Adds one line to `reasons` for every part of this configuration the kernel does not serve and
 * returns AP_ERR_UNSUPPORTED, or returns AP_OK. No GPU work: callable from validate(). */
ap_status fil_extend_check_config(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype,
                                  int32_t num_qo_heads, int32_t num_kv_heads, int32_t page_size,
                                  ap_msgbuf *reasons);

/* Bytes of host scratch and of device buffer (each) a plan needs for batches of at most
 * max_tokens new tokens over at most max_batch sequences. 0 for an unsupported shape. */
size_t fil_extend_plan_bytes(int32_t max_tokens, int32_t max_batch, int32_t head_dim,
                             int32_t num_qo_heads, int32_t num_kv_heads);

/* Builds the work list from the host mirrors of a batch that passed ap_kit_batch_check (kit.h)
 * and copies it to device_buffer on `stream` (a cudaStream_t or NULL); AP_ERR_UNSUPPORTED for a
 * sequence past the kernel's int32 positions. host_scratch may be reused as soon as this returns when it is pageable;
 * when it is pinned, only after `stream` has passed this point. */
ap_status fil_extend_plan_build(const ap_kit_prefill_plan_args *args, void *stream,
                                fil_extend_plan *plan, ap_msgbuf *msg);

/* Runs one layer of the planned extend batch on `stream` (plan->extend over the batch's device
 * arrays in plan). Returns AP_ERR_UNSUPPORTED for what fil_extend_check_config refuses,
 * AP_ERR_CUDA when the launch fails. */
ap_status fil_extend_run(const ap_model *model, const ap_layer *layer, const ap_forward_args *args,
                         const fil_batch_plan *plan, void *stream, ap_msgbuf *msg);

#ifdef __cplusplus
}
#endif

#endif /* AP_FIL_EXTEND_H */
