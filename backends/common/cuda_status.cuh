// cuda_status.cuh: CUDA runtime errors turned into ap_status with a message, never an abort.
#ifndef AP_COMMON_CUDA_STATUS_CUH
#define AP_COMMON_CUDA_STATUS_CUH

#include <cuda_runtime.h>

#include "plugin_api.h"

// AP_OK for cudaSuccess; otherwise one line "<who>: <what>: <cuda message>" in `msg` and
// AP_ERR_OUT_OF_MEMORY for allocation failures, AP_ERR_CUDA for the rest.
static inline ap_status ap_cuda_status(cudaError_t err, const char *who, const char *what,
                                       ap_msgbuf *msg) {
    if (err == cudaSuccess) return AP_OK;
    ap_msgbuf_add(msg, "%s: %s: %s (%s)", who, what, cudaGetErrorString(err),
                  cudaGetErrorName(err));
    return err == cudaErrorMemoryAllocation ? AP_ERR_OUT_OF_MEMORY : AP_ERR_CUDA;
}

// The status of the launch just made on this thread (configuration errors show up here).
static inline ap_status ap_cuda_launch_status(const char *who, const char *kernel, ap_msgbuf *msg) {
    return ap_cuda_status(cudaGetLastError(), who, kernel, msg);
}

#endif // AP_COMMON_CUDA_STATUS_CUH
