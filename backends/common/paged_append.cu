// paged_append.cu: writes new tokens' K and V into their paged-cache slots (fp8: quantized).
#include <cuda_runtime.h>

#include "cuda_status.cuh"
#include "dispatch.cuh"
#include "dtype.cuh"
#include "kit.h"
#include "paged_kv.cuh"

namespace {

constexpr int kVec = 8; // elements per thread: one 16-byte load of 16-bit input
constexpr int kThreads = 256;

struct paged_append_args {
    const uint8_t *src[2];   // k, v
    int64_t stride_token[2]; // in elements
    int64_t stride_head[2];
    uint8_t *pages[2];
    float scale[2]; // fp8: the layer's k_scale, v_scale (the divisor)
    const int32_t *slots;
    int32_t num_tokens;
    int32_t num_kv_heads;
    int32_t head_dim;
};

// One thread moves 8 elements of one (token, head) row; blockIdx.y picks K (0) or V (1).
//   16-bit cache: cache[slot][head][d] = x (a copy).
//   fp8 cache:    cache[slot][head][d] = sat_e4m3(x / scale), rounded to nearest even, the same
//                 bits as the host's ap_float_to_fp8_e4m3 (a true division, no reciprocal).
template <typename IN, bool FP8> __global__ void ap_paged_append_kernel(const paged_append_args a) {
    const int which = blockIdx.y;
    const int vecs = a.head_dim / kVec;
    const int64_t idx = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (idx >= (int64_t)a.num_tokens * a.num_kv_heads * vecs) return;
    const int vec = (int)(idx % vecs);
    const int64_t row = idx / vecs;
    const int head = (int)(row % a.num_kv_heads);
    const int token = (int)(row / a.num_kv_heads);
    const int32_t slot = __ldg(a.slots + token);
    if (slot < 0) return;
    const IN *src = reinterpret_cast<const IN *>(a.src[which]) + token * a.stride_token[which] +
                    head * a.stride_head[which] + vec * kVec;
    const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(src));
    const int64_t dst_elem = ap_paged_row(slot, head, a.num_kv_heads, a.head_dim) + vec * kVec;
    if constexpr (!FP8) {
        *reinterpret_cast<uint4 *>(a.pages[which] + dst_elem * (int64_t)sizeof(IN)) = raw;
    } else {
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
        const float scale = a.scale[which];
        uint32_t packed[2] = {0u, 0u};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 x = ap_unpack2<IN>(words[i]);
            const uint32_t lo = ap_float_to_fp8_e4m3_dev(x.x / scale);
            const uint32_t hi = ap_float_to_fp8_e4m3_dev(x.y / scale);
            packed[i >> 1] |= (lo | (hi << 8)) << (16 * (i & 1));
        }
        *reinterpret_cast<uint2 *>(a.pages[which] + dst_elem) = make_uint2(packed[0], packed[1]);
    }
}

} // namespace

extern "C" ap_status ap_kit_paged_append_run(const ap_kit_append_args *p, void *stream,
                                             const char *who, ap_msgbuf *msg) {
    paged_append_args a;
    a.src[0] = static_cast<const uint8_t *>(p->k);
    a.src[1] = static_cast<const uint8_t *>(p->v);
    a.stride_token[0] = p->k_stride_token;
    a.stride_token[1] = p->v_stride_token;
    a.stride_head[0] = p->k_stride_head;
    a.stride_head[1] = p->v_stride_head;
    a.pages[0] = static_cast<uint8_t *>(p->k_pages);
    a.pages[1] = static_cast<uint8_t *>(p->v_pages);
    a.scale[0] = p->k_scale;
    a.scale[1] = p->v_scale;
    a.slots = p->slots;
    a.num_tokens = p->num_tokens;
    a.num_kv_heads = p->num_kv_heads;
    a.head_dim = p->head_dim;
    const int64_t threads = (int64_t)p->num_tokens * p->num_kv_heads * (p->head_dim / kVec);
    const dim3 grid((unsigned)((threads + kThreads - 1) / kThreads), 2);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    // fp8: quantize from bf16 or f16; a 16-bit cache of the input's type: a byte copy
    const bool served = p->head_dim % kVec == 0 && ap_dispatch_q(p->in_dtype, false, [&](auto in) {
                            using IT = typename decltype(in)::type;
                            return ap_dispatch_kv<IT>(p->kv_dtype, false, [&](auto kv) {
                                constexpr bool fp8 =
                                    std::is_same<typename decltype(kv)::type, ap_fp8_e4m3>::value;
                                using KT = typename std::conditional<fp8, IT, __nv_bfloat16>::type;
                                if (p->num_tokens > 0)
                                    ap_paged_append_kernel<KT, fp8><<<grid, kThreads, 0, s>>>(a);
                                return true;
                            });
                        });
    if (!served) {
        ap_msgbuf_add(msg,
                      "%s: KV append: no kernel for input %s into a cache of %s with head_dim %d",
                      who, ap_dtype_str(p->in_dtype), ap_dtype_str(p->kv_dtype), p->head_dim);
        return AP_ERR_UNSUPPORTED;
    }
    if (p->num_tokens == 0) return AP_OK;
    return ap_cuda_launch_status(who, "ap_paged_append_kernel", msg);
}
