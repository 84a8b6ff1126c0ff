/* gpu_case_run.h: run one case on the backend under test and on cpu_ref, and judge it. */
#ifndef AP_GPU_CASE_RUN_H
#define AP_GPU_CASE_RUN_H

#include "attnplug.h"
#include "gpu_cases.h"

/* What every case shares: the registry, the devices and the backend under test. */
typedef struct gpu_ctx {
    ap_registry *registry;
    const char *backend; /* name of the backend under test */
    ap_device device;    /* the device it runs on (a GPU, or the CPU for a CPU backend) */
    ap_device cpu;       /* where cpu_ref runs */
    int on_device;       /* 1: the backend's tensors live in GPU memory */
    void *stream;        /* cudaStream_t of the backend's calls, or NULL */
} gpu_ctx;

typedef enum gpu_outcome { GPU_PASS = 0, GPU_FAIL = 1, GPU_SKIP = 2 } gpu_outcome;

/* Run case `c` on inputs drawn from `seed`; prints one line with the verdict. */
gpu_outcome gpu_case_run(const gpu_ctx *ctx, const gpu_case *c, uint64_t seed);

/* The same for a case without the paged cache (ragged or skip-KV source: gpu_ragged_run.c). */
gpu_outcome gpu_ragged_case_run(const gpu_ctx *ctx, const gpu_case *c, uint64_t seed);

#endif /* AP_GPU_CASE_RUN_H */
