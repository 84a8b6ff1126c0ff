// append.cu: MLA's append_kv/1: RoPE on the new k_pe (the last 64 values of each latent row) and
// on q's rope part, quantize, and write the latent rows [c | k_pe] into their cache slots, in one
// kernel. A unit is 8 values (one 16-byte load); a thread takes four units and loads them all
// before it writes any; under neox the unit in the first half of a rope part also loads its
// partner unit and writes both. Rotation in float32 with each product and sum
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

// Neox: rotate pairs (r0 + i, r0 + 32 + i) for the 8 values x (first half) and y (second half),
// with c[i], s[i] the cos and sin of pair r0 + i.
__device__ __forceinline__ void rotate_neox(float x[8], float y[8], const float c[8],
                                            const float s[8]) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float a = __fsub_rn(__fmul_rn(x[i], c[i]), __fmul_rn(y[i], s[i]));
        const float b = __fadd_rn(__fmul_rn(y[i], c[i]), __fmul_rn(x[i], s[i]));
        x[i] = a;
        y[i] = b;
    }
}

// Interleaved: rotate pairs (2i, 2i + 1) of the 8 values, with c[i], s[i] the cos and sin of
// pair r0 / 2 + i.
__device__ __forceinline__ void rotate_interleaved(float x[8], const float c[4], const float s[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float a = __fsub_rn(__fmul_rn(x[2 * i], c[i]), __fmul_rn(x[2 * i + 1], s[i]));
        const float b = __fadd_rn(__fmul_rn(x[2 * i + 1], c[i]), __fmul_rn(x[2 * i], s[i]));
        x[2 * i] = a;
        x[2 * i + 1] = b;
    }
}

// N (4 or 8) consecutive floats from p (N / 4 float4 loads when vec: p 16-byte aligned).
template <int N> __device__ __forceinline__ void load_f(const float *p, bool vec, float out[N]) {
    if (vec) {
#pragma unroll
        for (int k = 0; k < N / 4; k++) {
            const float4 f = __ldg(reinterpret_cast<const float4 *>(p) + k);
            out[4 * k] = f.x, out[4 * k + 1] = f.y, out[4 * k + 2] = f.z, out[4 * k + 3] = f.w;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < N; i++) out[i] = __ldg(p + i);
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

// A unit's inputs, loaded before any unit of the thread is converted: its 8 values (x), under
// neox in the first half of a rope part its partner unit 32 values further (y), the token's
// position and (latent units) slot, and what to do: kind 0 nothing (out of the grid; under neox a
// second-half rope unit, which its partner's thread writes; an unrotated q unit in place), 1
// copy, 2 rotate interleaved, 3 rotate neox (the pair x, y).
struct unit_in {
    uint4 x, y;
    int32_t pos, slot;
    int kind, d, r0;
    uint8_t *dst; // the cache row (latent) or q_out's row (q) at value 0
};

// Unit u (8 values) of token t: a latent unit (u < 72) or a q unit. Issues its loads.
__device__ __forceinline__ unit_in load_unit(const mla_append_params &p, int64_t t, int u) {
    unit_in in;
    in.kind = 0;
    in.pos = __ldg(p.positions + t * p.positions_stride);
    const __nv_bfloat16 *row;
    int rope0;
    if (u < kLatentUnits) {
        in.slot = __ldg(p.out_loc + t * p.out_loc_stride);
        row = static_cast<const __nv_bfloat16 *>(p.k) + t * p.k_stride_t;
        rope0 = MLA_ROW - p.rotary_dim;
        in.d = u * 8;
        in.dst = nullptr; // from the slot, once it is checked
    } else {
        in.slot = 0;
        const int qu = u - kLatentUnits;
        const int per_head = p.q_dim >> 3;
        const int h = qu / per_head;
        in.d = (qu - h * per_head) * 8;
        row = static_cast<const __nv_bfloat16 *>(p.q) + t * p.q_stride_t +
              static_cast<int64_t>(h) * p.q_stride_h;
        in.dst =
            reinterpret_cast<uint8_t *>(static_cast<__nv_bfloat16 *>(p.q_out) + t * p.qo_stride_t +
                                        static_cast<int64_t>(h) * p.qo_stride_h);
        rope0 = p.q_dim - p.rotary_dim;
        if (in.d < rope0 && p.q_out == p.q) return in; // in place and not rotated: nothing
    }
    in.r0 = in.d - rope0;
    if (in.d < rope0)
        in.kind = 1;
    else if (!p.is_neox)
        in.kind = 2;
    else if (in.r0 < 32)
        in.kind = 3;
    else
        return in;
    in.x = __ldcs(reinterpret_cast<const uint4 *>(row + in.d));
    if (in.kind == 3) in.y = __ldcs(reinterpret_cast<const uint4 *>(row + in.d + 32));
    return in;
}

// Rotates (kind 2, 3) and stores a loaded unit: latent units into their cache slot, q units
// into q_out (bf16).
__device__ __forceinline__ void store_unit(const mla_append_params &p, const unit_in &in,
                                           bool cs_vec) {
    if (in.kind == 0 || in.pos < 0 || in.pos >= p.max_position) return;
    const bool latent = in.dst == nullptr;
    if (latent && (in.slot < 0 || in.slot >= p.num_slots)) return;
    float x[8], y[8];
    ap_unpack8<__nv_bfloat16>(in.x, x);
    if (in.kind >= 2) {
        const float *cs = p.cos_sin + static_cast<int64_t>(in.pos) * p.rotary_dim;
        float c[8], s[8];
        if (in.kind == 2) { // pairs r0 / 2 .. + 3; r0 is a multiple of 8
            load_f<4>(cs + (in.r0 >> 1), cs_vec, c);
            load_f<4>(cs + 32 + (in.r0 >> 1), cs_vec, s);
            rotate_interleaved(x, c, s);
        } else {
            load_f<8>(cs + in.r0, cs_vec, c);
            load_f<8>(cs + 32 + in.r0, cs_vec, s);
            ap_unpack8<__nv_bfloat16>(in.y, y);
            rotate_neox(x, y, c, s);
        }
    }
    if (latent) {
        store_latent(p, in.slot, in.d, x);
        if (in.kind == 3) store_latent(p, in.slot, in.d + 32, y);
        return;
    }
    store8_bf16(in.dst + in.d * 2, x);
    if (in.kind == 3) store8_bf16(in.dst + (in.d + 32) * 2, y);
}

// Flat 1-D grid over tokens x units (72 latent units, then heads * q units): on the H100 a 2-D
// (units x tokens) grid ran 1.3-1.6x slower (short blocks, 28% occupancy). Each thread takes
// kUnitsPerThread units kThreads apart and issues all their loads (values, positions, slots)
// before it rotates or stores any. IDX is uint32_t when the count fits, so no 64-bit division.
constexpr int kUnitsPerThread = 4;

template <typename IDX>
__global__ void __launch_bounds__(kThreads) mla_append_kernel(const mla_append_params p) {
    ap_pdl_wait();
    ap_pdl_launch_dependents();
    const IDX q_units = p.q != NULL ? static_cast<IDX>(p.num_heads * (p.q_dim >> 3)) : 0;
    const IDX units = kLatentUnits + q_units;
    const IDX total = units * static_cast<IDX>(p.num_tokens);
    const IDX first = static_cast<IDX>(blockIdx.x) * (kThreads * kUnitsPerThread) + threadIdx.x;
    const bool cs_vec = (reinterpret_cast<uintptr_t>(p.cos_sin) & 15) == 0;
    unit_in in[kUnitsPerThread];
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; j++) {
        const IDX i = first + static_cast<IDX>(j) * kThreads;
        if (i < total) {
            const IDX t = i / units;
            in[j] = load_unit(p, static_cast<int64_t>(t), static_cast<int>(i - t * units));
        } else {
            in[j].kind = 0;
        }
    }
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; j++) store_unit(p, in[j], cs_vec);
}

} // namespace

extern "C" ap_status mla_append_run(const mla_append_params *p, void *stream_ptr, ap_msgbuf *msg) {
    if (p->num_tokens == 0) return AP_OK;
    const int q_units = p->q != NULL ? p->num_heads * (p->q_dim >> 3) : 0;
    const int64_t n = p->num_tokens * (kLatentUnits + q_units);
    constexpr int64_t per_cta = int64_t{kThreads} * kUnitsPerThread;
    const dim3 grid(static_cast<unsigned>((n + per_cta - 1) / per_cta));
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    cudaError_t err =
        n + per_cta < (int64_t{1} << 32)
            ? ap_launch(mla_append_kernel<uint32_t>, grid, dim3(kThreads), 0, stream, true, *p)
            : ap_launch(mla_append_kernel<uint64_t>, grid, dim3(kThreads), 0, stream, true, *p);
    ap_status st = ap_cuda_status(err, MLA_WHO, "cudaLaunchKernelEx", msg);
    return st != AP_OK ? st : ap_cuda_launch_status(MLA_WHO, "mla_append_kernel", msg);
}
