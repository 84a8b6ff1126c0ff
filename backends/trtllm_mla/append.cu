// append.cu: MLA's append_kv/1: RoPE on the new k_pe (the last 64 values of each latent row) and
// on q's rope part, quantize, and write the latent rows [c | k_pe] into their cache slots, in one
// kernel whose grid has two kinds of block: latent blocks (a thread takes four units of 8 values,
// one 16-byte load each, and loads them all before it writes any) and q blocks (a thread takes
// one unit offset of four heads of a token, with one position and one cos/sin load for the four).
// Under neox a rope unit in the first half also loads its partner unit 32 values on and writes
// both. Rotation in float32 with each product and sum rounded on its own (__fmul_rn / __fadd_rn
// are never contracted into an FMA):
//   x_a' = x_a * cos - x_b * sin,   x_b' = x_b * cos + x_a * sin
// pairs (i, i + 32) for neox, (2i, 2i + 1) otherwise; cos/sin of pair i at position p are
// cos_sin[p][i] and cos_sin[p][32 + i]. The cache value is the rotated float rounded once: to
// bf16 (RNE) or to sat_e4m3(x / k_scale) with a float32 division (a reciprocal multiply would
// round differently from cpu_ref's division now and then, so it stays a division).
#include <cuda_runtime.h>

#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/pdl.cuh"
#include "mla.h"

#define MLA_WHO "trtllm_mla append_kv"

namespace {

constexpr int kThreads = 256;

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

// Writes 8 rotated-or-copied values to cache slot `slot` at value offset d.
__device__ __forceinline__ void store_latent(const mla_append_params &p, int64_t slot, int d,
                                             const float x[8]) {
    if (p.kv_dtype == AP_DTYPE_FP8_E4M3)
        ap_store8<ap_fp8_e4m3>::run(static_cast<uint8_t *>(p.kv_pages) + slot * MLA_ROW + d, x,
                                    p.k_scale);
    else
        ap_store8<__nv_bfloat16>::run(static_cast<uint8_t *>(p.kv_pages) + (slot * MLA_ROW + d) * 2,
                                      x, 1.0f);
}

// The cos and sin of the pairs a rope unit at rotary offset r0 (a multiple of 8) rotates: under
// neox the 8 pairs r0 .. r0 + 7 (the unit and its partner 32 values on), else the 4 pairs
// r0 / 2 .. + 3 (in c[0..3], s[0..3]).
template <bool kNeox>
__device__ __forceinline__ void load_cos_sin(const mla_append_params &p, int32_t pos, int r0,
                                             bool cs_vec, float c[8], float s[8]) {
    const float *cs = p.cos_sin + static_cast<int64_t>(pos) * MLA_ROPE;
    if (kNeox) {
        load_f<8>(cs + r0, cs_vec, c);
        load_f<8>(cs + 32 + r0, cs_vec, s);
    } else {
        load_f<4>(cs + (r0 >> 1), cs_vec, c);
        load_f<4>(cs + 32 + (r0 >> 1), cs_vec, s);
    }
}

// A row's work in units of 8 values: its unrotated units (copies), then its rope units: under
// neox the 4 first-half units, each of which also loads, rotates and writes its partner unit 32
// values on; otherwise all 8, each rotating its 4 pairs in place.
template <bool kNeox> struct rope_units { static constexpr int count = kNeox ? 4 : 8; };

// Unit u of a row of `width` values whose first `copies` units are copies: its value offset.
__device__ __forceinline__ int unit_offset(int u, int copies, int width) {
    return u < copies ? u * 8 : width - MLA_ROPE + (u - copies) * 8;
}

// The latent side: token t's row has 64 copy units (c) and the rope units of k_pe; a thread takes
// kUnitsPerThread units kThreads apart (t = i / units_per_row: a division by a constant) and
// issues all their loads (values, position, slot) before it converts or stores any.
constexpr int kUnitsPerThread = 4;

template <typename IDX, bool kNeox>
__device__ __forceinline__ void latent_part(const mla_append_params &p, IDX block, bool cs_vec) {
    constexpr int kCopies = (MLA_ROW - MLA_ROPE) / 8;
    constexpr IDX kRowUnits = kCopies + rope_units<kNeox>::count;
    const IDX total = kRowUnits * static_cast<IDX>(p.num_tokens);
    const IDX first = block * (kThreads * kUnitsPerThread) + threadIdx.x;
    uint4 x[kUnitsPerThread], y[kUnitsPerThread];
    int32_t pos[kUnitsPerThread], slot[kUnitsPerThread];
    int d[kUnitsPerThread];
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; j++) {
        const IDX i = first + static_cast<IDX>(j) * kThreads;
        d[j] = -1, pos[j] = -1, slot[j] = -1;
        if (i >= total) continue;
        const IDX t = i / kRowUnits;
        const int u = static_cast<int>(i - t * kRowUnits);
        d[j] = unit_offset(u, kCopies, MLA_ROW);
        pos[j] = __ldg(p.positions + static_cast<int64_t>(t) * p.positions_stride);
        slot[j] = __ldg(p.out_loc + static_cast<int64_t>(t) * p.out_loc_stride);
        const __nv_bfloat16 *row =
            static_cast<const __nv_bfloat16 *>(p.k) + static_cast<int64_t>(t) * p.k_stride_t;
        x[j] = __ldcs(reinterpret_cast<const uint4 *>(row + d[j]));
        if (kNeox && u >= kCopies) y[j] = __ldcs(reinterpret_cast<const uint4 *>(row + d[j] + 32));
    }
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; j++) {
        if (d[j] < 0 || pos[j] < 0 || pos[j] >= p.max_position || slot[j] < 0 ||
            slot[j] >= p.num_slots)
            continue;
        float v[8], w[8];
        ap_unpack8<__nv_bfloat16>(x[j], v);
        const int r0 = d[j] - (MLA_ROW - MLA_ROPE);
        if (r0 >= 0) {
            float c[8], s[8];
            load_cos_sin<kNeox>(p, pos[j], r0, cs_vec, c, s);
            if (kNeox) {
                ap_unpack8<__nv_bfloat16>(y[j], w);
                rotate_neox(v, w, c, s);
            } else {
                rotate_interleaved(v, c, s);
            }
        }
        store_latent(p, slot[j], d[j], v);
        if (kNeox && r0 >= 0) store_latent(p, slot[j], d[j] + 32, w);
    }
}

// What the q side's blocks need beyond the params: a q row's units (its copies, when q_out is
// not q and q is latent-width, then its rope units) and the head groups per token, each with its
// reciprocal for the 32-bit index.
struct q_shape {
    uint32_t latent_blocks; // blocks before the first q block
    int32_t units, copies, groups;
    ap_div_rcp units_rcp, groups_rcp;
};

template <typename IDX> __device__ __forceinline__ IDX div_by(IDX n, int32_t d, ap_div_rcp r) {
    if constexpr (sizeof(IDX) == 4)
        return ap_div_rcp_apply(n, r);
    else
        return n / static_cast<IDX>(d);
}

// The q side: a thread takes one unit offset of kHeadsPerThread heads of one token, so the
// token's position and the unit's cos/sin are loaded once for all of them; index i is (token,
// head group, unit), the unit fastest, so 8 neighbouring threads cover one 128-byte rope slice.
constexpr int kHeadsPerThread = 4;

template <typename IDX, bool kNeox>
__device__ __forceinline__ void q_part(const mla_append_params &p, const q_shape &g, IDX block,
                                       bool cs_vec) {
    const IDX total =
        static_cast<IDX>(g.units) * static_cast<IDX>(g.groups) * static_cast<IDX>(p.num_tokens);
    const IDX i = block * kThreads + threadIdx.x;
    if (i >= total) return;
    const IDX rest = div_by<IDX>(i, g.units, g.units_rcp);
    const int u = static_cast<int>(i - rest * static_cast<IDX>(g.units));
    const IDX t = div_by<IDX>(rest, g.groups, g.groups_rcp);
    const int h0 = static_cast<int>(rest - t * static_cast<IDX>(g.groups)) * kHeadsPerThread;
    const int d = unit_offset(u, g.copies, p.q_dim);
    const int r0 = d - (p.q_dim - MLA_ROPE);
    const int32_t pos = __ldg(p.positions + static_cast<int64_t>(t) * p.positions_stride);
    const __nv_bfloat16 *row = static_cast<const __nv_bfloat16 *>(p.q) +
                               static_cast<int64_t>(t) * p.q_stride_t + h0 * p.q_stride_h + d;
    uint4 x[kHeadsPerThread], y[kHeadsPerThread];
#pragma unroll
    for (int k = 0; k < kHeadsPerThread; k++) {
        if (h0 + k >= p.num_heads) continue;
        x[k] = __ldcs(reinterpret_cast<const uint4 *>(row + k * p.q_stride_h));
        if (kNeox && r0 >= 0)
            y[k] = __ldcs(reinterpret_cast<const uint4 *>(row + k * p.q_stride_h + 32));
    }
    if (pos < 0 || pos >= p.max_position) return;
    float c[8], s[8];
    if (r0 >= 0) load_cos_sin<kNeox>(p, pos, r0, cs_vec, c, s);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.q_out) +
                         static_cast<int64_t>(t) * p.qo_stride_t + h0 * p.qo_stride_h + d;
#pragma unroll
    for (int k = 0; k < kHeadsPerThread; k++) {
        if (h0 + k >= p.num_heads) continue;
        float v[8], w[8];
        ap_unpack8<__nv_bfloat16>(x[k], v);
        if (r0 >= 0) {
            if (kNeox) {
                ap_unpack8<__nv_bfloat16>(y[k], w);
                rotate_neox(v, w, c, s);
            } else {
                rotate_interleaved(v, c, s);
            }
        }
        uint8_t *dst = reinterpret_cast<uint8_t *>(out + k * p.qo_stride_h);
        ap_store8<__nv_bfloat16>::run(dst, v, 1.0f);
        if (kNeox && r0 >= 0) ap_store8<__nv_bfloat16>::run(dst + 64, w, 1.0f);
    }
}

// One grid, two kinds of block: the first g.latent_blocks write the latent rows into the cache,
// the rest rotate q (H16: the latent side is 30% of the bytes, H128: 6%; the q side's blocks need
// no slot and share one cos/sin load over 4 heads). IDX is uint32_t when every index is below
// 2^31 (ap_div_rcp's range), so no 64-bit division.
template <typename IDX, bool kNeox>
__global__ void __launch_bounds__(kThreads)
    mla_append_kernel(const mla_append_params p, const q_shape g) {
    ap_pdl_wait();
    ap_pdl_launch_dependents();
    const bool cs_vec = (reinterpret_cast<uintptr_t>(p.cos_sin) & 15) == 0;
    if (blockIdx.x < g.latent_blocks)
        latent_part<IDX, kNeox>(p, static_cast<IDX>(blockIdx.x), cs_vec);
    else
        q_part<IDX, kNeox>(p, g, static_cast<IDX>(blockIdx.x - g.latent_blocks), cs_vec);
}

template <typename IDX>
cudaError_t mla_append_launch(const mla_append_params &p, const q_shape &g, dim3 grid,
                              cudaStream_t stream) {
    return p.is_neox ? ap_launch(mla_append_kernel<IDX, true>, grid, dim3(kThreads), 0, stream,
                                 true, p, g)
                     : ap_launch(mla_append_kernel<IDX, false>, grid, dim3(kThreads), 0, stream,
                                 true, p, g);
}

} // namespace

extern "C" ap_status mla_append_run(const mla_append_params *p, void *stream_ptr, ap_msgbuf *msg) {
    if (p->num_tokens == 0) return AP_OK;
    if (p->rotary_dim != MLA_ROPE ||
        (p->q != NULL && p->q_dim != MLA_ROPE && p->q_dim != MLA_ROW)) {
        ap_msgbuf_add(msg, MLA_WHO ": rotary_dim %d / q_dim %d: the kernel takes 64 and 64 or 576",
                      p->rotary_dim, p->q_dim);
        return AP_ERR_UNSUPPORTED;
    }
    const int64_t rope = p->is_neox ? 4 : 8;
    const int64_t latent = p->num_tokens * ((MLA_ROW - MLA_ROPE) / 8 + rope);
    constexpr int64_t per_latent_block = int64_t{kThreads} * kUnitsPerThread;
    q_shape g = {};
    // in place, a latent-width q's first 512 values stay as they are: only its rope units
    g.copies = p->q != NULL && p->q_out != p->q ? (p->q_dim - MLA_ROPE) / 8 : 0;
    g.units = g.copies + static_cast<int32_t>(rope);
    g.groups = p->q != NULL ? (p->num_heads + kHeadsPerThread - 1) / kHeadsPerThread : 0;
    const int64_t q_items = p->num_tokens * g.units * g.groups;
    const int64_t latent_blocks = (latent + per_latent_block - 1) / per_latent_block;
    const int64_t blocks = latent_blocks + (q_items + kThreads - 1) / kThreads;
    if (blocks > 0x7fffffff) {
        ap_msgbuf_add(msg, MLA_WHO ": %lld tokens are more than one launch covers",
                      static_cast<long long>(p->num_tokens));
        return AP_ERR_UNSUPPORTED;
    }
    g.latent_blocks = static_cast<uint32_t>(latent_blocks);
    g.units_rcp = ap_div_rcp_make(static_cast<uint32_t>(g.units));
    g.groups_rcp = ap_div_rcp_make(g.groups > 0 ? static_cast<uint32_t>(g.groups) : 1u);
    const dim3 grid(static_cast<unsigned>(blocks));
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    const int64_t narrow = int64_t{1} << 31; // ap_div_rcp's range
    cudaError_t err = latent + per_latent_block < narrow && q_items + kThreads < narrow
                          ? mla_append_launch<uint32_t>(*p, g, grid, stream)
                          : mla_append_launch<uint64_t>(*p, g, grid, stream);
    ap_status st = ap_cuda_status(err, MLA_WHO, "cudaLaunchKernelEx", msg);
    return st != AP_OK ? st : ap_cuda_launch_status(MLA_WHO, "mla_append_kernel", msg);
}
