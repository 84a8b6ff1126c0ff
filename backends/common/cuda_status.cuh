// cuda_status.cuh: CUDA runtime errors turned into ap_status with a message, never an abort; the
// host side every launch path repeats (shared-memory opt-in).
#ifndef AP_COMMON_CUDA_STATUS_CUH
#define AP_COMMON_CUDA_STATUS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

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

// Lets `kernel` use `bytes` of dynamic shared memory on the current device.
template <typename Kernel>
ap_status ap_cuda_smem_optin(Kernel kernel, size_t bytes, const char *who, ap_msgbuf *msg) {
    return ap_cuda_status(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), who,
        "cudaFuncSetAttribute(max dynamic shared memory)", msg);
}

// The same on a launch path: the opt-in is per device and kernel, so it runs once for each
// device seen (`devices_ready`: one bit per device ordinal, a static beside the kernel's launch).
template <typename Kernel>
ap_status ap_cuda_smem_optin_once(Kernel kernel, size_t bytes, std::atomic<uint64_t> &devices_ready,
                                  const char *who, ap_msgbuf *msg) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    const uint64_t bit = device < 64 ? 1ull << device : 0;
    if (err == cudaSuccess && (bit == 0 || !(devices_ready.load() & bit))) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (err == cudaSuccess) devices_ready.fetch_or(bit);
    }
    return ap_cuda_status(err, who, "cudaFuncSetAttribute(max dynamic shared memory)", msg);
}

#endif // AP_COMMON_CUDA_STATUS_CUH
