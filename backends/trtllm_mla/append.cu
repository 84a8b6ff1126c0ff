// append.cu: MLA's append_kv/1: RoPE on the new k_pe (the last 64 values of each latent row) and
// on q's rope part, quantize, and write the latent rows [c | k_pe] into their cache slots, in one
// kernel. One thread takes 8 values (one 16-byte load); for a rotated value its partner comes from
// the same row in global memory (L1 holds it). Rotation in float32 with each product and sum
// rounded on its own (__fmul_rn / __fadd_rn are never contracted into an FMA):
//   x_a' = x_a * cos - x_b * sin,   x_b' = x_b * cos + x_a * sin
// pairs (i, i + 32) for neox, (2i, 2i + 1) otherwise; cos/sin of pair i at position p are
// cos_sin[p][i] and cos_sin[p][32 + i]. The cache value is the rotated float rounded once: to
// bf16 (RNE) or to sat_e4m3(x / k_scale) with a float32 division.
#include <cuda_runtime.h>

#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/pdl.cuh"
#include "mla.h"

#define MLA_WHO "trtllm_mla append_kv"

namespace {

constexpr int kThreads = 256;
constexpr int kLatentUnits = MLA_ROW / 8; // 72 units of 8 values per latent row

__device__ __forceinline__ void load8(const __nv_bfloat16 *src, float x[8]) {
    const uint4 v = *reinterpret_cast<const uint4 *>(src);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = ap_unpack2<__nv_bfloat16>(w[i]);
        x[2 * i] = f.x;
        x[2 * i + 1] = f.y;
    }
}

// Neox: rotate pairs (r0 + i, r0 + 32 + i) for the 8 values x (first half) and y (second half).
__device__ __forceinline__ void rotate_neox(float x[8], float y[8], int r0, const float *cs) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float c = __ldg(cs + r0 + i), s = __ldg(cs + 32 + r0 + i);
        const float a = __fsub_rn(__fmul_rn(x[i], c), __fmul_rn(y[i], s));
        const float b = __fadd_rn(__fmul_rn(y[i], c), __fmul_rn(x[i], s));
        x[i] = a;
        y[i] = b;
    }
}

// Interleaved: rotate pairs (2i, 2i + 1) of the 8 values at rope offset r0.
__device__ __forceinline__ void rotate_interleaved(float x[8], int r0, const float *cs) {
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
        const int pair = (r0 + i) >> 1;
        const float c = __ldg(cs + pair), s = __ldg(cs + 32 + pair);
        const float a = __fsub_rn(__fmul_rn(x[i], c), __fmul_rn(x[i + 1], s));
        const float b = __fadd_rn(__fmul_rn(x[i + 1], c), __fmul_rn(x[i], s));
        x[i] = a;
        x[i + 1] = b;
    }
}

__device__ __forceinline__ void store8_bf16(uint8_t *dst, const float x[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = ap_pack2<__nv_bfloat16>(x[2 * i], x[2 * i + 1]);
    *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void store8_fp8(uint8_t *dst, const float x[8], float scale) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; i++)
        w[i >> 2] |= static_cast<uint32_t>(ap_float_to_fp8_e4m3_dev(__fdiv_rn(x[i], scale)))
                     << (8 * (i & 3));
    *reinterpret_cast<uint2 *>(dst) = make_uint2(w[0], w[1]);
}

// Writes 8 rotated-or-copied values to the cache row `dst_row` at value offset d.
__device__ __forceinline__ void store_latent(const mla_append_params &p, int64_t slot, int d,
                                             const float x[8]) {
    if (p.kv_dtype == AP_DTYPE_FP8_E4M3)
        store8_fp8(static_cast<uint8_t *>(p.kv_pages) + slot * MLA_ROW + d, x, p.k_scale);
    else
        store8_bf16(static_cast<uint8_t *>(p.kv_pages) + (slot * MLA_ROW + d) * 2, x);
}

// 8 values at offset d of a row whose rope part (64 wide) starts at rope0. Under neox the unit in
// the first half of the rope part also takes its partner unit (32 further), and the partner's own
// thread does nothing: each value is read and written by one thread, so q_out may alias q.
// Returns the number of units to write (0, 1 or 2) with the second in y at d + 32.
__device__ __forceinline__ int rope_unit(const __nv_bfloat16 *row, int d, int rope0, int neox,
                                         const float *cs, float x[8], float y[8]) {
    if (d < rope0) {
        load8(row + d, x);
        return 1;
    }
    const int r0 = d - rope0;
    if (!neox) {
        load8(row + d, x);
        rotate_interleaved(x, r0, cs);
        return 1;
    }
    if (r0 >= 32) return 0;
    load8(row + d, x);
    load8(row + d + 32, y);
    rotate_neox(x, y, r0, cs);
    return 2;
}

// Unit u (8 values) of token t: a latent unit (u < 72) or a q unit.
__device__ __forceinline__ void append_unit(const mla_append_params &p, int64_t t, int u) {
    const int32_t pos = __ldg(p.positions + t * p.positions_stride);
    if (pos < 0 || pos >= p.max_position) return; // out of the table: left unwritten
    const float *cs = p.cos_sin + static_cast<int64_t>(pos) * p.rotary_dim;
    float x[8], y[8];
    if (u < kLatentUnits) {
        const int32_t slot = __ldg(p.out_loc + t * p.out_loc_stride);
        if (slot < 0 || slot >= p.num_slots) return;
        const __nv_bfloat16 *row = static_cast<const __nv_bfloat16 *>(p.k) + t * p.k_stride_t;
        const int n = rope_unit(row, u * 8, MLA_ROW - p.rotary_dim, p.is_neox, cs, x, y);
        if (n >= 1) store_latent(p, slot, u * 8, x);
        if (n == 2) store_latent(p, slot, u * 8 + 32, y);
        return;
    }
    const int qu = u - kLatentUnits;
    const int per_head = p.q_dim >> 3;
    const int h = qu / per_head, d = (qu - h * per_head) * 8;
    const __nv_bfloat16 *q = static_cast<const __nv_bfloat16 *>(p.q) + t * p.q_stride_t +
                             static_cast<int64_t>(h) * p.q_stride_h;
    uint8_t *qo =
        reinterpret_cast<uint8_t *>(static_cast<__nv_bfloat16 *>(p.q_out) + t * p.qo_stride_t +
                                    static_cast<int64_t>(h) * p.qo_stride_h);
    const int rope0 = p.q_dim - p.rotary_dim;
    if (d < rope0 && p.q_out == p.q) return; // in place and not rotated: nothing to write
    const int n = rope_unit(q, d, rope0, p.is_neox, cs, x, y);
    if (n >= 1) store8_bf16(qo + d * 2, x);
    if (n == 2) store8_bf16(qo + (d + 32) * 2, y);
}

// Flat 1-D grid over tokens x units (72 latent units, then heads * q units): on the H100 a 2-D
// (units x tokens) grid ran 1.3-1.6x slower (short blocks, 28% occupancy). IDX is uint32_t when
// the count fits, so no 64-bit division per thread.
template <typename IDX>
__global__ void __launch_bounds__(kThreads) mla_append_kernel(const mla_append_params p) {
    ap_pdl_wait();
    ap_pdl_launch_dependents();
    const IDX q_units = p.q != NULL ? static_cast<IDX>(p.num_heads * (p.q_dim >> 3)) : 0;
    const IDX units = kLatentUnits + q_units;
    const IDX i = static_cast<IDX>(blockIdx.x) * kThreads + threadIdx.x;
    if (i >= units * static_cast<IDX>(p.num_tokens)) return;
    const IDX t = i / units;
    append_unit(p, static_cast<int64_t>(t), static_cast<int>(i - t * units));
}

} // namespace

extern "C" ap_status mla_append_run(const mla_append_params *p, void *stream_ptr, ap_msgbuf *msg) {
    if (p->num_tokens == 0) return AP_OK;
    const int q_units = p->q != NULL ? p->num_heads * (p->q_dim >> 3) : 0;
    const int64_t n = p->num_tokens * (kLatentUnits + q_units);
    const dim3 grid(static_cast<unsigned>((n + kThreads - 1) / kThreads));
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    cudaError_t err =
        n + kThreads < (int64_t{1} << 32)
            ? ap_launch(mla_append_kernel<uint32_t>, grid, dim3(kThreads), 0, stream, true, *p)
            : ap_launch(mla_append_kernel<uint64_t>, grid, dim3(kThreads), 0, stream, true, *p);
    ap_status st = ap_cuda_status(err, MLA_WHO, "cudaLaunchKernelEx", msg);
    return st != AP_OK ? st : ap_cuda_launch_status(MLA_WHO, "mla_append_kernel", msg);
}
