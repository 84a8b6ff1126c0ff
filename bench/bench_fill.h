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

#ifdef __cplusplus
}
#endif

#endif /* AP_BENCH_FILL_H */
