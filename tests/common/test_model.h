/* test_model.h: the one model the tests start from: a small Llama-like GQA model. */
#ifndef AP_TEST_MODEL_H
#define AP_TEST_MODEL_H

#include "plugin_api.h"

/* MHA with the given heads, head dims and dtypes; page size 16, 2 layers, causal, at most 4
 * sequences, 64 new tokens and 1024 tokens a sequence. A test changes the fields its case is
 * about after the call. */
static inline ap_model ap_test_model(const char *name, int32_t num_qo_heads, int32_t num_kv_heads,
                                     int32_t head_dim_qk, int32_t head_dim_v, ap_dtype dtype,
                                     ap_dtype kv_dtype) {
    return (ap_model){.struct_size = sizeof(ap_model),
                      .name = name,
                      .kind = AP_ATTN_MHA,
                      .num_qo_heads = num_qo_heads,
                      .num_kv_heads = num_kv_heads,
                      .head_dim_qk = head_dim_qk,
                      .head_dim_v = head_dim_v,
                      .dtype = dtype,
                      .kv_dtype = kv_dtype,
                      .page_size = 16,
                      .num_layers = 2,
                      .causal = 1,
                      .max_batch = 4,
                      .max_tokens = 64,
                      .max_kv_len = 1024};
}

#endif /* AP_TEST_MODEL_H */
