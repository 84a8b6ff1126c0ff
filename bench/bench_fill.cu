/* bench_fill.cu: a grid-stride kernel filling benchmark inputs with random values (never zeros),
 * the GPU sleep the peers' timing uses, and the benchmarks' event timer. */
#include <cstdio>
#include <cstdlib>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "bench_fill.h"

/* Counter-based: element i gets hash(seed, i), so the fill is the same for any grid shape. */
__device__ static float bench_uniform(uint64_t seed, size_t i, float bound) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float unit = (float)(z >> 40) * (1.0f / 16777216.0f);
    return bound * (2.0f * unit - 1.0f);
}

template <typename T> __device__ static T bench_convert(float x);
template <> __device__ float bench_convert<float>(float x) {
    return x;
}
template <> __device__ __nv_bfloat16 bench_convert<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __half bench_convert<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __nv_fp8_storage_t bench_convert<__nv_fp8_storage_t>(float x) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

template <typename T>
__global__ static void bench_fill_kernel(T *data, size_t count, float bound, uint64_t seed) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        data[i] = bench_convert<T>(bench_uniform(seed, i, bound));
}

template <typename T>
static int bench_fill_launch(void *data, size_t count, float bound, uint64_t seed,
                             cudaStream_t stream) {
    const int threads = 256;
    size_t blocks = (count + threads - 1) / threads;
    if (blocks > 65536) blocks = 65536;
    if (blocks == 0) return 0;
    bench_fill_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>((T *)data, count, bound, seed);
    return (int)cudaGetLastError();
}

extern "C" int bench_fill_random(void *data, size_t count, ap_dtype dtype, float bound,
                                 uint64_t seed, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    switch (dtype) {
        case AP_DTYPE_F32: return bench_fill_launch<float>(data, count, bound, seed, s);
        case AP_DTYPE_BF16: return bench_fill_launch<__nv_bfloat16>(data, count, bound, seed, s);
        case AP_DTYPE_F16: return bench_fill_launch<__half>(data, count, bound, seed, s);
        case AP_DTYPE_FP8_E4M3:
            return bench_fill_launch<__nv_fp8_storage_t>(data, count, bound, seed, s);
        default: return (int)cudaErrorInvalidValue;
    }
}

__global__ static void bench_sleep_kernel(int64_t cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

extern "C" int bench_gpu_sleep(int64_t cycles, void *stream) {
    bench_sleep_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(cycles);
    return (int)cudaGetLastError();
}

static int bench_cmp_float(const void *a, const void *b) {
    const float x = *static_cast<const float *>(a), y = *static_cast<const float *>(b);
    return x < y ? -1 : x > y;
}

extern "C" double bench_event_median(bench_event_fn fn, void *ctx, int sets, int runs, int warmup,
                                     int64_t sleep_cycles, double *min_ms) {
    for (int i = 0; i < warmup; i++)
        if (!fn(ctx, i % sets)) return -1;
    cudaDeviceSynchronize();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float *ms = static_cast<float *>(malloc(sizeof(float) * static_cast<size_t>(runs)));
    int ok = ms != NULL;
    cudaError_t err = cudaSuccess;
    for (int i = 0; ok && i < runs; i++) {
        if (sleep_cycles > 0) err = static_cast<cudaError_t>(bench_gpu_sleep(sleep_cycles, 0));
        ok = err == cudaSuccess;
        if (!ok) break;
        cudaEventRecord(e0, 0);
        ok = fn(ctx, i % sets);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[i], e0, e1);
    }
    if (ok && (err = cudaGetLastError()) != cudaSuccess) ok = 0;
    if (err != cudaSuccess)
        fprintf(stderr, "CUDA error in timed calls: %s\n", cudaGetErrorString(err));
    double med = -1;
    if (ok) {
        qsort(ms, static_cast<size_t>(runs), sizeof(float), bench_cmp_float);
        med = ms[runs / 2];
        *min_ms = ms[0];
    }
    free(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return med;
}
