/* sm90.cuh: the kit's Hopper (sm_90a) primitives, shared by every warp-specialised kernel:
 * shared-memory addresses, mbarriers (init, expect_tx, arrive, wait on a phase), TMA tensor loads
 * completing on an mbarrier (optionally with an L2 cache policy), the wgmma shared-memory
 * descriptor (128-byte swizzle) and the wgmma fence / commit / wait ordering, named barriers,
 * setmaxnreg, ex2, and on the host the driver's cuTensorMapEncodeTiled reached through the
 * runtime. The wgmma instructions themselves are in wgmma.cuh. */
#ifndef AP_COMMON_SM90_CUH
#define AP_COMMON_SM90_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace ap_sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void bar_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}

/* Adds `bytes` to the transaction count of the barrier's current phase without arriving. */
__device__ __forceinline__ void expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}

/* Orders this thread's earlier generic-proxy shared-memory writes before later async-proxy
 * accesses (TMA, wgmma reads) of the same memory. */
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void bar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

/* A consumer warp is done with a stage (its wgmma reads completed: wait_group passed). */
__device__ __forceinline__ void release_stage(uint64_t *bar) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
        bar_arrive(bar);
    }
}

__device__ __forceinline__ void bar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile("{\n.reg .pred done;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}

/* One 3-D box of a tensor map, at coordinates (col, head, row) innermost first, into shared memory;
 * completes on `bar` with the box's bytes (expect_tx). */
__device__ __forceinline__ void tma_load(const CUtensorMap *map, void *dst, uint64_t *bar, int col,
                                         int head, int row) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_u32(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(col), "r"(head),
                 "r"(row)
                 : "memory");
}

/* An L2 policy for data read once: evict it first (createpolicy, the whole access). */
__device__ __forceinline__ uint64_t l2_evict_first() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}

/* tma_load with an L2 cache policy (l2_evict_first). */
__device__ __forceinline__ void tma_load_hint(const CUtensorMap *map, void *dst, uint64_t *bar,
                                              int col, int head, int row, uint64_t policy) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(smem_u32(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(col), "r"(head),
                 "r"(row), "l"(policy)
                 : "memory");
}

/* wgmma shared-memory descriptor, 128-byte swizzle: lbo / sbo in bytes. */
__device__ __forceinline__ uint64_t make_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    uint64_t d = (smem_u32(p) & 0x3FFFF) >> 4;
    d |= static_cast<uint64_t>(lbo >> 4) << 16;
    d |= static_cast<uint64_t>(sbo >> 4) << 32;
    d |= static_cast<uint64_t>(1) << 62;
    return d;
}

/* The descriptor d moved `bytes` on in shared memory: the start address field (bits 0-13, 16-byte
 * units) plus bytes / 16, one 32-bit add. Shared memory ends below 256 KB, so the field never
 * carries into the leading byte offset above it. */
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) {
    const uint32_t lo = static_cast<uint32_t>(d) + (bytes >> 4);
    return (d & 0xFFFFFFFF00000000ull) | lo;
}

__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait1() {
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}

/* 2^x on the special-function unit (flushes denormals; softmax weights that small are 0 anyway). */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* setmaxnreg: the calling warpgroup gives registers back to the CTA's pool (regs_dec) or takes
 * them from it (regs_inc), kN a thread; what the producers give must cover what the consumers
 * take (a producer at 32 beside consumers at 240 deadlocked them). */
template <int kN> constexpr bool kRegsValid = kN % 8 == 0 && kN >= 24 && kN <= 256;
template <int kN> __device__ __forceinline__ void regs_dec() {
    static_assert(kRegsValid<kN>, "setmaxnreg: a multiple of 8, 24..256");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kN));
}
template <int kN> __device__ __forceinline__ void regs_inc() {
    static_assert(kRegsValid<kN>, "setmaxnreg: a multiple of 8, 24..256");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kN));
}

/* Named barrier `id` (1..15; 0 is __syncthreads) over kCount threads, whole warps. */
template <int kCount> __device__ __forceinline__ void named_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kCount) : "memory");
}
template <int kCount> __device__ __forceinline__ void named_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kCount) : "memory");
}
/* named_sync without .aligned (barrier.sync): for a barrier the participating warps
 * reach through different instructions (two warpgroups in their own code, or one function's two
 * template instances). The aligned form wants one instruction for every participating thread
 * (compute-sanitizer's synccheck reports "Divergent thread(s) in block" otherwise), but ptxas
 * treats the code after a non-aligned barrier as divergent and may serialize the wgmma that
 * follows (C7520): trtllm_mla's H128 decode fell from 492 to 363 TFLOP/s with its hand-overs in
 * this form (H100, 2026-11-26). Use it where no wgmma follows in the same warpgroup's path, and
 * check ptxas for C7520. */
template <int kCount> __device__ __forceinline__ void named_sync_split(int id) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "n"(kCount) : "memory");
}

/* Host: the driver's cuTensorMapEncodeTiled through the runtime (nothing links libcuda). */
typedef CUresult (*EncodeTiledFn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                  const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                  const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn encode_tiled_fn() {
    static EncodeTiledFn fn = nullptr;
    if (fn == nullptr) {
        void *ptr = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                             cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess) {
            fn = reinterpret_cast<EncodeTiledFn>(ptr);
        }
    }
    return fn;
}

} // namespace ap_sm90

#endif /* AP_COMMON_SM90_CUH */
