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

#endif /* AP_BENCH_TIME_H */
