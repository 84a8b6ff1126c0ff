/* gpu_cases.c: the case table: a sweep over page sizes, head dims and dtypes, plus named cases. */
#include "gpu_cases.h"

#include <stdio.h>

#define GPU_BF16 AP_DTYPE_BF16
#define GPU_F16 AP_DTYPE_F16
#define GPU_FP8 AP_DTYPE_FP8_E4M3

/* Lengths that are multiples of nothing, a 1-token sequence and one of 5000. */
static const char GPU_DECODE_SEQS[] = "0:1,6:1,332:1,1030:1,4999:1";
/* An empty prefix, prefixes ending mid-page, a 1-token extend and chunks crossing pages. */
static const char GPU_EXTEND_SEQS[] = "0:7,519:129,13:1,100:77";

/* Positional rows for the table below: name, mode, q dtype, kv dtype, page size, head dim,
 * qo heads, kv heads, causal, save_kv, quick, batch; GPU_APPEND adds rotary dim and pairing. */
#define GPU_ATTN(name_, mode_, q_, kv_, page_, dim_, hq_, hk_, causal_, save_, quick_, seqs_) \
    { \
        .name = name_, .mode = mode_, .q_dtype = q_, .kv_dtype = kv_, .page_size = page_, \
        .head_dim = dim_, .num_qo_heads = hq_, .num_kv_heads = hk_, .causal = causal_, \
        .save_kv = save_, .quick = quick_, .seqs = seqs_ \
    }
#define GPU_APPEND(name_, mode_, q_, kv_, page_, dim_, hq_, hk_, quick_, seqs_, rotary_, neox_) \
    { \
        .name = name_, .mode = mode_, .q_dtype = q_, .kv_dtype = kv_, .page_size = page_, \
        .head_dim = dim_, .num_qo_heads = hq_, .num_kv_heads = hk_, .causal = 1, .save_kv = 1, \
        .quick = quick_, .seqs = seqs_, .rotary_dim = rotary_, .is_neox = neox_ \
    }

/* A case without the paged cache (gpu_ragged_run.c): name, source, q dtype, K/V dtype (fp8 or
 * the query's), qk and v head dims, qo / kv heads, causal, quick, batch ("prefix:new"; the
 * ragged source holds each sequence's whole context as rows, skip-KV has no prefix). */
#define GPU_RAGGED(name_, source_, q_, kv_, dqk_, dv_, hq_, hk_, causal_, quick_, seqs_) \
    { \
        .name = name_, .mode = AP_MODE_EXTEND, .q_dtype = q_, .kv_dtype = kv_, .page_size = 16, \
        .head_dim = dqk_, .num_qo_heads = hq_, .num_kv_heads = hk_, .causal = causal_, \
        .save_kv = 0, .quick = quick_, .seqs = seqs_, .source = source_, .head_dim_v = dv_ \
    }
#define GPU_RAGGED_SRC GPU_SOURCE_RAGGED
#define GPU_SKIP_SRC GPU_SOURCE_SKIP_KV

/* Cases the sweep does not reach. Heads: qo/kv. The CPU reference bounds their size. */
static const gpu_case gpu_named_cases[] = {
    /* B1 with a long context: the case split-KV exists for. */
    GPU_ATTN("decode_split_b1_l32768", AP_MODE_DECODE, GPU_BF16, GPU_BF16, 16, 128, 32, 8, 1, 1, 1,
             "32767:1"),
    GPU_ATTN("decode_split_b1_l32768_fp8", AP_MODE_DECODE, GPU_BF16, GPU_FP8, 16, 128, 32, 8, 1, 1,
             0, "32767:1"),
    GPU_ATTN("decode_split_b2_l20000_f16", AP_MODE_DECODE, GPU_F16, GPU_F16, 64, 64, 8, 1, 1, 1, 0,
             "19999:1,333:1"),
    /* Many sequences: enough CTAs without splitting. */
    GPU_ATTN("decode_nosplit_b64_l1031", AP_MODE_DECODE, GPU_BF16, GPU_BF16, 16, 128, 32, 8, 1, 1,
             1, "1030:1x64"),
    GPU_ATTN("decode_mixed_1_5000", AP_MODE_DECODE, GPU_F16, GPU_F16, 32, 128, 32, 8, 1, 1, 0,
             "0:1,4999:1,0:1,4999:1,6:1"),
    GPU_ATTN("decode_cached_fp8", AP_MODE_DECODE, GPU_BF16, GPU_FP8, 16, 128, 16, 2, 1, 0, 1,
             "332:1,4999:1,0:1"),
    GPU_ATTN("decode_mqa_g32", AP_MODE_DECODE, GPU_BF16, GPU_BF16, 16, 128, 32, 1, 1, 1, 0,
             "1030:1,4999:1"),
    /* A 16-bit cache of the other 16-bit type than the query: a conversion on append. */
    GPU_ATTN("decode_q_bf16_kv_f16", AP_MODE_DECODE, GPU_BF16, GPU_F16, 16, 128, 8, 2, 1, 1, 0,
             "0:1,332:1,1030:1"),
    GPU_ATTN("extend_q_f16_kv_bf16", AP_MODE_EXTEND, GPU_F16, GPU_BF16, 16, 128, 8, 2, 1, 1, 0,
             "13:20,0:7"),
    GPU_ATTN("extend_mixed_1_5000", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 16, 64, 4, 1, 1, 1, 0,
             "0:1,0:5000"),
    GPU_ATTN("extend_empty_prefix", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 16, 128, 8, 2, 1, 1, 1,
             "0:333,0:7,0:1"),
    GPU_ATTN("extend_prefix_mid_page", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 16, 128, 8, 2, 1, 1, 1,
             "1031:333,17:20"),
    GPU_ATTN("extend_prefix_mid_page_fp8", AP_MODE_EXTEND, GPU_F16, GPU_FP8, 16, 128, 8, 2, 1, 1, 1,
             "1031:333,17:20"),
    GPU_ATTN("extend_long_prefix_short_q", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 32, 128, 16, 4, 1, 1,
             0, "4999:1,4000:7,1:1"),
    GPU_ATTN("extend_chunk_257", AP_MODE_EXTEND, GPU_F16, GPU_F16, 64, 128, 4, 1, 1, 1, 0,
             "1024:257"),
    GPU_ATTN("extend_cached", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 16, 128, 8, 2, 1, 0, 0,
             "200:55,0:31"),
    GPU_ATTN("extend_cached_fp8", AP_MODE_EXTEND, GPU_BF16, GPU_FP8, 32, 64, 8, 1, 1, 0, 0,
             "200:55,0:31"),
    /* fp8 caches that the Hopper prefill reads staged to 16 bits (ap_kit_staged_kv_dtype): pages
     * of 64 with a prefix, GQA 4; head dim 64, group 8 */
    GPU_ATTN("extend_staged_fp8_p64", AP_MODE_EXTEND, GPU_BF16, GPU_FP8, 64, 128, 32, 8, 1, 1, 1,
             "700:300,0:513"),
    GPU_ATTN("extend_staged_fp8_d64", AP_MODE_EXTEND, GPU_F16, GPU_FP8, 32, 64, 8, 1, 1, 1, 0,
             "0:400,129:200"),
    /* The append_kv/1 hook, where a backend has one: full and partial rotary dims, both pairings,
     * decode-like and chunked batches. */
    GPU_APPEND("append_rope_neox_bf16", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 16, 128, 8, 2, 1,
               "0:7,1030:1,13:77", 128, 1),
    GPU_APPEND("append_rope_gptj_partial_fp8", AP_MODE_EXTEND, GPU_BF16, GPU_FP8, 32, 128, 8, 2, 0,
               "100:33,0:1", 64, 0),
    GPU_APPEND("append_rope_neox_f16_p1", AP_MODE_EXTEND, GPU_F16, GPU_F16, 1, 64, 4, 4, 0, "5:9",
               64, 1),
    GPU_APPEND("append_rope_decode_b8_fp8", AP_MODE_DECODE, GPU_F16, GPU_FP8, 64, 128, 32, 8, 0,
               "4095:1x8", 128, 1),
    GPU_ATTN("extend_noncausal", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 16, 128, 8, 2, 0, 1, 0,
             "100:77,0:33"),
    /* No prefix anywhere and save_kv: flashinfer_like reads the saved k / v in place (ragged) */
    GPU_ATTN("extend_fresh_noncausal", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 32, 128, 8, 2, 0, 1, 0,
             "0:300,0:65,0:1"),
    /* Split-KV (prefill.h: a Hopper plan of few work tiles cuts their keys into parts): short
     * chunks over long prefixes, causal and not, one with a 1-key sequence (parts with no key),
     * GQA packed (persistent grid) and group 1 (a CTA per tile), pages of 16 / 64 / 256 (two K/V
     * tiles a page: parts of whole pages), an fp8 cache staged to 16 bits */
    GPU_ATTN("extend_split_short_q_p16", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 16, 128, 32, 8, 1, 1,
             1, "8000:4,6000:16,0:1"),
    GPU_ATTN("extend_split_noncausal_p64_f16", AP_MODE_EXTEND, GPU_F16, GPU_F16, 64, 128, 8, 2, 0,
             1, 0, "4000:20,2500:9"),
    GPU_ATTN("extend_split_d64_g1", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 32, 64, 4, 4, 1, 1, 0,
             "6000:40"),
    GPU_ATTN("extend_split_page256", AP_MODE_EXTEND, GPU_BF16, GPU_BF16, 256, 128, 16, 4, 1, 1, 0,
             "3000:3,1000:2"),
    GPU_ATTN("extend_split_staged_fp8", AP_MODE_EXTEND, GPU_BF16, GPU_FP8, 16, 128, 32, 8, 1, 1, 0,
             "7000:8"),
    /* No cache: the ragged source (k / v rows by kv_indptr) over head dims 64 / 128 / 256 and
     * MLA's 192 / 128, groups 1 / 4 / 8, batches mixing 1, 17, 1000 and 4097 tokens, causal
     * (aligned to the end, so a prefix works) and not, fp8 K/V; then embedding skip-KV. The CPU
     * reference bounds the heads of the long ones. */
    GPU_RAGGED("ragged_d64_g1_mixed_4097_noncausal", GPU_RAGGED_SRC, GPU_BF16, GPU_BF16, 64, 64, 1,
               1, 0, 0, "0:1,0:17,0:1000,0:4097"),
    GPU_RAGGED("ragged_d128_g1_4097_causal_f16", GPU_RAGGED_SRC, GPU_F16, GPU_F16, 128, 128, 2, 2,
               1, 0, "0:4097,0:1"),
    GPU_RAGGED("ragged_d128_g4_mixed_causal", GPU_RAGGED_SRC, GPU_BF16, GPU_BF16, 128, 128, 4, 1, 1,
               1, "0:1,0:17,0:1000,0:333"),
    GPU_RAGGED("ragged_d256_g8_prefix_causal", GPU_RAGGED_SRC, GPU_BF16, GPU_BF16, 256, 256, 8, 1,
               1, 0, "5:1,100:17,31:300"),
    GPU_RAGGED("ragged_d256_g4_noncausal_f16", GPU_RAGGED_SRC, GPU_F16, GPU_F16, 256, 256, 4, 1, 0,
               0, "0:17,0:1,40:200"),
    GPU_RAGGED("ragged_d128_g8_prefix_fp8", GPU_RAGGED_SRC, GPU_BF16, GPU_FP8, 128, 128, 8, 1, 1, 1,
               "0:17,33:1000,7:1"),
    GPU_RAGGED("ragged_d64_g4_chunk_noncausal_fp8", GPU_RAGGED_SRC, GPU_F16, GPU_FP8, 64, 64, 8, 2,
               0, 0, "1000:17,0:1,4:60"),
    GPU_RAGGED("ragged_mla_192_128_g1", GPU_RAGGED_SRC, GPU_BF16, GPU_BF16, 192, 128, 2, 2, 1, 0,
               "0:17,100:200,0:1"),
    /* fp8 K/V on the Hopper kernel's fp8 path (ragged 128 / 128 and 192 / 128) */
    GPU_RAGGED("ragged_d128_g1_causal_fp8_f16", GPU_RAGGED_SRC, GPU_F16, GPU_FP8, 128, 128, 2, 2, 1,
               0, "0:1,0:17,0:1000,0:300"),
    GPU_RAGGED("ragged_mla_192_128_g1_fp8", GPU_RAGGED_SRC, GPU_BF16, GPU_FP8, 192, 128, 2, 2, 0, 1,
               "0:17,100:200,0:1"),
    /* split-KV over the ragged source: head dims 128 (packed), 64 (192-row tiles), 256 (80-key
     * tiles, a CTA per tile) and MLA's 192 / 128 */
    GPU_RAGGED("ragged_split_d128_g4_causal", GPU_RAGGED_SRC, GPU_BF16, GPU_BF16, 128, 128, 8, 2, 1,
               1, "5000:12,2000:3"),
    GPU_RAGGED("ragged_split_d64_g4_noncausal", GPU_RAGGED_SRC, GPU_F16, GPU_F16, 64, 64, 8, 2, 0,
               0, "3000:30"),
    GPU_RAGGED("ragged_split_d256_causal", GPU_RAGGED_SRC, GPU_BF16, GPU_BF16, 256, 256, 2, 2, 1, 0,
               "2000:5"),
    GPU_RAGGED("ragged_split_mla_noncausal", GPU_RAGGED_SRC, GPU_BF16, GPU_BF16, 192, 128, 4, 4, 0,
               0, "3000:7"),
    GPU_RAGGED("skipkv_d128_g4_causal", GPU_SKIP_SRC, GPU_BF16, GPU_BF16, 128, 128, 8, 2, 1, 1,
               "0:1,0:17,0:1000,0:513"),
    GPU_RAGGED("skipkv_d64_g8_noncausal_f16", GPU_SKIP_SRC, GPU_F16, GPU_F16, 64, 64, 8, 1, 0, 0,
               "0:17,0:1000,0:1"),
    GPU_RAGGED("skipkv_d256_g1_causal", GPU_SKIP_SRC, GPU_BF16, GPU_BF16, 256, 256, 2, 2, 1, 0,
               "0:300,0:1,0:700"),
};

static const char *gpu_dtype_tag(ap_dtype dtype) {
    switch (dtype) {
        case GPU_BF16: return "bf16";
        case GPU_F16: return "f16";
        case GPU_FP8: return "fp8";
        default: return "?";
    }
}

/* Every page size, head dim and mode; group size and KV dtype rotate so that each page size and
 * each head dim meets all three KV dtypes and all three group sizes in both modes. A 16-bit KV
 * cache has the query's dtype (the common deployment, and all some backends serve; the mixed
 * pairs are named cases); an fp8 cache meets both query dtypes. */
static size_t gpu_cases_sweep(gpu_case *out, size_t capacity) {
    static const int32_t page_sizes[] = {1, 16, 32, 64, 128};
    static const int32_t head_dims[] = {64, 128, 256};
    static const int32_t groups[] = {1, 4, 8};
    static const ap_dtype q_dtypes[] = {GPU_BF16, GPU_F16};
    static const ap_dtype kv_dtypes[] = {GPU_BF16, GPU_F16, GPU_FP8};
    size_t n = 0;
    for (int p = 0; p < 5; p++) {
        for (int h = 0; h < 3; h++) {
            for (int mode = 0; mode < 2 && n < capacity; mode++) {
                gpu_case *c = &out[n++];
                int decode = mode == 0;
                int32_t kv_heads = decode ? 4 : 1; /* the CPU reference pays for extend heads */
                ap_dtype kv = kv_dtypes[(p + h + mode) % 3];
                *c = (gpu_case){
                    .mode = decode ? AP_MODE_DECODE : AP_MODE_EXTEND,
                    .q_dtype = kv == GPU_FP8 ? q_dtypes[(p + h + mode) % 2] : kv,
                    .kv_dtype = kv,
                    .page_size = page_sizes[p],
                    .head_dim = head_dims[h],
                    .num_qo_heads = kv_heads * groups[(p + 2 * h + mode) % 3],
                    .num_kv_heads = kv_heads,
                    .causal = 1,
                    .save_kv = 1,
                    .quick = (p == 1 && h == 1) || (p == 0 && h == 0),
                    .seqs = decode ? GPU_DECODE_SEQS : GPU_EXTEND_SEQS,
                };
                snprintf(c->name, sizeof c->name, "%s_p%d_d%d_g%d_q%s_kv%s",
                         decode ? "decode" : "extend", c->page_size, c->head_dim,
                         c->num_qo_heads / c->num_kv_heads, gpu_dtype_tag(c->q_dtype),
                         gpu_dtype_tag(c->kv_dtype));
            }
        }
    }
    return n;
}

size_t gpu_cases_all(gpu_case *out, size_t capacity) {
    size_t n = gpu_cases_sweep(out, capacity);
    size_t named = sizeof gpu_named_cases / sizeof gpu_named_cases[0];
    for (size_t i = 0; i < named && n < capacity; i++) out[n++] = gpu_named_cases[i];
    return n;
}
