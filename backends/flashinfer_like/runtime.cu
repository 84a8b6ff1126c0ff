// runtime.cu: the CUDA runtime calls of flashinfer_like's C glue, behind plain C functions.
#include <cuda_runtime.h>

#include "../common/cuda_status.cuh"
#include "fil.h"

#define FIL_WHO "flashinfer_like"

extern "C" ap_status fil_rt_set_device(int32_t ordinal, ap_msgbuf *msg) {
    return ap_cuda_status(cudaSetDevice(ordinal), FIL_WHO, "cudaSetDevice", msg);
}

extern "C" ap_status fil_rt_device_alloc(size_t bytes, void **out, ap_msgbuf *msg) {
    *out = NULL;
    if (bytes == 0) return AP_OK;
    return ap_cuda_status(cudaMalloc(out, bytes), FIL_WHO, "cudaMalloc", msg);
}

extern "C" void fil_rt_device_free(void *ptr) {
    if (ptr != NULL) cudaFree(ptr);
}

extern "C" ap_status fil_rt_pinned_alloc(size_t bytes, void **out, ap_msgbuf *msg) {
    *out = NULL;
    if (bytes == 0) return AP_OK;
    return ap_cuda_status(cudaMallocHost(out, bytes), FIL_WHO, "cudaMallocHost", msg);
}

extern "C" void fil_rt_pinned_free(void *ptr) {
    if (ptr != NULL) cudaFreeHost(ptr);
}

extern "C" ap_status fil_rt_copy_to_device(void *dst, const void *src, size_t bytes, void *stream,
                                           ap_msgbuf *msg) {
    if (bytes == 0) return AP_OK;
    return ap_cuda_status(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)),
        FIL_WHO, "cudaMemcpyAsync of the batch plan", msg);
}

extern "C" ap_status fil_rt_event_create(void **out, ap_msgbuf *msg) {
    cudaEvent_t event = NULL;
    ap_status status = ap_cuda_status(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                      FIL_WHO, "cudaEventCreate", msg);
    *out = event;
    return status;
}

extern "C" void fil_rt_event_destroy(void *event) {
    if (event != NULL) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

extern "C" ap_status fil_rt_event_record(void *event, void *stream, ap_msgbuf *msg) {
    return ap_cuda_status(
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
        FIL_WHO, "cudaEventRecord", msg);
}

extern "C" ap_status fil_rt_event_wait(void *event, ap_msgbuf *msg) {
    return ap_cuda_status(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), FIL_WHO,
                          "cudaEventSynchronize", msg);
}
