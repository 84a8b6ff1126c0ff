// runtime.cu: the CUDA runtime calls of trtllm_mla's C glue, behind plain C functions.
#include <cuda_runtime.h>

#include "../common/cuda_status.cuh"
#include "mla.h"

#define MLA_WHO "trtllm_mla"

extern "C" ap_status mla_rt_set_device(int32_t ordinal, ap_msgbuf *msg) {
    return ap_cuda_status(cudaSetDevice(ordinal), MLA_WHO, "cudaSetDevice", msg);
}

extern "C" ap_status mla_rt_device_alloc(size_t bytes, void **out, ap_msgbuf *msg) {
    *out = NULL;
    if (bytes == 0) return AP_OK;
    return ap_cuda_status(cudaMalloc(out, bytes), MLA_WHO, "cudaMalloc", msg);
}

extern "C" void mla_rt_device_free(void *ptr) {
    if (ptr != NULL) cudaFree(ptr);
}
