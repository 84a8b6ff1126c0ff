// append.cu: MLA's append_kv/1: RoPE on the new k_pe (the last 64 values of each latent row) and
// on q's rope part, quantize, and write the latent rows [c | k_pe] into their cache slots, in one
// kernel. Rotation in float32 with each product and sum rounded on its own (rope.cuh):
//   x_a' = x_a * cos - x_b * sin,   x_b' = x_b * cos + x_a * sin
// pairs (i, i + 32) for neox, (2i, 2i + 1) otherwise; cos/sin of pair i at position p are
// cos_sin[p][i] and cos_sin[p][32 + i]. The cache value is the rotated float rounded once: to
// bf16 (RNE) or to sat_e4m3(x / k_scale) with a float32 division (numeric/e4m3_div.h's multiply
// and correction, the same bytes, by the kit's ap_store8).
//
// Two kinds of CTA, interleaved in one grid, and no thread does both kinds of work:
//  - copy CTAs: a warp takes kCopyRowsPerWarp rows of 64 units (a unit is 8 values, one 16-byte
//    load): the c part (512 values) of latent rows, quantized into their cache slots, and, when q
//    is latent-width and not rotated in place, q's first 512 values into q_out. A lane takes units
//    lane and lane + 32 of each row (a warp's load covers 512 contiguous bytes).
//  - rope CTAs: 8 lanes (one per unit of the 64 rotated values) take a group of at most 4 or 6
//    (rope_rows_per_thread) rope rows of one token: its k_pe (rope row 0) and its q heads' rope
//    parts (rows 1 .. H). The group's cos/sin are loaded once for all its rows; under neox a lane
//    gets its partner unit (4 units away) from lane ^ 4 by shuffle, so every lane loads and
//    writes only its own unit.
// Every thread issues all its 16-byte loads (and its positions and slots) before any math.
#include <cuda_runtime.h>

#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/pdl.cuh"
#include "../common/rope.cuh"
#include "mla.h"

#define MLA_WHO "trtllm_mla append_kv"

namespace {

constexpr int kThreads = 128;
constexpr int kCopyRowsPerWarp = 2;              // 4 units of 16 bytes in flight per lane
constexpr int kCopyUnits = 2 * kCopyRowsPerWarp; // units per lane
constexpr int kCopyRowsPerCta = kThreads / 32 * kCopyRowsPerWarp;
// Rope rows per thread, at most: 6 interleaved (8 CTAs a SM at 64 registers, no spill; H16 fp8
// append 2495 -> 2530 GB/s of GPU time against 4 rows at 10 CTAs, H100 call 85), 4 neox (6 rows
// spill 20 bytes there).
template <bool NEOX> constexpr int rope_rows_per_thread() {
    return NEOX ? 4 : 6;
}
constexpr int kRopeGroupsPerCta = kThreads / 8; // 8 lanes per group of rope rows
constexpr int kRope0 = MLA_ROW - MLA_ROPE;      // 512: where k_pe starts in a latent row

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

// Writes 8 rotated-or-copied values to slot's cache row at value offset d (the kit's ap_store8).
__device__ __forceinline__ void store_latent(const mla_append_params &p, int64_t slot, int d,
                                             const float x[8]) {
    if (p.kv_dtype == AP_DTYPE_FP8_E4M3)
        ap_store8<ap_fp8_e4m3>::run(static_cast<uint8_t *>(p.kv_pages) + slot * MLA_ROW + d, x,
                                    p.k_scale, p.k_rcp);
    else
        ap_store8<__nv_bfloat16>::run(static_cast<uint8_t *>(p.kv_pages) + (slot * MLA_ROW + d) * 2,
                                      x, 1.0f);
}

// The grid's shape, from the host: which CTAs copy and which rotate, and how rope rows group.
struct append_grid {
    uint64_t copy_rows;        // T latent rows, then T * H q rows (latent-width q out of place)
    uint64_t rope_groups;      // T * groups_per_token
    uint32_t rope_rows;        // per token: k_pe, then one row per q head when q is given
    uint32_t groups_per_token; // ceil(rope_rows / rope_rows_per_thread); group i takes rows
                               // [i * rope_rows / groups, (i + 1) * rope_rows / groups)
    uint32_t copy_ctas, ctas;
};

__device__ __forceinline__ bool position_ok(const mla_append_params &p, int32_t pos) {
    return pos >= 0 && pos < p.max_position;
}

__device__ __forceinline__ bool slot_ok(const mla_append_params &p, int32_t slot) {
    return slot >= 0 && slot < p.num_slots;
}

// Copy row `row` (< copy_rows): its token, and for a q row its head (-1 for a latent row).
template <typename IDX>
__device__ __forceinline__ void copy_row_token(const mla_append_params &p, IDX row, int64_t &t,
                                               int &h) {
    const IDX T = static_cast<IDX>(p.num_tokens);
    if (row < T) {
        t = static_cast<int64_t>(row);
        h = -1;
        return;
    }
    const IDX qr = row - T, H = static_cast<IDX>(p.num_heads);
    const IDX tq = qr / H;
    t = static_cast<int64_t>(tq);
    h = static_cast<int>(qr - tq * H);
}

// A copy CTA: kCopyRowsPerCta rows of 64 units, kCopyRowsPerWarp to a warp.
template <typename IDX>
__device__ __forceinline__ void copy_part(const mla_append_params &p, const append_grid &g,
                                          IDX cta) {
    const int lane = threadIdx.x & 31;
    const IDX row0 = (cta * (kThreads / 32) + (threadIdx.x >> 5)) * kCopyRowsPerWarp;
    uint4 x[kCopyUnits];
    int32_t pos[kCopyRowsPerWarp], slot[kCopyRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kCopyRowsPerWarp; r++) {
        pos[r] = -1;
        slot[r] = -1;
        const IDX row = row0 + r;
        if (row >= static_cast<IDX>(g.copy_rows)) continue;
        int64_t t;
        int h;
        copy_row_token(p, row, t, h);
        pos[r] = __ldg(p.positions + t * p.positions_stride);
        const __nv_bfloat16 *src;
        if (h < 0) {
            slot[r] = __ldg(p.out_loc + t * p.out_loc_stride);
            src = static_cast<const __nv_bfloat16 *>(p.k) + t * p.k_stride_t;
        } else {
            src = static_cast<const __nv_bfloat16 *>(p.q) + t * p.q_stride_t +
                  static_cast<int64_t>(h) * p.q_stride_h;
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
            x[2 * r + j] = __ldcs(reinterpret_cast<const uint4 *>(src + (lane + 32 * j) * 8));
    }
#pragma unroll
    for (int r = 0; r < kCopyRowsPerWarp; r++) {
        const IDX row = row0 + r;
        if (row >= static_cast<IDX>(g.copy_rows) || !position_ok(p, pos[r])) continue;
        int64_t t;
        int h;
        copy_row_token(p, row, t, h);
        if (h < 0 && !slot_ok(p, slot[r])) continue;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int d = (lane + 32 * j) * 8;
            float v[8];
            ap_unpack8<__nv_bfloat16>(x[2 * r + j], v);
            if (h < 0) {
                store_latent(p, slot[r], d, v);
            } else {
                __nv_bfloat16 *dst = static_cast<__nv_bfloat16 *>(p.q_out) + t * p.qo_stride_t +
                                     static_cast<int64_t>(h) * p.qo_stride_h + d;
                ap_store8<__nv_bfloat16>::run(reinterpret_cast<uint8_t *>(dst), v, 1.0f);
            }
        }
    }
}

// Rope row r of token t at the lane's unit (values 8c .. 8c + 7 of the rotated part): r 0 is
// k_pe, r >= 1 q head r - 1.
__device__ __forceinline__ const __nv_bfloat16 *rope_src(const mla_append_params &p, int64_t t,
                                                         int r, int c) {
    if (r == 0) return static_cast<const __nv_bfloat16 *>(p.k) + t * p.k_stride_t + kRope0 + 8 * c;
    return static_cast<const __nv_bfloat16 *>(p.q) + t * p.q_stride_t +
           static_cast<int64_t>(r - 1) * p.q_stride_h + (p.q_dim - MLA_ROPE) + 8 * c;
}

// A rope CTA: kRopeGroupsPerCta groups of rope rows. Every lane of the warp reaches the neox
// shuffles (lanes out of the grid carry zeros and store nothing).
template <typename IDX, bool NEOX>
__device__ __forceinline__ void rope_part(const mla_append_params &p, const append_grid &g,
                                          IDX cta) {
    const int c = threadIdx.x & 7;
    const IDX group = cta * kRopeGroupsPerCta + (threadIdx.x >> 3);
    int64_t t = 0;
    int r_lo = 0, r_hi = 0;
    int32_t pos = -1, slot = -1;
    if (group < static_cast<IDX>(g.rope_groups)) {
        const IDX per = static_cast<IDX>(g.groups_per_token);
        const IDX tt = group / per;
        const int gi = static_cast<int>(group - tt * per);
        t = static_cast<int64_t>(tt);
        r_lo = static_cast<int>(static_cast<uint32_t>(gi) * g.rope_rows / g.groups_per_token);
        r_hi = static_cast<int>(static_cast<uint32_t>(gi + 1) * g.rope_rows / g.groups_per_token);
        pos = __ldg(p.positions + t * p.positions_stride);
        if (r_lo == 0) slot = __ldg(p.out_loc + t * p.out_loc_stride);
    }
    constexpr int kRopeRows = rope_rows_per_thread<NEOX>();
    uint4 x[kRopeRows];
#pragma unroll
    for (int k = 0; k < kRopeRows; k++) {
        x[k] = make_uint4(0u, 0u, 0u, 0u);
        if (r_lo + k < r_hi)
            x[k] = __ldcs(reinterpret_cast<const uint4 *>(rope_src(p, t, r_lo + k, c)));
    }
    // cos / sin of the lane's pairs: neox 8 pairs 8 (c & 3) .. + 7; interleaved 4 pairs 4c .. + 3
    constexpr int kPairs = NEOX ? 8 : 4;
    float cs_c[kPairs], cs_s[kPairs];
    const bool ok = position_ok(p, pos);
    if (ok) {
        const bool vec = (reinterpret_cast<uintptr_t>(p.cos_sin) & 15) == 0;
        const float *cs =
            p.cos_sin + static_cast<int64_t>(pos) * p.rotary_dim + (NEOX ? 8 * (c & 3) : 4 * c);
        load_f<kPairs>(cs, vec, cs_c);
        load_f<kPairs>(cs + 32, vec, cs_s);
    } else {
#pragma unroll
        for (int i = 0; i < kPairs; i++) cs_c[i] = cs_s[i] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kRopeRows; k++) {
        float v[8], w[8];
        ap_unpack8<__nv_bfloat16>(x[k], v);
        if (NEOX) {
            uint4 y;
            y.x = __shfl_xor_sync(0xffffffffu, x[k].x, 4);
            y.y = __shfl_xor_sync(0xffffffffu, x[k].y, 4);
            y.z = __shfl_xor_sync(0xffffffffu, x[k].z, 4);
            y.w = __shfl_xor_sync(0xffffffffu, x[k].w, 4);
            ap_unpack8<__nv_bfloat16>(y, w);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = v[i ^ 1];
        }
        const int r = r_lo + k;
        if (!ok || r >= r_hi) continue;
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = NEOX ? ap_rope_rotated(v[i], w[i], cs_c[i], cs_s[i], c < 4)
                        : ap_rope_rotated(v[i], w[i], cs_c[i >> 1], cs_s[i >> 1], (i & 1) == 0);
        if (r == 0) {
            if (slot_ok(p, slot)) store_latent(p, slot, kRope0 + 8 * c, v);
        } else {
            __nv_bfloat16 *dst = static_cast<__nv_bfloat16 *>(p.q_out) + t * p.qo_stride_t +
                                 static_cast<int64_t>(r - 1) * p.qo_stride_h +
                                 (p.q_dim - MLA_ROPE) + 8 * c;
            ap_store8<__nv_bfloat16>::run(reinterpret_cast<uint8_t *>(dst), v, 1.0f);
        }
    }
}

// Copy and rope CTAs interleaved evenly over the grid (CTA b copies when floor(b * copy_ctas /
// ctas) steps at b), so both kinds share the SMs from the first wave to the last. IDX is
// uint32_t when every index fits, so no 64-bit division. 8 CTAs per SM (64 registers) for both
// forms, no spills: interleaved with 6 rope rows a thread (4 rows at 10 CTAs, 48 registers,
// moved fewer bytes at once: 2495 against 2530 GB/s at H16 fp8), neox with 4.
template <typename IDX, bool NEOX>
__global__ void __launch_bounds__(kThreads, 8)
    mla_append_kernel(const mla_append_params p, const append_grid g) {
    ap_pdl_wait();
    ap_pdl_launch_dependents();
    const IDX b = blockIdx.x;
    const IDX copies_before = b * g.copy_ctas / g.ctas;
    if ((b + 1) * g.copy_ctas / g.ctas > copies_before)
        copy_part<IDX>(p, g, copies_before);
    else
        rope_part<IDX, NEOX>(p, g, b - copies_before);
}

template <typename IDX>
cudaError_t append_launch(const mla_append_params &p, const append_grid &g, cudaStream_t stream) {
    return p.is_neox ? ap_launch(mla_append_kernel<IDX, true>, dim3(g.ctas), dim3(kThreads), 0,
                                 stream, true, p, g)
                     : ap_launch(mla_append_kernel<IDX, false>, dim3(g.ctas), dim3(kThreads), 0,
                                 stream, true, p, g);
}

} // namespace

extern "C" ap_status mla_append_run(const mla_append_params *p, void *stream_ptr, ap_msgbuf *msg) {
    if (p->num_tokens == 0) return AP_OK;
    const uint64_t T = static_cast<uint64_t>(p->num_tokens);
    const bool q_copy = p->q != NULL && p->q_dim > MLA_ROPE && p->q_out != p->q;
    append_grid g;
    g.copy_rows = T + (q_copy ? T * static_cast<uint64_t>(p->num_heads) : 0);
    g.rope_rows = 1 + (p->q != NULL ? static_cast<uint32_t>(p->num_heads) : 0);
    const uint32_t per_thread =
        p->is_neox ? rope_rows_per_thread<true>() : rope_rows_per_thread<false>();
    g.groups_per_token = (g.rope_rows + per_thread - 1) / per_thread;
    g.rope_groups = T * g.groups_per_token;
    const uint64_t copy_ctas = (g.copy_rows + kCopyRowsPerCta - 1) / kCopyRowsPerCta;
    const uint64_t ctas = copy_ctas + (g.rope_groups + kRopeGroupsPerCta - 1) / kRopeGroupsPerCta;
    if (ctas > static_cast<uint64_t>(INT32_MAX)) {
        ap_msgbuf_add(msg, "%s: %lld tokens need %llu CTAs (at most %d)", MLA_WHO,
                      static_cast<long long>(p->num_tokens), static_cast<unsigned long long>(ctas),
                      INT32_MAX);
        return AP_ERR_UNSUPPORTED;
    }
    g.copy_ctas = static_cast<uint32_t>(copy_ctas);
    g.ctas = static_cast<uint32_t>(ctas);
    // 32-bit indices when b * copy_ctas, the copy rows and the rope groups all fit
    const uint64_t lim = uint64_t{1} << 32;
    const bool narrow = ctas * (copy_ctas + 1) < lim && copy_ctas * kCopyRowsPerCta < lim &&
                        ctas * kRopeGroupsPerCta < lim && g.copy_rows < lim;
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    mla_append_params q = *p;
    q.k_rcp = ap_e4m3_div_rcp(p->k_scale);
    cudaError_t err =
        narrow ? append_launch<uint32_t>(q, g, stream) : append_launch<uint64_t>(q, g, stream);
    ap_status st = ap_cuda_status(err, MLA_WHO, "cudaLaunchKernelEx", msg);
    return st != AP_OK ? st : ap_cuda_launch_status(MLA_WHO, "mla_append_kernel", msg);
}
