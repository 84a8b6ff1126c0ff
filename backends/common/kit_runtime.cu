// kit_runtime.cu: the CUDA runtime calls of a plugin's C glue behind plain C functions, and the
// plan buffer's allocation (kit.h).
#include <cuda_runtime.h>

#include "cuda_status.cuh"
#include "kit.h"

extern "C" ap_status ap_kit_set_device(int32_t ordinal, const char *who, ap_msgbuf *msg) {
    return ap_cuda_status(cudaSetDevice(ordinal), who, "cudaSetDevice", msg);
}

// A failed allocation is reported here, so the runtime's last error is cleared: left set, the
// next launch's check (cudaGetLastError) would report it as that launch's failure.
extern "C" ap_status ap_kit_device_alloc(size_t bytes, void **out, const char *who,
                                         ap_msgbuf *msg) {
    *out = NULL;
    if (bytes == 0) return AP_OK;
    const cudaError_t err = cudaMalloc(out, bytes);
    if (err != cudaSuccess) (void)cudaGetLastError();
    return ap_cuda_status(err, who, "cudaMalloc", msg);
}

extern "C" void ap_kit_device_free(void *ptr) {
    if (ptr != NULL) cudaFree(ptr);
}

extern "C" ap_status ap_kit_pinned_alloc(size_t bytes, void **out, const char *who,
                                         ap_msgbuf *msg) {
    *out = NULL;
    if (bytes == 0) return AP_OK;
    const cudaError_t err = cudaMallocHost(out, bytes);
    if (err != cudaSuccess) (void)cudaGetLastError(); // as ap_kit_device_alloc
    return ap_cuda_status(err, who, "cudaMallocHost", msg);
}

extern "C" void ap_kit_pinned_free(void *ptr) {
    if (ptr != NULL) cudaFreeHost(ptr);
}

extern "C" ap_status ap_kit_copy_to_device(void *dst, const void *src, size_t bytes, void *stream,
                                           const char *who, const char *what, ap_msgbuf *msg) {
    if (bytes == 0) return AP_OK;
    return ap_cuda_status(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)),
        who, what, msg);
}

extern "C" ap_status ap_kit_event_create(void **out, const char *who, ap_msgbuf *msg) {
    cudaEvent_t event = NULL;
    ap_status status = ap_cuda_status(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), who,
                                      "cudaEventCreate", msg);
    *out = event;
    return status;
}

extern "C" void ap_kit_event_destroy(void *event) {
    if (event != NULL) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

extern "C" ap_status ap_kit_event_record(void *event, void *stream, const char *who,
                                         ap_msgbuf *msg) {
    return ap_cuda_status(
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)), who,
        "cudaEventRecord", msg);
}

extern "C" ap_status ap_kit_event_wait(void *event, const char *who, ap_msgbuf *msg) {
    return ap_cuda_status(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), who,
                          "cudaEventSynchronize", msg);
}

extern "C" ap_status ap_kit_plan_buffer_alloc(ap_kit_plan_buffer *buffer, size_t bytes,
                                              const char *who, ap_msgbuf *msg) {
    buffer->bytes = bytes;
    const size_t at = (bytes + 15) & ~static_cast<size_t>(15); /* the tile counters */
    ap_status st = ap_kit_pinned_alloc(bytes, &buffer->host, who, msg);
    if (st == AP_OK) st = ap_kit_device_alloc(at + 16, &buffer->dev, who, msg);
    if (st == AP_OK) {
        /* a pageable source: the copy is done when cudaMemcpy returns, before any stream of
         * the caller's can launch a kernel that reads the counters */
        static const int32_t zeros[4] = {0, 0, 0, 0};
        buffer->tile_counters = reinterpret_cast<int32_t *>(static_cast<char *>(buffer->dev) + at);
        st = ap_cuda_status(
            cudaMemcpy(buffer->tile_counters, zeros, sizeof zeros, cudaMemcpyHostToDevice), who,
            "cudaMemcpy of the plan buffer's tile counters", msg);
    }
    if (st == AP_OK) st = ap_kit_event_create(&buffer->copied, who, msg);
    return st;
}

extern "C" void ap_kit_plan_buffer_free(ap_kit_plan_buffer *buffer) {
    /* no copy may still read the host side when it is freed */
    if (buffer->copied != NULL) ap_kit_event_wait(buffer->copied, "", NULL);
    ap_kit_event_destroy(buffer->copied);
    ap_kit_pinned_free(buffer->host);
    ap_kit_device_free(buffer->dev);
    ap_kit_device_free(buffer->split);
    *buffer = ap_kit_plan_buffer{};
}
