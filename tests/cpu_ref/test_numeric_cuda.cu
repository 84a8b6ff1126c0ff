/* test_numeric_cuda.cu: host_numeric.h against CUDA's own conversions, for every float; and
 * e4m3_div.h's division on the GPU against __fdiv_rn, every float over a few scales. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "backends/numeric/e4m3_div.h"
#include "backends/numeric/host_numeric.h"

/* What is compared: 0 bf16, 1 f16, 2 e4m3, 3 e5m2 (float -> narrow, all 2^32 floats), then the
 * narrow -> float decodes of every code: 4 bf16, 5 f16, 6 e4m3, 7 e5m2; then 8 the e4m3 bytes of
 * ap_e4m3_div(x, s) against those of __fdiv_rn(x, s), every float x over each of E4M3_SCALES. */
#define KINDS 9
static const char *const kind_names[KINDS] = {"float->bf16", "float->f16",  "float->e4m3",
                                              "float->e5m2", "bf16->float", "f16->float",
                                              "e4m3->float", "e5m2->float", "e4m3 div"};
/* A typical per-tensor scale, 1 / 448, 1, 3, and scales near the reciprocal's limits (2^+-60). */
static const float E4M3_SCALES[] = {0.0213f, 1.0f / 448.0f, 1.0f, 3.0f, 0x1.7p-60f, 0x1.fp59f};

struct mismatch_report {
    unsigned long long checked; /* floats compared: must come to 2^32, or a launch was lost */
    unsigned long long count[KINDS];
    unsigned int first_input[KINDS];
    unsigned int got[KINDS], want[KINDS]; /* ours, CUDA's, of the first mismatch */
};

__device__ void record(mismatch_report *r, int kind, unsigned int input, unsigned int ours,
                       unsigned int cudas) {
    if (atomicAdd(&r->count[kind], 1ull) == 0ull) {
        r->first_input[kind] = input;
        r->got[kind] = ours;
        r->want[kind] = cudas;
    }
}

__device__ unsigned int float_bits_or_nan(float x) {
    return isnan(x) ? 0x7fc00000u : __float_as_uint(x); /* any NaN matches any NaN */
}

__global__ void compare_encodes(unsigned long long base, mismatch_report *r) {
    unsigned long long i = base + blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned int bits = (unsigned int)i;
    float x = __uint_as_float(bits);
    unsigned int cuda_bf16 = __bfloat16_as_ushort(__float2bfloat16(x));
    unsigned int cuda_f16 = __half_as_ushort(__float2half(x));
    unsigned int cuda_e4m3 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    unsigned int cuda_e5m2 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
    unsigned int ours[4] = {ap_float_to_bf16(x), ap_float_to_f16(x), ap_float_to_fp8_e4m3(x),
                            ap_float_to_fp8_e5m2(x)};
    unsigned int cudas[4] = {cuda_bf16, cuda_f16, cuda_e4m3, cuda_e5m2};
    for (int k = 0; k < 4; k++)
        if (ours[k] != cudas[k]) record(r, k, bits, ours[k], cudas[k]);
    if (threadIdx.x == 0) atomicAdd(&r->checked, (unsigned long long)blockDim.x);
}

__global__ void compare_e4m3_div(unsigned long long base, float scale, float rcp,
                                 mismatch_report *r) {
    unsigned long long i = base + blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned int bits = (unsigned int)i;
    float x = __uint_as_float(bits);
    unsigned int ours =
        __nv_cvt_float_to_fp8(ap_e4m3_div(x, scale, rcp), __NV_SATFINITE, __NV_E4M3);
    unsigned int cudas = __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
    if (ours != cudas) record(r, 8, bits, ours, cudas);
}

__global__ void compare_decodes(mismatch_report *r) {
    unsigned int code = blockIdx.x * blockDim.x + threadIdx.x; /* 0 .. 65535 */
    float cuda_bf16 = __bfloat162float(__ushort_as_bfloat16((unsigned short)code));
    float cuda_f16 = __half2float(__ushort_as_half((unsigned short)code));
    unsigned int ours_bf16 = float_bits_or_nan(ap_bf16_to_float((uint16_t)code));
    unsigned int ours_f16 = float_bits_or_nan(ap_f16_to_float((uint16_t)code));
    if (ours_bf16 != float_bits_or_nan(cuda_bf16))
        record(r, 4, code, ours_bf16, float_bits_or_nan(cuda_bf16));
    if (ours_f16 != float_bits_or_nan(cuda_f16))
        record(r, 5, code, ours_f16, float_bits_or_nan(cuda_f16));
    if (code < 256) {
        __half_raw e4m3 = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, __NV_E4M3);
        __half_raw e5m2 = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, __NV_E5M2);
        unsigned int cuda_e4m3 = float_bits_or_nan(__half2float(__half(e4m3)));
        unsigned int cuda_e5m2 = float_bits_or_nan(__half2float(__half(e5m2)));
        unsigned int ours_e4m3 = float_bits_or_nan(ap_fp8_e4m3_to_float((uint8_t)code));
        unsigned int ours_e5m2 = float_bits_or_nan(ap_fp8_e5m2_to_float((uint8_t)code));
        if (ours_e4m3 != cuda_e4m3) record(r, 6, code, ours_e4m3, cuda_e4m3);
        if (ours_e5m2 != cuda_e5m2) record(r, 7, code, ours_e5m2, cuda_e5m2);
    }
}

/* CUDA's host-side implementations (cuda_fp8.hpp / cuda_bf16.hpp compiled for the CPU) on a
 * sample of floats: GPU tests also quantize on the host with them. */
static unsigned long long compare_host_sample(void) {
    unsigned long long bad = 0;
    for (unsigned long long i = 0; i < (1ull << 32); i += 4099) {
        unsigned int bits = (unsigned int)i;
        float x;
        memcpy(&x, &bits, 4);
        __nv_bfloat16 b = __float2bfloat16(x);
        __half h = __float2half(x);
        unsigned short b_bits, h_bits;
        memcpy(&b_bits, &b, 2);
        memcpy(&h_bits, &h, 2);
        bool same =
            b_bits == ap_float_to_bf16(x) && h_bits == ap_float_to_f16(x) &&
            __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) == ap_float_to_fp8_e4m3(x) &&
            __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2) == ap_float_to_fp8_e5m2(x);
        if (!same && bad++ < 5) printf("host mismatch at float bits 0x%08x\n", bits);
    }
    return bad;
}

int main(void) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    mismatch_report *report = nullptr;
    if (cudaMallocManaged(&report, sizeof *report) != cudaSuccess) return 1;
    memset(report, 0, sizeof *report);
    const unsigned long long chunk = 1ull << 28;
    for (unsigned long long base = 0; base < (1ull << 32); base += chunk)
        compare_encodes<<<(unsigned)(chunk / 256), 256>>>(base, report);
    compare_decodes<<<256, 256>>>(report);
    for (float scale : E4M3_SCALES)
        for (unsigned long long base = 0; base < (1ull << 32); base += chunk)
            compare_e4m3_div<<<(unsigned)(chunk / 256), 256>>>(base, scale, ap_e4m3_div_rcp(scale),
                                                               report);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        printf("CUDA error: %s\n", cudaGetErrorString(err));
        return 1;
    }
    int failed = report->checked != (1ull << 32);
    printf("floats compared: %llu of %llu\n", report->checked, 1ull << 32);
    for (int k = 0; k < KINDS; k++) {
        printf("%-12s %llu mismatches", kind_names[k], report->count[k]);
        if (report->count[k] != 0) {
            failed = 1;
            printf(" (first: input 0x%08x, ours 0x%x, CUDA 0x%x)", report->first_input[k],
                   report->got[k], report->want[k]);
        }
        printf("\n");
    }
    unsigned long long host_bad = compare_host_sample();
    printf("host-side CUDA conversions, 1 float in 4099: %llu mismatches\n", host_bad);
    cudaFree(report);
    return failed || host_bad != 0;
}
