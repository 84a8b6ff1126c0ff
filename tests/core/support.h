/* support.h: helpers of the tests/core suite: fixture registry, models, devices, tensors, batches. */
#ifndef AP_TESTS_CORE_SUPPORT_H
#define AP_TESTS_CORE_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "attnplug.h"

/* Fail with both strings shown when `haystack` lacks `needle`. */
#define TC_ASSERT_HAS(haystack, needle) \
    do { \
        const char *tc_h = (haystack); \
        if (tc_h == NULL || strstr(tc_h, (needle)) == NULL) { \
            print_error("\"%s\"\n  does not contain \"%s\"\n", tc_h ? tc_h : "(null)", (needle)); \
            fail(); \
        } \
    } while (0)

/* A status and a substring of the last error, in one line. */
#define TC_ASSERT_FAILS(call, status, needle) \
    do { \
        ap_status tc_s = (call); \
        if (tc_s != (status)) \
            print_error("got %s (%s), expected %s\n", ap_status_name(tc_s), ap_last_error(), \
                        ap_status_name(status)); \
        assert_int_equal(tc_s, (status)); \
        TC_ASSERT_HAS(ap_last_error(), (needle)); \
    } while (0)

#define TC_ASSERT_OK(call) \
    do { \
        ap_status tc_s = (call); \
        if (tc_s != AP_OK) print_error("%s: %s\n", ap_status_name(tc_s), ap_last_error()); \
        assert_int_equal(tc_s, AP_OK); \
    } while (0)

#define TC_F32 ((DLDataType){kDLFloat, 32, 1})
#define TC_BF16 ((DLDataType){kDLBfloat, 16, 1})
#define TC_I32 ((DLDataType){kDLInt, 32, 1})
#define TC_U8 ((DLDataType){kDLUInt, 8, 1})
#define TC_FP8 ((DLDataType){AP_DL_FLOAT8_E4M3FN, 8, 1})

/* A registry holding only the fixture backends (folder from AP_TEST_CORE_FIXTURES). */
ap_registry *tc_registry_open(void);

/* MHA: f32 activations, bf16 cache, 4 query heads over 2 KV heads of 8, pages of 16, 2 layers,
 * up to 8 sequences and 64 tokens. */
ap_model tc_model_mha(const char *name);
/* MLA: f32 activations, bf16 latent cache of 16 + 8 (head_dim_qk 24, v 16), nope 12, v_head 10. */
ap_model tc_model_mla(const char *name);

ap_device tc_gpu(int32_t major, int32_t minor);
ap_device tc_cpu(const char *reason);

/* A host tensor with zeroed data; shape and strides live inside it. */
typedef struct tc_tensor {
    DLTensor t;
    int64_t shape[4];
    int64_t strides[4];
} tc_tensor;
void tc_tensor_init(tc_tensor *x, DLDataType dtype, int ndim, const int64_t *shape);
void tc_tensor_free(tc_tensor *x);
float tc_tensor_f32(const tc_tensor *x, size_t i);

/* A batch whose arrays live inside it (host mirrors and device arrays are the same memory).
 * Extend: 2 sequences, q_len 3 and 1, seq_len 5 and 17, pages {0} and {1, 2}, page size 16.
 * Decode: the same sequences, one new token each. */
typedef struct tc_batch {
    ap_batch b;
    int32_t qo[9], kv_indptr[9], kv_indices[16], last[8], seq_lens[8], positions[64];
} tc_batch;
void tc_batch_extend(tc_batch *x);
void tc_batch_decode(tc_batch *x);

/* A layer with a KV cache of `num_pages` pages matching the model (dummy page buffers). */
typedef struct tc_layer {
    ap_layer layer;
    ap_kv_cache kv;
} tc_layer;
void tc_layer_init(tc_layer *x, const ap_model *model, int32_t num_pages);

/* Forward tensors q, out, lse, k, v for `tokens` tokens of an MHA model. */
typedef struct tc_forward {
    ap_forward_args args;
    tc_tensor q, out, lse, k, v;
} tc_forward;
void tc_forward_init(tc_forward *x, const ap_model *model, int64_t tokens);
void tc_forward_free(tc_forward *x);

#endif /* AP_TESTS_CORE_SUPPORT_H */
