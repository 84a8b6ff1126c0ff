/* gpu_rand.h: the small seeded generator the GPU tests and benchmarks draw their inputs from. */
#ifndef AP_GPU_RAND_H
#define AP_GPU_RAND_H

#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* splitmix64: one 64-bit state, every seed (0 too) gives a full-period stream, and a seed
 * printed by a failing run reproduces its inputs exactly. */
static inline uint64_t gpu_rand_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi), from the top 24 bits (exact in float). */
static inline float gpu_rand_uniform(uint64_t *state, float lo, float hi) {
    float unit = (float)(gpu_rand_next(state) >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * unit;
}

/* Uniform integer in [0, n), n > 0. The modulo bias (< n / 2^64) does not matter here. */
static inline uint32_t gpu_rand_below(uint64_t *state, uint32_t n) {
    return (uint32_t)(gpu_rand_next(state) % n);
}

/* A fresh seed when the run names none: the clock and the process id, mixed; the run prints it
 * so a failure can be replayed with --seed. */
static inline uint64_t gpu_rand_fresh_seed(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t mix = (uint64_t)now.tv_nsec ^ ((uint64_t)now.tv_sec << 20) ^ (uint64_t)getpid();
    return gpu_rand_next(&mix);
}

#endif /* AP_GPU_RAND_H */
