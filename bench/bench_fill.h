/* bench_fill.h: fill device buffers with random values of an attention dtype, on the GPU; the GPU
 * sleep and the CUDA-event timer of mla-bench, nvfp4-bench and fav-bench. */
#ifndef AP_BENCH_FILL_H
#define AP_BENCH_FILL_H

#include <stddef.h>
#include <stdint.h>

#include "plugin_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fill `count` elements of `dtype` (F32, BF16, F16, FP8_E4M3) at device pointer `data` with
 * values uniform in [-bound, bound) drawn from `seed`, on `stream` (a cudaStream_t). Returns the
 * launch's cudaError_t as an int (0 = success). */
int bench_fill_random(void *data, size_t count, ap_dtype dtype, float bound, uint64_t seed,
                      void *stream);

/* Keep the GPU busy for about `cycles` clock cycles (one thread spinning on clock64), on
 * `stream`, so that the host's cost of enqueueing the next call is hidden (the peers' timing:
 * FlashInfer's fi_bench.py sleeps ~1.3 ms before each timed call). Returns the cudaError_t. */
int bench_gpu_sleep(int64_t cycles, void *stream);

/* The sleep before each "sleep" row's timed call: ~1.3 ms at the H100's 1.98 GHz. */
#define BENCH_SLEEP_CYCLES 2500000

/* One call of a benchmark on input set `set`; returns 0 on failure (it says why). */
typedef int (*bench_event_fn)(void *ctx, int set);

/* Median ms of `runs` calls fn(ctx, i % sets), each between two CUDA events on the default stream,
 * after `warmup` untimed calls (set i % sets) and a device synchronisation. With `sleep_cycles`
 * > 0 each timed call is enqueued behind bench_gpu_sleep(sleep_cycles), so the host's cost of the
 * call is hidden and the events time the GPU's work alone; without, the GPU is idle when the call
 * starts and the timing counts that cost. *min_ms: the fastest call. Returns -1 when a call or a
 * CUDA call fails (a CUDA failure printed on stderr). */
double bench_event_median(bench_event_fn fn, void *ctx, int sets, int runs, int warmup,
                          int64_t sleep_cycles, double *min_ms);

#ifdef __cplusplus
}
#endif

#endif /* AP_BENCH_FILL_H */
