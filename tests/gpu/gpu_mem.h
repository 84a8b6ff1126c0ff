/* gpu_mem.h: checked CUDA calls, host/backend buffer pairs and DLTensor views for GPU tests. */
#ifndef AP_GPU_MEM_H
#define AP_GPU_MEM_H

#include <cuda_runtime_api.h>

#include "plugin_api.h"

/* Print "file:line: call: cuda error" on stderr and return AP_ERR_CUDA. */
ap_status gpu_cuda_fail(cudaError_t err, const char *call, const char *file, int line);

/* Run a CUDA runtime call; on failure print it and return AP_ERR_CUDA from the caller. */
#define GPU_CHECK(call) \
    do { \
        cudaError_t gpu_check_err_ = (call); \
        if (gpu_check_err_ != cudaSuccess) \
            return gpu_cuda_fail(gpu_check_err_, #call, __FILE__, __LINE__); \
    } while (0)

/* The alignment every buffer gets (cudaMalloc's; host blocks are aligned to match), so any
 * ap_kv_spec alignment up to it is met. */
#define GPU_BUF_ALIGN 256

/* A host block the test writes and reads, and the backend's copy: device memory when the
 * backend under test runs on the GPU, a second host block for a CPU backend. */
typedef struct gpu_buf {
    void *host;
    void *target;
    size_t bytes;
    int on_device;
} gpu_buf;

ap_status gpu_buf_alloc(gpu_buf *buf, size_t bytes, int on_device);
ap_status gpu_buf_upload(const gpu_buf *buf);   /* host -> target */
ap_status gpu_buf_download(const gpu_buf *buf); /* target -> host */
ap_status gpu_buf_fill_target(const gpu_buf *buf, int byte);
void gpu_buf_free(gpu_buf *buf);

/* A DLTensor with its own shape storage. Do not copy it once made: dl.shape points inside. */
typedef struct gpu_tensor {
    DLTensor dl;
    int64_t shape[4];
} gpu_tensor;

/* Describe dense `data` of `dtype` with up to 4 dims (unused trailing dims are ignored). */
void gpu_tensor_make(gpu_tensor *tensor, void *data, ap_dtype dtype, int on_device, int ndim,
                     int64_t d0, int64_t d1, int64_t d2);

/* An int32 vector [count] (positions, slots). */
void gpu_tensor_make_i32(gpu_tensor *tensor, void *data, int on_device, int64_t count);

size_t gpu_dtype_bytes(ap_dtype dtype); /* the core's size in bits / 8: 0 for NONE and NVFP4 */

#endif /* AP_GPU_MEM_H */
