/* bench_cases.h: the shapes the benchmarks time, and how their bytes and FLOPs are counted. */
#ifndef AP_BENCH_CASES_H
#define AP_BENCH_CASES_H

#include <stdio.h>

#include "plugin_api.h"

/* `batch` sequences alike: `prefix` tokens cached, `q_len` new (1 in decode). */
typedef struct bench_case {
    const char *name;
    ap_forward_mode mode;
    ap_dtype q_dtype;
    ap_dtype kv_dtype;
    int32_t page_size;
    int32_t head_dim;
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t batch;
    int32_t prefix;
    int32_t q_len;
    int32_t rotary_dim; /* > 0: time the append_kv/1 hook (neox RoPE of this width) instead */
    int32_t save_kv;    /* extend: 1 passes the new tokens' k / v with save_kv, as an engine's
                         * prefill calls it (the save is timed too); 0: they are in the cache */
} bench_case;

extern const bench_case bench_cases[];
extern const size_t bench_num_cases;

/* The metrics' definitions, printed with every result. */
#define BENCH_DECODE_METRIC \
    "decode GB/s = K+V bytes of every token in the cache, read once " \
    "(B * L * HK * D * 2 * bytes per element; nvfp4: 9/16, the values and their block " \
    "scales) / median time"
#define BENCH_APPEND_METRIC \
    "append GB/s = bytes moved once: q read and rotated in place, new k and v read, k and v " \
    "written into their cache slots / median time"
#define BENCH_EXTEND_METRIC \
    "extend TFLOP/s = 4 * B * HQ * D * (S * P + S^2 / 2) / median time, S new tokens over a " \
    "prefix of P (P = 0: 2 * B * HQ * S^2 * D, the causal half of QK^T and PV)"

int64_t bench_kv_elems(const bench_case *c); /* K and V elements the attention reads */
double bench_flops(const bench_case *c);     /* by the formulas above (decode: S = 1) */
int64_t bench_new_tokens(const bench_case *c);
double bench_kv_bytes(const bench_case *c); /* decode: K+V read; append: the bytes moved */

/* Write the case list as a JSON array (what peer_torch.py reads). */
void bench_cases_write_json(FILE *to);

#endif /* AP_BENCH_CASES_H */
