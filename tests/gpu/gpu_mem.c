/* gpu_mem.c: checked CUDA memory helpers shared by the GPU tests and the benchmarks. */
#include "gpu_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"

ap_status gpu_cuda_fail(cudaError_t err, const char *call, const char *file, int line) {
    fprintf(stderr, "%s:%d: %s: %s (%s)\n", file, line, call, cudaGetErrorString(err),
            cudaGetErrorName(err));
    return AP_ERR_CUDA;
}

static void *gpu_host_alloc(size_t bytes) {
    size_t rounded = (bytes + GPU_BUF_ALIGN - 1) / GPU_BUF_ALIGN * GPU_BUF_ALIGN;
    return aligned_alloc(GPU_BUF_ALIGN, rounded > 0 ? rounded : GPU_BUF_ALIGN);
}

ap_status gpu_buf_alloc(gpu_buf *buf, size_t bytes, int on_device) {
    *buf = (gpu_buf){.bytes = bytes, .on_device = on_device};
    buf->host = gpu_host_alloc(bytes);
    if (buf->host == NULL) return AP_ERR_OUT_OF_MEMORY;
    if (on_device) {
        cudaError_t err = cudaMalloc(&buf->target, bytes > 0 ? bytes : GPU_BUF_ALIGN);
        if (err != cudaSuccess) {
            free(buf->host);
            buf->host = NULL;
            buf->target = NULL;
            return gpu_cuda_fail(err, "cudaMalloc", __FILE__, __LINE__);
        }
    } else {
        buf->target = gpu_host_alloc(bytes);
        if (buf->target == NULL) {
            free(buf->host);
            buf->host = NULL;
            return AP_ERR_OUT_OF_MEMORY;
        }
    }
    return AP_OK;
}

ap_status gpu_buf_upload(const gpu_buf *buf) {
    if (buf->bytes == 0) return AP_OK;
    if (!buf->on_device) {
        memcpy(buf->target, buf->host, buf->bytes);
        return AP_OK;
    }
    GPU_CHECK(cudaMemcpy(buf->target, buf->host, buf->bytes, cudaMemcpyHostToDevice));
    return AP_OK;
}

ap_status gpu_buf_download(const gpu_buf *buf) {
    if (buf->bytes == 0) return AP_OK;
    if (!buf->on_device) {
        memcpy(buf->host, buf->target, buf->bytes);
        return AP_OK;
    }
    GPU_CHECK(cudaMemcpy(buf->host, buf->target, buf->bytes, cudaMemcpyDeviceToHost));
    return AP_OK;
}

ap_status gpu_buf_fill_target(const gpu_buf *buf, int byte) {
    if (buf->bytes == 0) return AP_OK;
    if (!buf->on_device) {
        memset(buf->target, byte, buf->bytes);
        return AP_OK;
    }
    GPU_CHECK(cudaMemset(buf->target, byte, buf->bytes));
    return AP_OK;
}

void gpu_buf_free(gpu_buf *buf) {
    if (buf->on_device && buf->target != NULL) {
        cudaError_t err = cudaFree(buf->target);
        if (err != cudaSuccess) gpu_cuda_fail(err, "cudaFree", __FILE__, __LINE__);
    } else {
        free(buf->target);
    }
    free(buf->host);
    *buf = (gpu_buf){0};
}

void gpu_tensor_make(gpu_tensor *tensor, void *data, ap_dtype dtype, int on_device, int ndim,
                     int64_t d0, int64_t d1, int64_t d2) {
    memset(tensor, 0, sizeof *tensor);
    tensor->shape[0] = d0;
    tensor->shape[1] = d1;
    tensor->shape[2] = d2;
    tensor->dl.data = data;
    tensor->dl.device = on_device ? (DLDevice){kDLCUDA, 0} : (DLDevice){kDLCPU, 0};
    tensor->dl.ndim = ndim;
    tensor->dl.dtype = ap_dtype_to_dl(dtype);
    tensor->dl.shape = tensor->shape;
    tensor->dl.strides = NULL;
    tensor->dl.byte_offset = 0;
}

void gpu_tensor_make_i32(gpu_tensor *tensor, void *data, int on_device, int64_t count) {
    gpu_tensor_make(tensor, data, AP_DTYPE_F32, on_device, 1, count, 0, 0);
    tensor->dl.dtype = (DLDataType){kDLInt, 32, 1};
}

size_t gpu_dtype_bytes(ap_dtype dtype) {
    return ap_dtype_size_bits(dtype) / 8;
}
