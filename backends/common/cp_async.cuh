// cp_async.cuh: asynchronous 16-byte global -> shared copies (sm_80+) and their group waits.
#ifndef AP_COMMON_CP_ASYNC_CUH
#define AP_COMMON_CP_ASYNC_CUH

#include <stdint.h>

// Copy 16 bytes from global `src` to shared address `dst` without passing through registers,
// bypassing L1 (the data is read once). With `valid` false nothing is read and the 16 bytes of
// `dst` are zero-filled, so masked rows hold finite values.
__device__ __forceinline__ void ap_cp_async_16(uint32_t dst, const void *src, bool valid) {
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// Copy BYTES (4, 8 or 16) bytes, cached in L1 (cp.async.cg takes only 16): small rows such as
// NVFP4's block scales. With `valid` false `dst` is zero-filled, as above.
template <int BYTES>
__device__ __forceinline__ void ap_cp_async_small(uint32_t dst, const void *src, bool valid) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
    int src_bytes = valid ? BYTES : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES),
                 "r"(src_bytes)
                 : "memory");
}

// Close the group of copies this thread issued since the last commit.
__device__ __forceinline__ void ap_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most `PENDING` of this thread's committed groups are still in flight. Other
// threads' copies become visible only after a barrier (__syncwarp or __syncthreads) as well.
template <int PENDING> __device__ __forceinline__ void ap_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

#endif // AP_COMMON_CP_ASYNC_CUH
