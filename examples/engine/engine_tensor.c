/* engine_tensor.c: the engine's random numbers and dense tensors (host staging + device copy). */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "host_numeric.h"

/* splitmix64: a full-period 64-bit generator; good enough to fill activations. */
void eng_rng_seed(eng_rng *rng, uint64_t seed) {
    rng->state = seed;
}

uint64_t eng_rng_next(eng_rng *rng) {
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int32_t eng_rng_range(eng_rng *rng, int32_t low, int32_t high) {
    uint64_t span = (uint64_t)((int64_t)high - (int64_t)low + 1);
    return (int32_t)((int64_t)low + (int64_t)(eng_rng_next(rng) % span));
}

float eng_rng_uniform(eng_rng *rng) {
    /* 24 random bits: exact in a float, in [-1, 1). */
    return (float)((int64_t)(eng_rng_next(rng) >> 40) - (1 << 23)) / (float)(1 << 23);
}

DLDataType eng_dl_dtype(ap_dtype dtype) {
    DLDataType dl = {kDLFloat, 32, 1};
    switch (dtype) {
        case AP_DTYPE_BF16: dl.code = kDLBfloat, dl.bits = 16; break;
        case AP_DTYPE_F16: dl.bits = 16; break;
        case AP_DTYPE_FP8_E4M3: dl.code = AP_DL_FLOAT8_E4M3FN, dl.bits = 8; break;
        case AP_DTYPE_FP8_E5M2: dl.code = AP_DL_FLOAT8_E5M2, dl.bits = 8; break;
        default: break;
    }
    return dl;
}

size_t eng_tensor_count(const eng_tensor *tensor) {
    size_t count = 1;
    for (int i = 0; i < tensor->dl.ndim; i++) count *= (size_t)tensor->shape[i];
    return count;
}

ap_status eng_tensor_make(eng_tensor *tensor, const eng_memory *memory, ap_dtype dtype, int ndim,
                          const int64_t *shape) {
    memset(tensor, 0, sizeof(*tensor));
    size_t elem = ap_dtype_size_bits(dtype) / 8; /* 0 for none and packed nvfp4: refused */
    if (elem == 0 || ndim < 1 || ndim > 4) return AP_ERR_INVALID_ARGUMENT;
    for (int i = 0; i < ndim; i++) tensor->shape[i] = shape[i];
    tensor->dtype = dtype;
    tensor->dl.ndim = ndim;
    tensor->dl.shape = tensor->shape;
    tensor->dl.strides = NULL; /* dense, row-major */
    tensor->dl.dtype = eng_dl_dtype(dtype);
    tensor->bytes = eng_tensor_count(tensor) * elem;
    /* calloc(0) may return NULL: an empty tensor still gets a real (1-byte) buffer. */
    tensor->host = calloc(tensor->bytes ? tensor->bytes : 1, 1);
    if (tensor->host == NULL) return AP_ERR_OUT_OF_MEMORY;
    tensor->dl.data = tensor->host;
    tensor->dl.device = (DLDevice){kDLCPU, 0};
    if (memory->on_device) {
        ap_status status =
            eng_mem_alloc(memory, tensor->bytes ? tensor->bytes : 1, 256, &tensor->device);
        if (status != AP_OK) return status;
        tensor->dl.data = tensor->device;
        tensor->dl.device = (DLDevice){kDLCUDA, memory->ordinal};
    }
    return AP_OK;
}

void eng_tensor_free(eng_tensor *tensor, const eng_memory *memory) {
    free(tensor->host);
    if (tensor->device != NULL) eng_mem_free(memory, tensor->device);
    memset(tensor, 0, sizeof(*tensor));
}

static void eng_store(ap_dtype dtype, void *base, size_t index, float value) {
    switch (dtype) {
        case AP_DTYPE_F32: ((float *)base)[index] = value; break;
        case AP_DTYPE_BF16: ((uint16_t *)base)[index] = ap_float_to_bf16(value); break;
        case AP_DTYPE_F16: ((uint16_t *)base)[index] = ap_float_to_f16(value); break;
        case AP_DTYPE_FP8_E4M3: ((uint8_t *)base)[index] = ap_float_to_fp8_e4m3(value); break;
        case AP_DTYPE_FP8_E5M2: ((uint8_t *)base)[index] = ap_float_to_fp8_e5m2(value); break;
        default: break;
    }
}

float eng_tensor_get(const eng_tensor *tensor, size_t index) {
    const void *base = tensor->host;
    switch (tensor->dtype) {
        case AP_DTYPE_F32: return ((const float *)base)[index];
        case AP_DTYPE_BF16: return ap_bf16_to_float(((const uint16_t *)base)[index]);
        case AP_DTYPE_F16: return ap_f16_to_float(((const uint16_t *)base)[index]);
        case AP_DTYPE_FP8_E4M3: return ap_fp8_e4m3_to_float(((const uint8_t *)base)[index]);
        case AP_DTYPE_FP8_E5M2: return ap_fp8_e5m2_to_float(((const uint8_t *)base)[index]);
        default: return 0.0f;
    }
}

void eng_tensor_fill_random(eng_tensor *tensor, eng_rng *rng) {
    size_t count = eng_tensor_count(tensor);
    for (size_t i = 0; i < count; i++)
        eng_store(tensor->dtype, tensor->host, i, eng_rng_uniform(rng));
}

ap_status eng_tensor_upload(eng_tensor *tensor, const eng_memory *memory) {
    if (tensor->device == NULL || tensor->bytes == 0) return AP_OK;
    return eng_mem_upload(memory, tensor->device, tensor->host, tensor->bytes);
}

ap_status eng_tensor_download(eng_tensor *tensor, const eng_memory *memory) {
    if (tensor->device == NULL || tensor->bytes == 0) return AP_OK;
    return eng_mem_download(memory, tensor->host, tensor->device, tensor->bytes);
}

DLTensor eng_tensor_host_view(const eng_tensor *tensor) {
    DLTensor view = tensor->dl;
    view.data = tensor->host;
    view.device = (DLDevice){kDLCPU, 0};
    view.byte_offset = 0;
    return view;
}
