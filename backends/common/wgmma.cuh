/* wgmma.cuh: the kit's warpgroup MMA wrappers (sm_90a), one function per shape and type.
 * ss: A and B from shared memory (descriptors), K-major both; rs: A from registers (the
 * m16n8k16-style fragment of each warp's 16 rows), B from shared memory, MN-major (imm-trans-b
 * 1). Accumulators fp32. Written out per shape because inline PTX names every register; one
 * macro per shape makes its bf16 and f16 forms. */
#ifndef AP_COMMON_WGMMA_CUH
#define AP_COMMON_WGMMA_CUH

#include <stdint.h>

namespace ap_sm90 {

#define AP_WGMMA_SS_N128(TY_NAME, TY) \
    __device__ __forceinline__ void wgmma_ss_n128_##TY_NAME(float(&d)[64], uint64_t da, \
                                                            uint64_t db, int acc) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, " \
            "%6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
            "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, " \
            "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
            "%55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
              "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), \
              "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), \
              "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
              "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), \
              "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), \
              "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), \
              "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
              "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), \
              "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), \
              "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
            : "l"(da), "l"(db), "r"(acc)); \
    }

#define AP_WGMMA_RS_N128(TY_NAME, TY) \
    __device__ __forceinline__ void wgmma_rs_n128_##TY_NAME(float *d, const uint32_t(&a)[4], \
                                                            uint64_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n" \
            "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY \
            " {%0, %1, %2, %3, %4, %5, %6, %7, " \
            "%8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, " \
            "%25, " \
            "%26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
            "%42, %43, " \
            "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, " \
            "%60, %61, " \
            "%62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n" \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
              "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), \
              "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), \
              "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
              "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), \
              "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), \
              "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), \
              "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
              "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), \
              "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), \
              "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)); \
    }

#define AP_WGMMA_RS_N64(TY_NAME, TY) \
    __device__ __forceinline__ void wgmma_rs_n64_##TY_NAME(float *d, const uint32_t(&a)[4], \
                                                           uint64_t db) { \
        asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n" \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY \
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, " \
                     "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
                     "%24, %25, %26, " \
                     "%27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n" \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
                       "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), \
                       "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)); \
    }

/* The bf16 and f16 forms differ only in the PTX type name. */
AP_WGMMA_SS_N128(bf16, "bf16")
AP_WGMMA_SS_N128(f16, "f16")
AP_WGMMA_RS_N128(bf16, "bf16")
AP_WGMMA_RS_N128(f16, "f16")
AP_WGMMA_RS_N64(bf16, "bf16")
AP_WGMMA_RS_N64(f16, "f16")

#undef AP_WGMMA_SS_N128
#undef AP_WGMMA_RS_N128
#undef AP_WGMMA_RS_N64

} // namespace ap_sm90

#endif /* AP_COMMON_WGMMA_CUH */
