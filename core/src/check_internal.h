/* check_internal.h: the tensor and layer checks shared by check.c and check_hooks.c. */
#ifndef ATTNPLUG_CHECK_INTERNAL_H
#define ATTNPLUG_CHECK_INTERNAL_H

#include "internal.h"

#define AP_ANY (-1) /* a dimension the check leaves free */

#define AP_DL_INT32 ((DLDataType){kDLInt, 32, 1})
#define AP_DL_FLOAT32 ((DLDataType){kDLFloat, 32, 1})
#define AP_DL_FP8_OUT ((DLDataType){AP_DL_FLOAT8_E4M3FN, 8, 1}) /* uint8 is accepted too */

/* Outputs and most forward inputs are dense; MLA's q_nope/q_rope are read where they are, rows
 * dense but the rows strided (slices of a wider projection); the pack hook's inputs may have any
 * (non-negative) strides. */
typedef enum ap_layout { AP_DENSE, AP_ROWS, AP_STRIDED } ap_layout;

/* Add one line to `msg` and return `status`: checks read `return ap_check_fail(msg, S, ...)`. */
ap_status ap_check_fail(ap_msgbuf *msg, ap_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The DLPack type of an activation dtype (bf16, f16, f32); one that matches nothing otherwise. */
DLDataType ap_dl_of(ap_dtype dtype);

/* kDLCUDA when the instance runs on a GPU, kDLCPU when its backend serves on the CPU. */
int ap_expected_device_type(const ap_instance *instance);

/* Rank, shape (AP_ANY leaves a dim free), dtype, device, data and strides of one tensor. */
ap_status ap_check_tensor(const ap_instance *instance, ap_msgbuf *msg, const char *name,
                          const DLTensor *t, int ndim, const int64_t *dims, DLDataType dtype,
                          ap_layout layout);
/* The same, with NULL an error (required) or a pass (optional). */
ap_status ap_check_required(const ap_instance *instance, ap_msgbuf *msg, const char *name,
                            const DLTensor *t, int ndim, const int64_t *dims, DLDataType dtype,
                            ap_layout layout);
ap_status ap_check_optional(const ap_instance *instance, ap_msgbuf *msg, const char *name,
                            const DLTensor *t, int ndim, const int64_t *dims, DLDataType dtype,
                            ap_layout layout);

/* Finite and > 0. */
int ap_scale_ok(float scale);

/* The layer's parameters and its KV cache against the model (and the planned batch's pages);
 * `kv_optional` lets layer->kv be NULL. */
ap_status ap_check_layer(const ap_instance *instance, const ap_layer *layer, int kv_optional,
                         ap_msgbuf *msg);

/* An embedding model on a backend that skips the KV cache needs no cache and no page arrays. */
int ap_skips_kv(const ap_instance *instance);

#endif /* ATTNPLUG_CHECK_INTERNAL_H */
