/* bench_fill.h: fill device buffers with random values of an attention dtype, on the GPU. */
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

#ifdef __cplusplus
}
#endif

#endif /* AP_BENCH_FILL_H */
