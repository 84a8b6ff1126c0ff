/* bench_time.h: time one benchmark case of one backend through the core API with CUDA events. */
#ifndef AP_BENCH_TIME_H
#define AP_BENCH_TIME_H

#include "attnplug.h"
#include "bench_cases.h"

typedef struct bench_ctx {
    ap_registry *registry;
    const char *backend;
    ap_device device;
    void *stream; /* cudaStream_t */
    int runs;     /* timed calls; the median is reported */
    int warmup;   /* untimed calls first (at least one per input set) */
} bench_ctx;

typedef struct bench_result {
    int ok;           /* 0: see `status` */
    char status[256]; /* "ok", or why the case did not run */
    double ms_median, ms_min, ms_p90;
    int runs, sets;  /* timed calls; input sets rotated (so the KV exceeds L2) */
    double kv_bytes; /* K + V bytes read once */
    double gbps, tflops, tokens_per_s;
} bench_result;

/* Time case `c`. Fills `out` in every case; returns AP_OK when it ran. */
ap_status bench_case_time(const bench_ctx *ctx, const bench_case *c, bench_result *out);

/* The append_kv/1 hook's cases (rotary_dim > 0), bench_append.c. */
ap_status bench_append_time(const bench_ctx *ctx, const bench_case *c, bench_result *out);

/* What both share: one timed call on input set `set`; warm-up then a CUDA event pair around each
 * of ctx->runs calls rotating over `num_sets` sets (ms[i]: call i); the result's figures from
 * the sorted times; a failure as one JSON-safe status line. */
typedef ap_status (*bench_call_fn)(const bench_ctx *ctx, const void *state, int set);
ap_status bench_time_calls(const bench_ctx *ctx, bench_call_fn call, const void *state,
                           int num_sets, double *ms);
void bench_summarize(const bench_case *c, double *ms, int runs, int sets, bench_result *out);
void bench_fail(bench_result *out, const char *what, const char *why);
/* bench_time_calls, then bench_summarize, or bench_fail naming `what` and the error. */
ap_status bench_time_case(const bench_ctx *ctx, const bench_case *c, bench_call_fn call,
                          const void *state, int num_sets, const char *what, bench_result *out);

#endif /* AP_BENCH_TIME_H */
