/* gpu_mla.h: what the MLA GPU checks (gpu-mla) share: the context, tensors and the model. */
#ifndef AP_GPU_MLA_H
#define AP_GPU_MLA_H

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

#include "attnplug.h"

#define MT_BACKEND "trtllm_mla"

typedef struct mt_ctx {
    ap_registry *registry;
    ap_device device, cpu;
    cudaStream_t stream;
    int quick;
    const char *filter;
    size_t passed, failed, skipped;
} mt_ctx;

/* A DLTensor with its own shape and stride storage (do not copy once made). */
typedef struct mt_tensor {
    DLTensor dl;
    int64_t shape[3];
    int64_t strides[3];
} mt_tensor;

/* dtype: AP_DTYPE_BF16, F16, F32, FP8_E4M3, or AP_DTYPE_NONE for int32. strides NULL: dense. */
void mt_tensor_make(mt_tensor *t, void *data, ap_dtype dtype, int on_device, int ndim,
                    const int64_t *shape, const int64_t *strides);

/* DeepSeek's MLA dims on one GPU with `heads` query heads. */
ap_model mt_mla_model(int32_t heads, int32_t page_size, ap_dtype kv_dtype);

/* Checked cudaMalloc / copies: print and return 0 on failure. */
int mt_cuda_ok(cudaError_t err, const char *what);
void *mt_dev_alloc(size_t bytes);
int mt_upload(void *dev, const void *host, size_t bytes);
int mt_download(void *host, const void *dev, size_t bytes);

/* bf16 helpers (host_numeric.h) and a relative L2 error sum |a-b|^2 / sum |b|^2. */
uint16_t mt_bf16(float x);
float mt_bf16_f(uint16_t x);
double mt_rel_l2(const double *got, const double *want, size_t n, size_t *bad);

int mt_selected(const mt_ctx *ctx, const char *name, int quick_case);
void mt_verdict(mt_ctx *ctx, const char *name, int ok, const char *detail);

/* The case groups: decode and MTP (+ graph) in gpu_mla.c, the hooks in gpu_mla_hooks.c, the
 * MHA-form prefill in gpu_mla_prefill.c. */
void mt_run_decode_cases(mt_ctx *ctx, uint64_t seed);
void mt_run_pack_cases(mt_ctx *ctx, uint64_t seed);
void mt_run_append_cases(mt_ctx *ctx, uint64_t seed);
void mt_run_merge_cases(mt_ctx *ctx, uint64_t seed);
void mt_run_prefill_cases(mt_ctx *ctx, uint64_t seed);     /* gpu_mla_prefill.c: the MHA form */
void mt_run_decode_selfcheck(mt_ctx *ctx, uint64_t seed);  /* --cpu-only */
void mt_run_append_selfcheck(mt_ctx *ctx, uint64_t seed);  /* --cpu-only */
void mt_run_prefill_selfcheck(mt_ctx *ctx, uint64_t seed); /* --cpu-only */

#endif /* AP_GPU_MLA_H */
