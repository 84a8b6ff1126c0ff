/* engine_host_memory.c: the engine's memory functions in a build without the CUDA runtime. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

int eng_cuda_built(void) {
    return 0;
}

ap_status eng_mem_alloc(const eng_memory *memory, size_t bytes, size_t alignment, void **out) {
    *out = NULL;
    if (memory->on_device) return AP_ERR_NO_DEVICE;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    *out = aligned_alloc(alignment, rounded ? rounded : alignment);
    return *out != NULL ? AP_OK : AP_ERR_OUT_OF_MEMORY;
}

void eng_mem_free(const eng_memory *memory, void *pointer) {
    (void)memory;
    free(pointer);
}

ap_status eng_mem_zero(const eng_memory *memory, void *pointer, size_t bytes) {
    if (memory->on_device) return AP_ERR_NO_DEVICE;
    memset(pointer, 0, bytes);
    return AP_OK;
}

ap_status eng_mem_upload(const eng_memory *memory, void *dst, const void *host_src, size_t bytes) {
    if (memory->on_device) return AP_ERR_NO_DEVICE;
    memcpy(dst, host_src, bytes);
    return AP_OK;
}

ap_status eng_mem_download(const eng_memory *memory, void *host_dst, const void *src,
                           size_t bytes) {
    if (memory->on_device) return AP_ERR_NO_DEVICE;
    memcpy(host_dst, src, bytes);
    return AP_OK;
}

ap_status eng_mem_sync(const eng_memory *memory) {
    (void)memory;
    return AP_OK;
}

const char *eng_mem_error(void) {
    return "this engine was built without the CUDA runtime (meson -Dcuda=disabled or no nvcc)";
}
