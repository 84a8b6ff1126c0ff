// pdl.cuh: programmatic dependent launch (sm_90): the device-side waits and triggers, and a
// launch helper that sets the attribute, so a kernel's prologue overlaps its predecessor's tail.
#ifndef AP_COMMON_PDL_CUH
#define AP_COMMON_PDL_CUH

#include <cuda_runtime.h>

// Block until the grids this one depends on have finished and their writes are visible. A no-op
// when the kernel was launched without the attribute, and below sm_90.
__device__ __forceinline__ void ap_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Let the next grid on the stream (launched with the attribute) start its prologue now.
__device__ __forceinline__ void ap_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launch `kernel` on `stream`, with programmatic stream serialization when `pdl` is set.
template <typename... Params, typename... Args>
static inline cudaError_t ap_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, bool pdl, Args... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

#endif // AP_COMMON_PDL_CUH
