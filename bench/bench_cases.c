/* bench_cases.c: the benchmark shapes (the list) and their byte and FLOP counts. */
#include "bench_cases.h"

#define B_BF16 AP_DTYPE_BF16
#define B_FP8 AP_DTYPE_FP8_E4M3
#define B_NVFP4 AP_DTYPE_NVFP4

/* name, mode, q, kv, page, D, HQ, HK, B, prefix, new tokens, rotary dim (0: attention), save_kv.
 * Llama-3-8B-like heads. */
const bench_case bench_cases[] = {
    {"decode_b64_l4096", AP_MODE_DECODE, B_BF16, B_BF16, 16, 128, 32, 8, 64, 4095, 1, 0, 0},
    {"decode_b64_l4096_fp8", AP_MODE_DECODE, B_BF16, B_FP8, 16, 128, 32, 8, 64, 4095, 1, 0, 0},
    {"decode_b1_l8192", AP_MODE_DECODE, B_BF16, B_BF16, 16, 128, 32, 8, 1, 8191, 1, 0, 0},
    {"decode_b8_l32768", AP_MODE_DECODE, B_BF16, B_BF16, 16, 128, 32, 8, 8, 32767, 1, 0, 0},
    {"decode_b256_l1024", AP_MODE_DECODE, B_BF16, B_BF16, 16, 128, 32, 8, 256, 1023, 1, 0, 0},
    /* the other head dims (page 16, 64) */
    {"decode_b32_l4096_d64_g1", AP_MODE_DECODE, B_BF16, B_BF16, 16, 64, 16, 16, 32, 4095, 1, 0, 0},
    {"decode_b32_l4096_d256_g2", AP_MODE_DECODE, B_BF16, B_BF16, 64, 256, 16, 8, 32, 4095, 1, 0, 0},
    /* nvfp4 KV (decode only), against the bf16 cases above in tokens/s */
    {"decode_b64_l4096_nvfp4", AP_MODE_DECODE, B_BF16, B_NVFP4, 16, 128, 32, 8, 64, 4095, 1, 0, 0},
    {"decode_b8_l32768_nvfp4", AP_MODE_DECODE, B_BF16, B_NVFP4, 16, 128, 32, 8, 8, 32767, 1, 0, 0},
    {"extend_causal_b4_s4096", AP_MODE_EXTEND, B_BF16, B_BF16, 16, 128, 32, 8, 4, 0, 4096, 0, 0},
    {"extend_prefix4096_new512_b8", AP_MODE_EXTEND, B_BF16, B_BF16, 16, 128, 32, 8, 8, 4096, 512, 0,
     0},
    /* the first one as an engine's fresh prefill calls it: k / v passed and saved in the call */
    {"extend_causal_b4_s4096_save", AP_MODE_EXTEND, B_BF16, B_BF16, 16, 128, 32, 8, 4, 0, 4096, 0,
     1},
    /* the append_kv/1 hook (RoPE + quantize + paged write): prefill- and decode-sized calls */
    {"append_t16384", AP_MODE_EXTEND, B_BF16, B_BF16, 16, 128, 32, 8, 1, 0, 16384, 128, 0},
    {"append_t16384_fp8", AP_MODE_EXTEND, B_BF16, B_FP8, 16, 128, 32, 8, 1, 0, 16384, 128, 0},
    {"append_t64_fp8", AP_MODE_DECODE, B_BF16, B_FP8, 16, 128, 32, 8, 64, 4095, 1, 128, 0},
};
const size_t bench_num_cases = sizeof bench_cases / sizeof bench_cases[0];

int64_t bench_kv_elems(const bench_case *c) {
    return (int64_t)c->batch * (c->prefix + c->q_len) * c->num_kv_heads * c->head_dim * 2;
}

double bench_flops(const bench_case *c) {
    if (c->rotary_dim > 0) return 0.0; /* the append hook: counted in bytes */
    double s = c->q_len, p = c->prefix;
    return 4.0 * c->batch * c->num_qo_heads * c->head_dim * (s * p + s * s / 2.0);
}

double bench_kv_bytes(const bench_case *c) {
    if (c->rotary_dim > 0) {
        double t = (double)bench_new_tokens(c), q = (double)(ap_dtype_size_bits(c->q_dtype) / 8);
        double kv = (double)(ap_dtype_size_bits(c->kv_dtype) / 8);
        double row = (double)c->head_dim;
        return t * row * (2.0 * c->num_qo_heads * q + 2.0 * c->num_kv_heads * (q + kv));
    }
    double elems = (double)bench_kv_elems(c);
    if (c->kv_dtype == AP_DTYPE_NVFP4) return elems / 2.0 + elems / 16.0; /* values + scales */
    return elems * (double)(ap_dtype_size_bits(c->kv_dtype) / 8);
}

int64_t bench_new_tokens(const bench_case *c) {
    return (int64_t)c->batch * c->q_len;
}

void bench_cases_write_json(FILE *to) {
    fprintf(to, "[\n");
    for (size_t i = 0; i < bench_num_cases; i++) {
        const bench_case *c = &bench_cases[i];
        fprintf(to,
                "  {\"case\": \"%s\", \"mode\": \"%s\", \"q_dtype\": \"%s\", \"kv_dtype\": \"%s\", "
                "\"page_size\": %d, \"head_dim\": %d, \"num_qo_heads\": %d, \"num_kv_heads\": %d, "
                "\"batch\": %d, \"prefix\": %d, \"q_len\": %d, \"kv_elems\": %lld, "
                "\"flops\": %.6e, \"new_tokens\": %lld, \"rotary_dim\": %d, \"save_kv\": %d}%s\n",
                c->name,
                c->rotary_dim > 0           ? "append"
                : c->mode == AP_MODE_DECODE ? "decode"
                                            : "extend",
                ap_dtype_str(c->q_dtype), ap_dtype_str(c->kv_dtype), c->page_size, c->head_dim,
                c->num_qo_heads, c->num_kv_heads, c->batch, c->prefix, c->q_len,
                (long long)bench_kv_elems(c), bench_flops(c), (long long)bench_new_tokens(c),
                c->rotary_dim, c->save_kv, i + 1 < bench_num_cases ? "," : "");
    }
    fprintf(to, "]\n");
}
