/* wgmma.cuh: the kit's warpgroup MMA wrappers (sm_90a), one function per shape and type.
 * ss: A and B from shared memory (descriptors), K-major both; rs: A from registers (the
 * m16n8k16-style fragment of each warp's 16 rows), B from shared memory, MN-major (imm-trans-b
 * 1). Accumulators fp32. Written out per shape because inline PTX names every register; one
 * macro per shape makes its bf16 and f16 forms. */
#ifndef AP_COMMON_WGMMA_CUH
#define AP_COMMON_WGMMA_CUH

#include <stdint.h>

namespace ap_sm90 {

/* The accumulator operands of one wgmma: d[0] .. d[N - 1], read and written ("+f"), 32 at a
 * time from d[o]. */
#define AP_WGMMA_D32_AT(d, o) \
    "+f"(d[o + 0]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), \
        "+f"(d[o + 5]), "+f"(d[o + 6]), "+f"(d[o + 7]), "+f"(d[o + 8]), "+f"(d[o + 9]), \
        "+f"(d[o + 10]), "+f"(d[o + 11]), "+f"(d[o + 12]), "+f"(d[o + 13]), "+f"(d[o + 14]), \
        "+f"(d[o + 15]), "+f"(d[o + 16]), "+f"(d[o + 17]), "+f"(d[o + 18]), "+f"(d[o + 19]), \
        "+f"(d[o + 20]), "+f"(d[o + 21]), "+f"(d[o + 22]), "+f"(d[o + 23]), "+f"(d[o + 24]), \
        "+f"(d[o + 25]), "+f"(d[o + 26]), "+f"(d[o + 27]), "+f"(d[o + 28]), "+f"(d[o + 29]), \
        "+f"(d[o + 30]), "+f"(d[o + 31])
#define AP_WGMMA_D32(d) AP_WGMMA_D32_AT(d, 0)
#define AP_WGMMA_D64(d) AP_WGMMA_D32_AT(d, 0), AP_WGMMA_D32_AT(d, 32)
#define AP_WGMMA_D128(d) AP_WGMMA_D64(d), AP_WGMMA_D32_AT(d, 64), AP_WGMMA_D32_AT(d, 96)

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
            : AP_WGMMA_D64(d) \
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
            : AP_WGMMA_D64(d) \
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
                     : AP_WGMMA_D32(d) \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)); \
    }

/* The bf16 and f16 forms differ only in the PTX type name. */
AP_WGMMA_SS_N128(bf16, "bf16")
AP_WGMMA_SS_N128(f16, "f16")
AP_WGMMA_RS_N128(bf16, "bf16")
AP_WGMMA_RS_N128(f16, "f16")
AP_WGMMA_RS_N64(bf16, "bf16")
AP_WGMMA_RS_N64(f16, "f16")

/* ss with N 32 (K-major B), and N 256 with an MN-major B (t: imm-trans-b 1, V rows), for the
 * MLA decode (backends/trtllm_mla/decode_wgmma.cu). */
#define AP_WGMMA_SS_N32(TY_NAME, TY) \
    __device__ __forceinline__ void wgmma_ss_n32_##TY_NAME(float *d, uint64_t da, uint64_t db, \
                                                           int acc) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY \
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
                     "%16, %17, p, 1, 1, 0, 0;\n}\n" \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
                     : "l"(da), "l"(db), "r"(acc)); \
    }

#define AP_WGMMA_SS_N256T(TY_NAME, TY) \
    __device__ __forceinline__ void wgmma_ss_n256t_##TY_NAME(float *d, uint64_t da, uint64_t db, \
                                                             int acc) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY \
            " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
            "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, " \
            "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
            "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, " \
            "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
            "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, " \
            "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
            "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, " \
            "%126, %127}, " \
            "%128, %129, p, 1, 1, 0, 1;\n}\n" \
            : AP_WGMMA_D128(d) \
            : "l"(da), "l"(db), "r"(acc)); \
    }

AP_WGMMA_SS_N32(bf16, "bf16")
AP_WGMMA_SS_N256T(bf16, "bf16")

/* ss with N 64 (K-major B), for the kit's Hopper prefill at head dim 256 (S of 64-key tiles). */
#define AP_WGMMA_SS_N64(TY_NAME, TY) \
    __device__ __forceinline__ void wgmma_ss_n64_##TY_NAME(float(&d)[32], uint64_t da, \
                                                           uint64_t db, int acc) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY \
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, " \
                     "%31}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
                     : AP_WGMMA_D32(d) \
                     : "l"(da), "l"(db), "r"(acc)); \
    }

AP_WGMMA_SS_N64(bf16, "bf16")
AP_WGMMA_SS_N64(f16, "f16")

/* ss with N 80 (K-major B), for the kit's Hopper prefill at head dim 256 (S of 80-key tiles,
 * Geo::kKeys): 40 accumulators a thread. */
#define AP_WGMMA_SS_N80(TY_NAME, TY) \
    __device__ __forceinline__ void wgmma_ss_n80_##TY_NAME(float(&d)[40], uint64_t da, \
                                                           uint64_t db, int acc) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n80k16.f32." TY "." TY " {" \
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, " \
                     "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, " \
                     "%40, %41, p, 1, 1, 0, 0;\n}\n" \
                     : AP_WGMMA_D32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
                       "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]) \
                     : "l"(da), "l"(db), "r"(acc)); \
    }

AP_WGMMA_SS_N80(bf16, "bf16")
AP_WGMMA_SS_N80(f16, "f16")

/* ss with N 192 (K-major B), for the kit's Hopper prefill at head dim 64 (S of 192-key tiles,
 * Geo::kKeys): 96 accumulators a thread, laid out as an n128's followed by an n64's. */
#define AP_WGMMA_SS_N192(TY_NAME, TY) \
    __device__ __forceinline__ void wgmma_ss_n192_##TY_NAME(float(&d)[96], uint64_t da, \
                                                            uint64_t db, int acc) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n192k16.f32." TY "." TY " {" \
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, " \
                     "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
                     "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, " \
                     "%58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, " \
                     "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, " \
                     "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, " \
                     "%96, %97, p, 1, 1, 0, 0;\n}\n" \
                     : AP_WGMMA_D64(d), AP_WGMMA_D32_AT(d, 64) \
                     : "l"(da), "l"(db), "r"(acc)); \
    }

AP_WGMMA_SS_N192(bf16, "bf16")
AP_WGMMA_SS_N192(f16, "f16")

/* rs with N 128, fp8 e4m3 A (registers, the m16n8k32-style fragment: four bytes of K per
 * register) and B (shared memory, K-major, the only major fp8 takes), K 32 per instruction; acc
 * 0 overwrites d. For the kit's Hopper prefill over fp8 K (S = Q K^T with Q quantized). */
__device__ __forceinline__ void wgmma_rs_n128_e4m3(float (&d)[64], const uint32_t (&a)[4],
                                                   uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, "
        "%7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
        "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
        "%58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : AP_WGMMA_D64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* ss with N 128, fp8 e4m3 A and B both from shared memory (K-major, 128-byte swizzle), K 32 per
 * instruction; acc 0 overwrites d. For the kit's Hopper prefill at Q/K head dim 192 over fp8 K
 * (Q's second e4m3 term kept in shared memory). */
__device__ __forceinline__ void wgmma_ss_n128_e4m3(float (&d)[64], uint64_t da, uint64_t db,
                                                   int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, "
        "%7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
        "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
        "%58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
        : AP_WGMMA_D64(d)
        : "l"(da), "l"(db), "r"(acc));
}

#undef AP_WGMMA_SS_N128
#undef AP_WGMMA_SS_N32
#undef AP_WGMMA_SS_N256T
#undef AP_WGMMA_RS_N128
#undef AP_WGMMA_RS_N64
#undef AP_WGMMA_SS_N64
#undef AP_WGMMA_SS_N192
#undef AP_WGMMA_SS_N80
#undef AP_WGMMA_D32_AT
#undef AP_WGMMA_D32
#undef AP_WGMMA_D64
#undef AP_WGMMA_D128

} // namespace ap_sm90

#endif /* AP_COMMON_WGMMA_CUH */
