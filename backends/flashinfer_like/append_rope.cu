// append_rope.cu: the append_kv/1 hook's kernel: RoPE on q and k, k and v quantized into the cache.
#include <cuda_runtime.h>

#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/paged_kv.cuh"
#include "../common/rope.cuh"
#include "fil.h"

#define FIL_WHO FIL_NAME ": append_kv"

namespace {

constexpr int kVec = 8; // elements per lane: one 16-byte load of a 16-bit row
constexpr int kThreads = 256;

struct rope_args {
    const uint8_t *q; // may alias q_out
    uint8_t *q_out;
    const uint8_t *k;
    const uint8_t *v;
    uint8_t *k_pages;
    uint8_t *v_pages;
    const int32_t *positions;
    const int32_t *out_loc;
    int64_t positions_stride;
    int64_t out_loc_stride;
    const float *cos_sin;
    int64_t num_slots;
    int32_t max_position;
    int32_t rotary_dim;
    int32_t is_neox;
    int32_t num_qo_heads; // 0: no q
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t lanes_per_row; // head_dim / kVec, a divisor of 32
    int32_t lanes_shift;   // log2(lanes_per_row)
    int64_t num_rows;      // num_tokens * (num_qo_heads + 2 * num_kv_heads)
    float k_scale;
    float v_scale;
};

// Element d of a row staged in shared memory, rotated (rope.cuh) with its partner's value.
__device__ __forceinline__ float fil_rope_elem(const float *row, int d, int rotary_dim, int neox,
                                               const float *cs) {
    const int half = rotary_dim / 2;
    const bool first = neox ? d < half : (d & 1) == 0;
    const int i = neox ? (first ? d : d - half) : d >> 1;
    const int partner = neox ? (first ? d + half : d - half) : d ^ 1;
    const float c = __ldg(cs + i);
    const float s = __ldg(cs + half + i);
    return ap_rope_rotated(row[d], row[partner], c, s, first);
}

// A token's rows are its q heads, then its k heads, then its v heads; lanes_per_row lanes of one
// warp move one row, 8 elements each. The row is staged in shared memory as float so that each
// lane finds its pair partners there whatever the rotary dim and pairing; every lane has read
// its input before any lane writes, so q_out may alias q. A token whose position or slot is out
// of range is left alone (the core checks host arrays; device arrays cannot be checked without
// a sync, and a bad index must never write outside the cache).
template <typename IN, typename KV>
__global__ void __launch_bounds__(kThreads) fil_append_rope_kernel(const rope_args a) {
    extern __shared__ float staged[]; // [kThreads * kVec]
    const int lpr = a.lanes_per_row;
    const int lane = threadIdx.x % lpr;
    const int64_t row = (int64_t)blockIdx.x * (kThreads / lpr) + threadIdx.x / lpr;
    float *my_row = staged + (threadIdx.x - lane) * kVec; // this row's head_dim floats
    const int rows_per_token = a.num_qo_heads + 2 * a.num_kv_heads;
    const bool live = row < a.num_rows;
    const int64_t token = live ? row / rows_per_token : 0;
    const int r = live ? (int)(row - token * rows_per_token) : 0;
    const int kind = r < a.num_qo_heads ? 0 : (r < a.num_qo_heads + a.num_kv_heads ? 1 : 2);
    const int head =
        kind == 0 ? r : (kind == 1 ? r - a.num_qo_heads : r - a.num_qo_heads - a.num_kv_heads);
    const int heads = kind == 0 ? a.num_qo_heads : a.num_kv_heads;
    const uint8_t *src = kind == 0 ? a.q : (kind == 1 ? a.k : a.v);
    const int64_t src_elem = (token * heads + head) * (int64_t)a.head_dim + lane * kVec;
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);
    int32_t pos = 0, slot = 0;
    if (live) {
        raw = *reinterpret_cast<const uint4 *>(src + src_elem * (int64_t)sizeof(IN));
        pos = __ldg(a.positions + token * a.positions_stride);
        slot = __ldg(a.out_loc + token * a.out_loc_stride);
    }
    const bool valid =
        live && pos >= 0 && pos < a.max_position && slot >= 0 && (int64_t)slot < a.num_slots;
    float x[kVec];
    ap_unpack8<IN>(raw, x);
    const int d0 = lane * kVec;
    const bool rotates = kind != 2 && d0 < a.rotary_dim;
    if (rotates) {
        *reinterpret_cast<float4 *>(my_row + d0) = make_float4(x[0], x[1], x[2], x[3]);
        *reinterpret_cast<float4 *>(my_row + d0 + 4) = make_float4(x[4], x[5], x[6], x[7]);
    }
    __syncwarp();
    if (!valid) return;
    if (rotates) {
        const float *cs = a.cos_sin + (int64_t)pos * a.rotary_dim;
#pragma unroll
        for (int j = 0; j < kVec; j++)
            if (d0 + j < a.rotary_dim)
                x[j] = fil_rope_elem(my_row, d0 + j, a.rotary_dim, a.is_neox, cs);
    }
    if (kind == 0) {
        ap_store8<IN>::run(a.q_out + src_elem * (int64_t)sizeof(IN), x, 1.0f);
        return;
    }
    const int64_t dst_elem = ap_paged_row(slot, head, a.num_kv_heads, a.head_dim) + d0;
    uint8_t *pages = kind == 1 ? a.k_pages : a.v_pages;
    ap_store8<KV>::run(pages + dst_elem * ap_elem_bytes<KV>::value, x,
                       kind == 1 ? a.k_scale : a.v_scale);
}

// The rows kernel: one CTA per (token, chunk of up to kRowsPerThread * kThreads / lanes_per_row
// of its rows), so the token is blockIdx.x and the row a shift away, with no division. Each
// thread moves up to kRowsPerThread rows' 8-element pieces at the same offset d0: their 16-byte
// loads go out together, before the token's position and slot are even known, and the lane's
// cos/sin (the same for every row of the token) come once, as float4 loads. Pair partners stay
// in registers: interleaved pairs lie in one lane; neox partners (rotary_dim / 2 a multiple of 8)
// lie rotary_dim / 16 lanes away in the same row and come by shuffle. Every lane reads and
// writes only its own 16 bytes, reading before writing, so q_out may alias q.
constexpr int kRowsPerThread = 4;

// The cos and sin of this lane's 8 dims at `pos` (neox: dims d and d + half share a frequency;
// interleaved: each pair 2i, 2i+1 shares one), in 16-byte loads.
template <bool kNeox>
__device__ __forceinline__ void rope_cos_sin(const rope_args &a, int32_t pos, int d0, bool first,
                                             float (&c)[kVec], float (&s)[kVec]) {
    const int half = a.rotary_dim / 2;
    const float *cs = a.cos_sin + (int64_t)pos * a.rotary_dim;
    if (kNeox) {
        const int ci = first ? d0 : d0 - half;
        const float4 c0 = __ldg(reinterpret_cast<const float4 *>(cs + ci));
        const float4 c1 = __ldg(reinterpret_cast<const float4 *>(cs + ci + 4));
        const float4 s0 = __ldg(reinterpret_cast<const float4 *>(cs + half + ci));
        const float4 s1 = __ldg(reinterpret_cast<const float4 *>(cs + half + ci + 4));
        c[0] = c0.x, c[1] = c0.y, c[2] = c0.z, c[3] = c0.w;
        c[4] = c1.x, c[5] = c1.y, c[6] = c1.z, c[7] = c1.w;
        s[0] = s0.x, s[1] = s0.y, s[2] = s0.z, s[3] = s0.w;
        s[4] = s1.x, s[5] = s1.y, s[6] = s1.z, s[7] = s1.w;
    } else {
        const float4 c0 = __ldg(reinterpret_cast<const float4 *>(cs + d0 / 2));
        const float4 s0 = __ldg(reinterpret_cast<const float4 *>(cs + half + d0 / 2));
        c[0] = c[1] = c0.x, c[2] = c[3] = c0.y, c[4] = c[5] = c0.z, c[6] = c[7] = c0.w;
        s[0] = s[1] = s0.x, s[2] = s[3] = s0.y, s[4] = s[5] = s0.z, s[6] = s[7] = s0.w;
    }
}

template <typename IN, typename KV, bool kNeox>
__global__ void __launch_bounds__(kThreads) fil_append_rope_rows_kernel(const rope_args a) {
    const int lane = threadIdx.x & (a.lanes_per_row - 1);
    const int d0 = lane * kVec;
    const int rows_per_pass = kThreads >> a.lanes_shift;
    const int rows_per_token = a.num_qo_heads + 2 * a.num_kv_heads;
    const int64_t token = blockIdx.x;
    const int first_row =
        (int)blockIdx.y * kRowsPerThread * rows_per_pass + (int)(threadIdx.x >> a.lanes_shift);
    const int32_t pos = __ldg(a.positions + token * a.positions_stride);
    const int32_t slot = __ldg(a.out_loc + token * a.out_loc_stride);
    uint4 raw[kRowsPerThread];
#pragma unroll
    for (int j = 0; j < kRowsPerThread; j++) {
        const int r = first_row + j * rows_per_pass;
        raw[j] = make_uint4(0u, 0u, 0u, 0u);
        if (r < rows_per_token) {
            const uint8_t *src =
                r < a.num_qo_heads
                    ? a.q + (token * a.num_qo_heads + r) * a.head_dim * (int64_t)sizeof(IN)
                : r < a.num_qo_heads + a.num_kv_heads
                    ? a.k + (token * a.num_kv_heads + (r - a.num_qo_heads)) * a.head_dim *
                                (int64_t)sizeof(IN)
                    : a.v + (token * a.num_kv_heads + (r - a.num_qo_heads - a.num_kv_heads)) *
                                a.head_dim * (int64_t)sizeof(IN);
            raw[j] = __ldcs(reinterpret_cast<const uint4 *>(src + d0 * (int)sizeof(IN)));
        }
    }
    // the same for the whole CTA, so the early return never splits a shuffle
    if (pos < 0 || pos >= a.max_position || slot < 0 || (int64_t)slot >= a.num_slots) return;
    const int half = a.rotary_dim / 2;
    const bool rotates = d0 < a.rotary_dim;
    const bool first = kNeox ? d0 < half : true;
    float c[kVec], s[kVec];
    if (rotates) rope_cos_sin<kNeox>(a, pos, d0, first, c, s);
    const int half_lanes = half / kVec;
    const int partner_lane =
        !kNeox || !rotates ? lane : (first ? lane + half_lanes : lane - half_lanes);
#pragma unroll
    for (int j = 0; j < kRowsPerThread; j++) {
        const int r = first_row + j * rows_per_pass;
        uint4 other = raw[j];
        if (kNeox) { // every lane of the warp takes part, whatever its row
            other.x = __shfl_sync(0xffffffffu, raw[j].x, partner_lane, a.lanes_per_row);
            other.y = __shfl_sync(0xffffffffu, raw[j].y, partner_lane, a.lanes_per_row);
            other.z = __shfl_sync(0xffffffffu, raw[j].z, partner_lane, a.lanes_per_row);
            other.w = __shfl_sync(0xffffffffu, raw[j].w, partner_lane, a.lanes_per_row);
        }
        if (r >= rows_per_token) continue;
        const int kind = r < a.num_qo_heads ? 0 : (r < a.num_qo_heads + a.num_kv_heads ? 1 : 2);
        float x[kVec];
        ap_unpack8<IN>(raw[j], x);
        if (kind != 2 && rotates) {
            float y[kVec];
            if (kNeox) {
                ap_unpack8<IN>(other, y);
            } else {
#pragma unroll
                for (int i = 0; i < kVec; i++) y[i] = x[i ^ 1];
            }
            ap_rope_rotate8<kNeox>(x, y, c, s, first);
        }
        if (kind == 0) {
            const int64_t elem = (token * a.num_qo_heads + r) * a.head_dim + d0;
            ap_store8<IN>::run(a.q_out + elem * (int64_t)sizeof(IN), x, 1.0f);
            continue;
        }
        const int head = kind == 1 ? r - a.num_qo_heads : r - a.num_qo_heads - a.num_kv_heads;
        const int64_t dst_elem = ap_paged_row(slot, head, a.num_kv_heads, a.head_dim) + d0;
        uint8_t *pages = kind == 1 ? a.k_pages : a.v_pages;
        ap_store8<KV>::run(pages + dst_elem * ap_elem_bytes<KV>::value, x,
                           kind == 1 ? a.k_scale : a.v_scale);
    }
}

// The rows kernel takes every shape where its pairs fall on whole lanes and its float4 cos/sin
// loads are aligned; the staged kernel takes the rest.
template <typename IN, typename KV>
void fil_append_rope_pick(const rope_args &a, bool rows, dim3 grid, size_t smem, cudaStream_t s) {
    if (!rows)
        fil_append_rope_kernel<IN, KV><<<grid, kThreads, smem, s>>>(a);
    else if (a.is_neox)
        fil_append_rope_rows_kernel<IN, KV, true><<<grid, kThreads, 0, s>>>(a);
    else
        fil_append_rope_rows_kernel<IN, KV, false><<<grid, kThreads, 0, s>>>(a);
}

template <typename IN>
ap_status fil_append_rope_launch(const rope_args &a, ap_dtype kv_dtype, bool rows, dim3 grid,
                                 size_t smem, cudaStream_t s, ap_msgbuf *msg) {
    switch (kv_dtype) {
        case AP_DTYPE_BF16: fil_append_rope_pick<IN, __nv_bfloat16>(a, rows, grid, smem, s); break;
        case AP_DTYPE_F16: fil_append_rope_pick<IN, __half>(a, rows, grid, smem, s); break;
        default: fil_append_rope_pick<IN, ap_fp8_e4m3>(a, rows, grid, smem, s); break;
    }
    return ap_cuda_launch_status(
        FIL_WHO, rows ? "fil_append_rope_rows_kernel" : "fil_append_rope_kernel", msg);
}

// The launch; allow_rows = false sends every call to the staged kernel (the bench times both).
ap_status append_rope_run(const fil_append_rope_params *p, bool allow_rows, void *stream,
                          ap_msgbuf *msg) {
    const bool in_ok = p->in_dtype == AP_DTYPE_BF16 || p->in_dtype == AP_DTYPE_F16;
    const bool kv_ok = p->kv_dtype == AP_DTYPE_BF16 || p->kv_dtype == AP_DTYPE_F16 ||
                       p->kv_dtype == AP_DTYPE_FP8_E4M3;
    const int lpr = p->head_dim / kVec;
    if (!in_ok || !kv_ok || p->head_dim % kVec != 0 || lpr < 1 || 32 % lpr != 0 ||
        p->rotary_dim < 2 || p->rotary_dim % 2 != 0 || p->rotary_dim > p->head_dim) {
        ap_msgbuf_add(msg,
                      FIL_WHO ": no kernel for input dtype %d, cache dtype %d, head_dim %d, "
                              "rotary_dim %d",
                      (int)p->in_dtype, (int)p->kv_dtype, p->head_dim, p->rotary_dim);
        return AP_ERR_UNSUPPORTED;
    }
    if (p->num_tokens == 0) return AP_OK;
    rope_args a;
    a.q = static_cast<const uint8_t *>(p->q);
    a.q_out = static_cast<uint8_t *>(p->q_out);
    a.k = static_cast<const uint8_t *>(p->k);
    a.v = static_cast<const uint8_t *>(p->v);
    a.k_pages = static_cast<uint8_t *>(p->k_pages);
    a.v_pages = static_cast<uint8_t *>(p->v_pages);
    a.positions = p->positions;
    a.out_loc = p->out_loc;
    a.positions_stride = p->positions_stride;
    a.out_loc_stride = p->out_loc_stride;
    a.cos_sin = p->cos_sin;
    a.num_slots = p->num_slots;
    a.max_position = p->max_position;
    a.rotary_dim = p->rotary_dim;
    a.is_neox = p->is_neox;
    a.num_qo_heads = p->q != NULL ? p->num_qo_heads : 0;
    a.num_kv_heads = p->num_kv_heads;
    a.head_dim = p->head_dim;
    a.lanes_per_row = lpr;
    a.num_rows = p->num_tokens * (int64_t)(a.num_qo_heads + 2 * a.num_kv_heads);
    a.k_scale = p->k_scale;
    a.v_scale = p->v_scale;
    a.lanes_shift = __builtin_ctz((unsigned)lpr);
    const int rows_per_token = a.num_qo_heads + 2 * a.num_kv_heads;
    const int rows_per_cta = kRowsPerThread * (kThreads / lpr);
    const int chunks = (rows_per_token + rows_per_cta - 1) / rows_per_cta;
    bool rows = (p->is_neox ? p->rotary_dim % (2 * kVec) == 0 : p->rotary_dim % kVec == 0) &&
                reinterpret_cast<uintptr_t>(p->cos_sin) % 16 == 0 && chunks <= 65535 &&
                p->num_tokens <= 0x7fffffff;
    rows = rows && allow_rows;
    const int64_t staged_rows_per_cta = kThreads / lpr;
    const int64_t blocks =
        rows ? p->num_tokens : (a.num_rows + staged_rows_per_cta - 1) / staged_rows_per_cta;
    if (blocks > 0x7fffffff) {
        ap_msgbuf_add(msg, FIL_WHO ": %lld tokens are more than one launch covers",
                      (long long)p->num_tokens);
        return AP_ERR_UNSUPPORTED;
    }
    const dim3 grid((unsigned)blocks, rows ? (unsigned)chunks : 1u);
    const size_t smem = rows ? 0 : (size_t)kThreads * kVec * sizeof(float);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (p->in_dtype == AP_DTYPE_BF16)
        return fil_append_rope_launch<__nv_bfloat16>(a, p->kv_dtype, rows, grid, smem, s, msg);
    return fil_append_rope_launch<__half>(a, p->kv_dtype, rows, grid, smem, s, msg);
}

} // namespace

extern "C" ap_status fil_append_rope_run(const fil_append_rope_params *p, void *stream,
                                         ap_msgbuf *msg) {
    return append_rope_run(p, true, stream, msg);
}
