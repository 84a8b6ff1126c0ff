// mma.cuh: warp-level tensor-core helpers (ldmatrix, mma.sync m16n8k16, fragment packing) and
// 8- and 16-byte shared-memory loads and stores.
#ifndef AP_COMMON_MMA_CUH
#define AP_COMMON_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// Fragment layouts of mma.sync.m16n8k16 (g = lane / 4, t = lane % 4), which callers rely on:
//   A 16x16: a[0] = (g, 2t..2t+1)  a[1] = (g+8, 2t..)  a[2] = (g, 2t+8..)  a[3] = (g+8, 2t+8..)
//   B 16x8:  b[0] = (k 2t..2t+1, n g)  b[1] = (k 2t+8.., n g)
//   C 16x8:  c[0..1] = (g, 2t..2t+1)  c[2..3] = (g+8, 2t..2t+1)
// ldmatrix.x4 reads four 8x8 matrices of 16-bit elements; lanes 8i..8i+7 give the row addresses
// of matrix i, and register i of lane l receives row l/4, elements 2(l%4)..2(l%4)+1 of it (with
// .trans, column l/4, rows 2(l%4)..2(l%4)+1).

__device__ __forceinline__ uint32_t ap_smem_addr(const void *ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16 (or 8) bytes of shared memory at a shared-space address (ap_smem_addr), and back: ld /
// st.shared on a 32-bit address, where a plain pointer into shared memory whose address space the
// compiler lost (an aligned base computed through an integer) becomes a generic access with
// 64-bit address arithmetic.
__device__ __forceinline__ void ap_lds128(uint32_t (&v)[4], uint32_t addr) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ap_lds64(uint32_t (&v)[2], uint32_t addr) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v[0]), "=r"(v[1]) : "r"(addr));
}
__device__ __forceinline__ void ap_sts128(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                          uint32_t d) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c),
                 "r"(d)
                 : "memory");
}

__device__ __forceinline__ void ap_ldmatrix_x4(uint32_t reg[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(reg[0]), "=r"(reg[1]), "=r"(reg[2]), "=r"(reg[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ap_ldmatrix_x4_trans(uint32_t reg[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(reg[0]), "=r"(reg[1]), "=r"(reg[2]), "=r"(reg[3])
                 : "r"(addr));
}

// The transpose of an 8x8 matrix of 16-bit elements held as a fragment (lane l: row l/4,
// elements 2(l%4)..2(l%4)+1): lane l receives column l/4, rows 2(l%4)..2(l%4)+1. It turns a C
// fragment packed to 16 bits (keys on M) into the B fragment of the next product.
__device__ __forceinline__ uint32_t ap_movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// c += a * b with 16-bit inputs of type T (__nv_bfloat16 or __half) and float accumulators.
template <typename T>
__device__ __forceinline__ void ap_mma_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1);

template <>
__device__ __forceinline__ void ap_mma_16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                            uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void ap_mma_16816<__half>(float c[4], const uint32_t a[4], uint32_t b0,
                                                     uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to T and packed into one register, the first in the low half (the order
// the A and B fragments expect).
template <typename T> __device__ __forceinline__ uint32_t ap_pack2(float lo, float hi);

template <> __device__ __forceinline__ uint32_t ap_pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

template <> __device__ __forceinline__ uint32_t ap_pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// 2^x on the special-function unit (about 2 ulp; -inf gives 0).
__device__ __forceinline__ float ap_exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif // AP_COMMON_MMA_CUH
