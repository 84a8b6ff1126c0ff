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

/* DeepSeek-V3's MLA widths: one latent KV head of kv_lora_rank 512 + rope 64 (576, V its first
 * 512), qk_nope 128 and v 128 for the MHA form of chunked prefill; bf16, pages of 64, causal,
 * `num_qo_heads` per GPU (128, or 16 at tensor parallelism 8). 61 layers, at most 256 sequences,
 * 16384 new tokens and 163840 tokens a sequence. */
static inline ap_model ap_test_mla_model(const char *name, int32_t num_qo_heads) {
    return (ap_model){.struct_size = sizeof(ap_model),
                      .name = name,
                      .kind = AP_ATTN_MLA,
                      .num_qo_heads = num_qo_heads,
                      .num_kv_heads = 1,
                      .head_dim_qk = 576,
                      .head_dim_v = 512,
                      .kv_lora_rank = 512,
                      .qk_rope_head_dim = 64,
                      .qk_nope_head_dim = 128,
                      .v_head_dim = 128,
                      .dtype = AP_DTYPE_BF16,
                      .kv_dtype = AP_DTYPE_BF16,
                      .page_size = 64,
                      .num_layers = 61,
                      .causal = 1,
                      .max_batch = 256,
                      .max_tokens = 16384,
                      .max_kv_len = 163840};
}

#endif /* AP_TEST_MODEL_H */
