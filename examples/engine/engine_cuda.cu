/* engine_cuda.cu: the engine's memory functions over the CUDA runtime, with host fallbacks. */
#include <cuda_runtime.h>

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "engine.h"
}

static __thread cudaError_t eng_last_cuda_error = cudaSuccess;

/* Record a failing call's error and map it to a status. */
static ap_status eng_cuda_status(cudaError_t error) {
    if (error == cudaSuccess) return AP_OK;
    eng_last_cuda_error = error;
    return error == cudaErrorMemoryAllocation ? AP_ERR_OUT_OF_MEMORY : AP_ERR_CUDA;
}

extern "C" int eng_cuda_built(void) {
    return 1;
}

extern "C" ap_status eng_mem_alloc(const eng_memory *memory, size_t bytes, size_t alignment,
                                   void **out) {
    *out = NULL;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    if (!memory->on_device) {
        size_t rounded = (bytes + alignment - 1) / alignment * alignment;
        *out = aligned_alloc(alignment, rounded ? rounded : alignment);
        return *out != NULL ? AP_OK : AP_ERR_OUT_OF_MEMORY;
    }
    /* cudaMalloc aligns to 256 bytes; a backend asking for more is refused, not misled. */
    if (alignment > 256 || 256 % alignment != 0) return AP_ERR_UNSUPPORTED;
    ap_status status = eng_cuda_status(cudaSetDevice(memory->ordinal));
    if (status != AP_OK) return status;
    return eng_cuda_status(cudaMalloc(out, bytes ? bytes : 1));
}

extern "C" void eng_mem_free(const eng_memory *memory, void *pointer) {
    if (pointer == NULL) return;
    if (memory->on_device)
        cudaFree(pointer);
    else
        free(pointer);
}

extern "C" ap_status eng_mem_zero(const eng_memory *memory, void *pointer, size_t bytes) {
    if (!memory->on_device) {
        memset(pointer, 0, bytes);
        return AP_OK;
    }
    return eng_cuda_status(cudaMemset(pointer, 0, bytes));
}

extern "C" ap_status eng_mem_upload(const eng_memory *memory, void *dst, const void *host_src,
                                    size_t bytes) {
    if (!memory->on_device) {
        memcpy(dst, host_src, bytes);
        return AP_OK;
    }
    return eng_cuda_status(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
}

extern "C" ap_status eng_mem_download(const eng_memory *memory, void *host_dst, const void *src,
                                      size_t bytes) {
    if (!memory->on_device) {
        memcpy(host_dst, src, bytes);
        return AP_OK;
    }
    return eng_cuda_status(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
}

extern "C" ap_status eng_mem_sync(const eng_memory *memory) {
    if (!memory->on_device) return AP_OK;
    ap_status status = eng_cuda_status(cudaDeviceSynchronize());
    if (status == AP_OK) status = eng_cuda_status(cudaGetLastError());
    return status;
}

extern "C" const char *eng_mem_error(void) {
    return cudaGetErrorString(eng_last_cuda_error);
}
