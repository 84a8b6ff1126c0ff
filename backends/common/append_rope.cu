// append_rope.cu: the KV append: RoPE on q and k (optional), k and v quantized into the cache.
#include <cuda_runtime.h>

#include "cp_async.cuh"
#include "cuda_status.cuh"
#include "dispatch.cuh"
#include "dtype.cuh"
#include "kit.h"
#include "nvfp4.cuh"
#include "paged_kv.cuh"
#include "rope.cuh"

namespace {

constexpr int kVec = 8; // elements per lane: one 16-byte load of a 16-bit row
constexpr int kThreads = 256;

struct rope_args {
    const uint8_t *q; // may alias q_out
    uint8_t *q_out;
    const uint8_t *src[2]; // k, v
    int64_t q_stride_token, q_stride_head;
    int64_t stride_token[2], stride_head[2];
    uint8_t *pages[2];
    uint8_t *block_scales[2];
    float scale[2];
    float rcp[2]; // ap_e4m3_div_rcp of scale (fp8 caches)
    const int32_t *positions;
    const int32_t *out_loc;
    int64_t positions_stride;
    int64_t out_loc_stride;
    const float *cos_sin;
    int64_t num_slots;
    int32_t max_position;
    int32_t rotary_dim; // 0: no RoPE
    int32_t is_neox;
    int32_t num_qo_heads; // 0: no q
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t lanes_per_row; // head_dim / kVec, a divisor of 32
    int32_t lanes_shift;   // log2(lanes_per_row)
    int64_t num_rows;      // num_tokens * (num_qo_heads + 2 * num_kv_heads)
    int64_t num_tokens;
};

// A token's rows are its q heads, then its k heads, then its v heads.
struct row_of {
    int kind; // 0 q, 1 k, 2 v
    int head;
};

__device__ __forceinline__ row_of row_kind(const rope_args &a, int r) {
    if (r < a.num_qo_heads) return {0, r};
    if (r < a.num_qo_heads + a.num_kv_heads) return {1, r - a.num_qo_heads};
    return {2, r - a.num_qo_heads - a.num_kv_heads};
}

// Byte offset of element d0 of row (token, head) of the q (kind 0), k or v input.
__device__ __forceinline__ int64_t row_src_offset(const rope_args &a, row_of w, int64_t token,
                                                  int d0, int in_bytes) {
    const int64_t st = w.kind == 0 ? a.q_stride_token : a.stride_token[w.kind - 1];
    const int64_t sh = w.kind == 0 ? a.q_stride_head : a.stride_head[w.kind - 1];
    return (token * st + (int64_t)w.head * sh + d0) * in_bytes;
}

// Whether a token is written: its slot in the cache and, with RoPE, its position in the table
// (the core checks host arrays; device arrays cannot be checked without a sync, and a bad index
// must never write outside the cache).
__device__ __forceinline__ bool token_valid(const rope_args &a, int32_t pos, int32_t slot) {
    return slot >= 0 && (int64_t)slot < a.num_slots &&
           (a.rotary_dim == 0 || (pos >= 0 && pos < a.max_position));
}

// The paged write of one lane's 8 values at element `elem` of a K or V cache. Every lane of the
// warp calls it (the nvfp4 form exchanges values between lanes); `write` false stores nothing.
template <typename KV> struct kv_write8 {
    __device__ __forceinline__ static void run(uint8_t *pages, uint8_t *, int64_t elem,
                                               const float (&x)[kVec], float scale, float rcp,
                                               bool write) {
        if (write) ap_store8<KV>::run(pages + elem * ap_elem_bytes<KV>::value, x, scale, rcp);
    }
};

// No cache (the split kernel's q CTAs): nothing to write.
template <> struct kv_write8<void> {
    __device__ __forceinline__ static void run(uint8_t *, uint8_t *, int64_t, const float (&)[kVec],
                                               float, float, bool) {}
};

// nvfp4: a block of 16 values lies in two neighbouring lanes (head_dim / 8 lanes per row, an even
// number, and every row starts on an even lane), 8 each. nvfp4_host.h's quantizer in its three
// steps: each lane takes the largest magnitude of its 8 (and whether one is NaN), the pair
// combines them by one shuffle each, both lanes derive the same scale byte and reciprocal, and
// each lane codes its own 8 values into 4 bytes (ap_nvfp4_codes8); the even lane also writes the scale byte. The
// bytes are those of ap_nvfp4_quantize_block on the 16 (max and or are exact in any order).
// Warps holding no K/V row skip it.
template <> struct kv_write8<ap_nvfp4> {
    __device__ __forceinline__ static void run(uint8_t *pages, uint8_t *scales, int64_t elem,
                                               const float (&x)[kVec], float scale, float,
                                               bool write) {
        if (!__any_sync(0xffffffffu, write)) return;
        int has_nan = 0;
        float amax = ap_nvfp4_amax8(x, &has_nan);
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        has_nan |= __shfl_xor_sync(0xffffffffu, has_nan, 1);
        float inv;
        const uint8_t s = ap_nvfp4_block_scale(amax, has_nan, scale, &inv);
        const uint32_t codes = ap_nvfp4_codes8(x, inv, has_nan);
        if (!write) return;
        __stcs(reinterpret_cast<unsigned int *>(pages + elem / 2), codes);
        if ((elem & (AP_NVFP4_BLOCK - 1)) == 0)
            __stcs(reinterpret_cast<unsigned char *>(scales + elem / AP_NVFP4_BLOCK), s);
    }
};

// Element d of a row staged in shared memory, rotated (rope.cuh) with its partner's value.
__device__ __forceinline__ float staged_rope_elem(const float *row, int d, int rotary_dim, int neox,
                                                  const float *cs) {
    const int half = rotary_dim / 2;
    const bool first = neox ? d < half : (d & 1) == 0;
    const int i = neox ? (first ? d : d - half) : d >> 1;
    const int partner = neox ? (first ? d + half : d - half) : d ^ 1;
    const float c = __ldg(cs + i);
    const float s = __ldg(cs + half + i);
    return ap_rope_rotated(row[d], row[partner], c, s, first);
}

// The staged kernel, for shapes the rows kernel does not take: lanes_per_row lanes of one warp
// move one row, 8 elements each. The row is staged in shared memory as float so that each lane
// finds its pair partners there whatever the rotary dim and pairing; every lane has read its
// input before any lane writes, so q_out may alias q. Every lane runs to the paged write (nvfp4
// exchanges values there); rows out of range or of an invalid token write nothing.
template <typename IN, typename KV>
__global__ void __launch_bounds__(kThreads) ap_append_rope_kernel(const rope_args a) {
    extern __shared__ float staged[]; // [kThreads * kVec]
    const int lpr = a.lanes_per_row;
    const int lane = threadIdx.x % lpr;
    const int64_t row = (int64_t)blockIdx.x * (kThreads / lpr) + threadIdx.x / lpr;
    float *my_row = staged + (threadIdx.x - lane) * kVec; // this row's head_dim floats
    const int rows_per_token = a.num_qo_heads + 2 * a.num_kv_heads;
    const bool live = row < a.num_rows;
    const int64_t token = live ? row / rows_per_token : 0;
    const row_of w = row_kind(a, live ? (int)(row - token * rows_per_token) : 0);
    const int d0 = lane * kVec;
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);
    int32_t pos = 0, slot = -1;
    if (live) {
        const uint8_t *src = w.kind == 0 ? a.q : a.src[w.kind - 1];
        raw = *reinterpret_cast<const uint4 *>(src + row_src_offset(a, w, token, d0, sizeof(IN)));
        if (a.rotary_dim > 0) pos = __ldg(a.positions + token * a.positions_stride);
        slot = __ldg(a.out_loc + token * a.out_loc_stride);
    }
    const bool valid = live && token_valid(a, pos, slot);
    float x[kVec];
    ap_unpack8<IN>(raw, x);
    const bool rotates = w.kind != 2 && d0 < a.rotary_dim;
    if (rotates) {
        *reinterpret_cast<float4 *>(my_row + d0) = make_float4(x[0], x[1], x[2], x[3]);
        *reinterpret_cast<float4 *>(my_row + d0 + 4) = make_float4(x[4], x[5], x[6], x[7]);
    }
    __syncwarp();
    if (valid && rotates) {
        const float *cs = a.cos_sin + (int64_t)pos * a.rotary_dim;
#pragma unroll
        for (int j = 0; j < kVec; j++)
            if (d0 + j < a.rotary_dim)
                x[j] = staged_rope_elem(my_row, d0 + j, a.rotary_dim, a.is_neox, cs);
    }
    if (w.kind == 0 && valid)
        ap_store8<IN>::run(a.q_out + row_src_offset(a, w, token, d0, sizeof(IN)), x, 1.0f);
    const int which = w.kind == 2 ? 1 : 0;
    const int64_t dst_elem = ap_paged_row(slot, w.head, a.num_kv_heads, a.head_dim) + d0;
    kv_write8<KV>::run(a.pages[which], a.block_scales[which], dst_elem, x, a.scale[which],
                       a.rcp[which], valid && w.kind != 0);
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
// `load` reads a float4 at a float pointer (global or shared memory).
template <bool kNeox, typename LOAD>
__device__ __forceinline__ void rope_cos_sin_row(const float *cs, int half, int d0, bool first,
                                                 float (&c)[kVec], float (&s)[kVec], LOAD load) {
    if (kNeox) {
        const int ci = first ? d0 : d0 - half;
        const float4 c0 = load(cs + ci);
        const float4 c1 = load(cs + ci + 4);
        const float4 s0 = load(cs + half + ci);
        const float4 s1 = load(cs + half + ci + 4);
        c[0] = c0.x, c[1] = c0.y, c[2] = c0.z, c[3] = c0.w;
        c[4] = c1.x, c[5] = c1.y, c[6] = c1.z, c[7] = c1.w;
        s[0] = s0.x, s[1] = s0.y, s[2] = s0.z, s[3] = s0.w;
        s[4] = s1.x, s[5] = s1.y, s[6] = s1.z, s[7] = s1.w;
    } else {
        const float4 c0 = load(cs + d0 / 2);
        const float4 s0 = load(cs + half + d0 / 2);
        c[0] = c[1] = c0.x, c[2] = c[3] = c0.y, c[4] = c[5] = c0.z, c[6] = c[7] = c0.w;
        s[0] = s[1] = s0.x, s[2] = s[3] = s0.y, s[4] = s[5] = s0.z, s[6] = s[7] = s0.w;
    }
}

template <bool kNeox>
__device__ __forceinline__ void rope_cos_sin(const rope_args &a, int32_t pos, int d0, bool first,
                                             float (&c)[kVec], float (&s)[kVec]) {
    rope_cos_sin_row<kNeox>(
        a.cos_sin + (int64_t)pos * a.rotary_dim, a.rotary_dim / 2, d0, first, c, s,
        [](const float *p) { return __ldg(reinterpret_cast<const float4 *>(p)); });
}

// One row piece of the rows kernel after its load: rotate (q, k), then write q_out or the cache.
// Every lane of the warp calls it, whatever its row (shuffles inside).
// Rows r >= row_end (the token's row count, or its q heads in a split q CTA) write nothing.
template <typename IN, typename KV, bool kNeox>
__device__ __forceinline__ void rows_piece(const rope_args &a, int64_t token, int32_t slot, int r,
                                           int row_end, int d0, const uint4 &raw, int partner_lane,
                                           bool rotates, bool first, const float (&c)[kVec],
                                           const float (&s)[kVec]) {
    uint4 other = raw;
    if (kNeox && a.rotary_dim > 0) { // every lane of the warp takes part, whatever its row
        other.x = __shfl_sync(0xffffffffu, raw.x, partner_lane, a.lanes_per_row);
        other.y = __shfl_sync(0xffffffffu, raw.y, partner_lane, a.lanes_per_row);
        other.z = __shfl_sync(0xffffffffu, raw.z, partner_lane, a.lanes_per_row);
        other.w = __shfl_sync(0xffffffffu, raw.w, partner_lane, a.lanes_per_row);
    }
    const bool in_range = r < row_end;
    // KV void: the split kernel's q CTAs, whose rows are all q heads (no test of the kind)
    const row_of w = std::is_void<KV>::value ? row_of{0, r} : row_kind(a, in_range ? r : 0);
    float x[kVec];
    ap_unpack8<IN>(raw, x);
    if (w.kind != 2 && rotates) {
        float y[kVec];
        // kFlip: first's x c - y s as x c + (-y) s, the partner's sign bits flipped in its
        // packed words (the same bits: negation is exact, and a NaN becomes the canonical NaN in
        // every store), so each value is one add where nvcc issued both of first's two
        // (predicated) adds. 16-bit caches keep those: their rows kernel measured 2.6% slower
        // with the flip on the H100 (fp8 3.5% faster, nvfp4's split kernel 1%; 2026-11-27)
        constexpr bool kFlip =
            kNeox && !std::is_same<KV, __half>::value && !std::is_same<KV, __nv_bfloat16>::value;
        if (kNeox) {
            const uint32_t flip = kFlip && first ? 0x80008000u : 0u;
            ap_unpack8<IN>(
                make_uint4(other.x ^ flip, other.y ^ flip, other.z ^ flip, other.w ^ flip), y);
        } else {
#pragma unroll
            for (int i = 0; i < kVec; i++) y[i] = x[i ^ 1];
        }
        ap_rope_rotate8<kNeox>(x, y, c, s, kFlip ? false : first);
    }
    if (w.kind == 0 && in_range)
        ap_store8<IN>::run(a.q_out + row_src_offset(a, w, token, d0, sizeof(IN)), x, 1.0f);
    const int which = w.kind == 2 ? 1 : 0;
    const int64_t dst_elem = ap_paged_row(slot, w.head, a.num_kv_heads, a.head_dim) + d0;
    kv_write8<KV>::run(a.pages[which], a.block_scales[which], dst_elem, x, a.scale[which],
                       a.rcp[which], in_range && w.kind != 0);
}

// One token's rows [chunk_first, row_end) of the rows kernel, up to kRowsPerThread per thread.
// Every thread of the CTA returns together or not at all (the shuffles).
template <typename IN, typename KV, bool kNeox>
__device__ __forceinline__ void rows_token(const rope_args &a, int64_t token, int chunk_first,
                                           int row_end) {
    const int lane = threadIdx.x & (a.lanes_per_row - 1);
    const int d0 = lane * kVec;
    const int rows_per_pass = kThreads >> a.lanes_shift;
    const int first_row = chunk_first + (int)(threadIdx.x >> a.lanes_shift);
    const int32_t pos = a.rotary_dim > 0 ? __ldg(a.positions + token * a.positions_stride) : 0;
    const int32_t slot = __ldg(a.out_loc + token * a.out_loc_stride);
    uint4 raw[kRowsPerThread];
#pragma unroll
    for (int j = 0; j < kRowsPerThread; j++) {
        const int r = first_row + j * rows_per_pass;
        raw[j] = make_uint4(0u, 0u, 0u, 0u);
        if (r < row_end) {
            const row_of w = row_kind(a, r);
            const uint8_t *src = w.kind == 0 ? a.q : a.src[w.kind - 1];
            raw[j] = __ldcs(
                reinterpret_cast<const uint4 *>(src + row_src_offset(a, w, token, d0, sizeof(IN))));
        }
    }
    // the same for the whole CTA, so the early return never splits a shuffle
    if (!token_valid(a, pos, slot)) return;
    const int half = a.rotary_dim / 2;
    const bool rotates = d0 < a.rotary_dim;
    const bool first = kNeox ? d0 < half : true;
    float c[kVec], s[kVec];
    if (rotates) rope_cos_sin<kNeox>(a, pos, d0, first, c, s);
    const int half_lanes = half / kVec;
    const int partner_lane =
        !kNeox || !rotates ? lane : (first ? lane + half_lanes : lane - half_lanes);
#pragma unroll
    for (int j = 0; j < kRowsPerThread; j++)
        rows_piece<IN, KV, kNeox>(a, token, slot, first_row + j * rows_per_pass, row_end, d0,
                                  raw[j], partner_lane, rotates, first, c, s);
}

template <typename IN, typename KV, bool kNeox>
__global__ void __launch_bounds__(kThreads) ap_append_rope_rows_kernel(const rope_args a) {
    const int rows_per_cta = kRowsPerThread * (kThreads >> a.lanes_shift);
    rows_token<IN, KV, kNeox>(a, blockIdx.x, (int)blockIdx.y * rows_per_cta,
                              a.num_qo_heads + 2 * a.num_kv_heads);
}

#include "append_rope_split.cuh" // the split kernel (nvfp4 caches)

// The rows kernel takes every shape where its pairs fall on whole lanes and its float4 cos/sin
// loads are aligned; the staged kernel takes the rest; nvfp4 caches take the split kernel where
// the rows kernel would run and the token groups fit grid.y.
enum append_rope_form { AP_APPEND_STAGED, AP_APPEND_ROWS, AP_APPEND_SPLIT };

struct append_rope_geometry {
    append_rope_form form;
    dim3 grid;
    size_t smem;
    split_geometry split;
};

// The split kernel's 5 CTAs of 41 KB want the largest shared-memory carveout (a hint to the
// driver, set once per instantiation).
template <typename IN, bool kNeox>
void split_launch(const rope_args &a, const append_rope_geometry &g, cudaStream_t s) {
    static const cudaError_t carveout = cudaFuncSetAttribute(
        ap_append_rope_split_kernel<IN, kNeox>, cudaFuncAttributePreferredSharedMemoryCarveout,
        (int)cudaSharedmemCarveoutMaxShared);
    (void)carveout;
    ap_append_rope_split_kernel<IN, kNeox><<<g.grid, kThreads, 0, s>>>(a, g.split);
}

template <typename IN, typename KV>
void append_rope_pick(const rope_args &a, const append_rope_geometry &g, cudaStream_t s) {
    if constexpr (std::is_same<KV, ap_nvfp4>::value) {
        if (g.form == AP_APPEND_SPLIT) {
            if (a.is_neox)
                split_launch<IN, true>(a, g, s);
            else
                split_launch<IN, false>(a, g, s);
            return;
        }
    }
    if (g.form == AP_APPEND_STAGED)
        ap_append_rope_kernel<IN, KV><<<g.grid, kThreads, g.smem, s>>>(a);
    else if (a.is_neox)
        ap_append_rope_rows_kernel<IN, KV, true><<<g.grid, kThreads, 0, s>>>(a);
    else
        ap_append_rope_rows_kernel<IN, KV, false><<<g.grid, kThreads, 0, s>>>(a);
}

// The cache dtype was checked by append_rope_check: every value reaching here has a kernel.
template <typename IN>
void append_rope_launch(const rope_args &a, ap_dtype kv_dtype, const append_rope_geometry &g,
                        cudaStream_t s) {
    ap_dispatch_cache<true>(kv_dtype, false, [&](auto kv) {
        append_rope_pick<IN, typename decltype(kv)::type>(a, g, s);
        return true;
    });
}

// What the kernels take; one message line for the first thing they do not.
ap_status append_rope_check(const ap_kit_append_rope_args *p, const char *who, ap_msgbuf *msg) {
    const bool in_ok = p->in_dtype == AP_DTYPE_BF16 || p->in_dtype == AP_DTYPE_F16;
    const bool nvfp4 = p->kv_dtype == AP_DTYPE_NVFP4;
    const bool kv_ok = p->kv_dtype == AP_DTYPE_BF16 || p->kv_dtype == AP_DTYPE_F16 ||
                       p->kv_dtype == AP_DTYPE_FP8_E4M3 || nvfp4;
    const int lpr = p->head_dim / kVec;
    const bool rope_ok = p->rotary_dim == 0 ? p->q == NULL
                                            : p->rotary_dim >= 2 && p->rotary_dim % 2 == 0 &&
                                                  p->rotary_dim <= p->head_dim;
    const int64_t strides[6] = {p->q_stride_token, p->q_stride_head,  p->k_stride_token,
                                p->k_stride_head,  p->v_stride_token, p->v_stride_head};
    bool strides_ok = true;
    for (int i = 0; i < 6; i++) strides_ok = strides_ok && strides[i] % kVec == 0;
    if (!in_ok || !kv_ok || p->head_dim % kVec != 0 || lpr < 1 || 32 % lpr != 0 || !rope_ok ||
        (nvfp4 && (p->head_dim % AP_NVFP4_BLOCK != 0 || p->k_block_scales == NULL ||
                   p->v_block_scales == NULL))) {
        ap_msgbuf_add(msg,
                      "%s: KV append: no kernel for input %s into a %s cache with head_dim %d, "
                      "rotary_dim %d%s%s",
                      who, ap_dtype_str(p->in_dtype), ap_dtype_str(p->kv_dtype), p->head_dim,
                      p->rotary_dim, p->rotary_dim == 0 && p->q != NULL ? " (q without RoPE)" : "",
                      nvfp4 && (p->k_block_scales == NULL || p->v_block_scales == NULL)
                          ? " (nvfp4 without block-scale buffers)"
                          : "");
        return AP_ERR_UNSUPPORTED;
    }
    if (!strides_ok) {
        ap_msgbuf_add(msg, "%s: KV append: row strides must be multiples of 8 elements", who);
        return AP_ERR_UNSUPPORTED;
    }
    return AP_OK;
}

rope_args append_rope_args_of(const ap_kit_append_rope_args *p) {
    rope_args a;
    a.q = static_cast<const uint8_t *>(p->q);
    a.q_out = static_cast<uint8_t *>(p->q_out);
    a.src[0] = static_cast<const uint8_t *>(p->k);
    a.src[1] = static_cast<const uint8_t *>(p->v);
    a.q_stride_token = p->q_stride_token;
    a.q_stride_head = p->q_stride_head;
    a.stride_token[0] = p->k_stride_token;
    a.stride_token[1] = p->v_stride_token;
    a.stride_head[0] = p->k_stride_head;
    a.stride_head[1] = p->v_stride_head;
    a.pages[0] = static_cast<uint8_t *>(p->k_pages);
    a.pages[1] = static_cast<uint8_t *>(p->v_pages);
    a.block_scales[0] = static_cast<uint8_t *>(p->k_block_scales);
    a.block_scales[1] = static_cast<uint8_t *>(p->v_block_scales);
    a.scale[0] = p->k_scale;
    a.scale[1] = p->v_scale;
    a.rcp[0] = ap_e4m3_div_rcp(p->k_scale);
    a.rcp[1] = ap_e4m3_div_rcp(p->v_scale);
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
    a.lanes_per_row = p->head_dim / kVec;
    a.lanes_shift = __builtin_ctz((unsigned)a.lanes_per_row);
    a.num_rows = p->num_tokens * (int64_t)(a.num_qo_heads + 2 * a.num_kv_heads);
    a.num_tokens = p->num_tokens;
    return a;
}

// A role of `rows` rows from row_base (none: no CTA) in the split kernel's groups: passes per
// token rounded up to a power of two up to kSplitRows (whole tokens a CTA), past it chunks of
// kSplitRows passes (one token a CTA).
split_role split_role_of(int row_base, int rows, int rows_per_pass) {
    const int passes = (rows + rows_per_pass - 1) / rows_per_pass;
    split_role r = {row_base, row_base + rows, 0, 1, 0};
    while ((1 << r.pass_shift) < passes && (1 << r.pass_shift) < kSplitRows) r.pass_shift++;
    if (passes > kSplitRows) r.chunks = (passes + kSplitRows - 1) / kSplitRows;
    r.ctas = rows == 0 ? 0 : (1 << r.pass_shift) * r.chunks;
    return r;
}

// Which kernel and grid; grid.x 0 when no launch covers the call.
append_rope_geometry append_rope_geometry_of(const rope_args &a, const ap_kit_append_rope_args *p) {
    const int lpr = a.lanes_per_row;
    const int rows_per_pass = kThreads / lpr;
    const int rows_per_token = a.num_qo_heads + 2 * a.num_kv_heads;
    const int rows_per_cta = kRowsPerThread * rows_per_pass;
    const int chunks = (rows_per_token + rows_per_cta - 1) / rows_per_cta;
    const bool rows = (p->is_neox ? p->rotary_dim % (2 * kVec) == 0 : p->rotary_dim % kVec == 0) &&
                      reinterpret_cast<uintptr_t>(p->cos_sin) % 16 == 0 && chunks <= 65535 &&
                      p->num_tokens <= 0x7fffffff;
    append_rope_geometry g = {AP_APPEND_ROWS, dim3(0u, 1u), 0, {}};
    const int64_t groups = (p->num_tokens + kSplitRows - 1) / kSplitRows;
    if (rows && p->kv_dtype == AP_DTYPE_NVFP4 && groups <= 65535) {
        g.form = AP_APPEND_SPLIT;
        g.split.role[0] = split_role_of(0, a.num_qo_heads, rows_per_pass);
        g.split.role[1] = split_role_of(a.num_qo_heads, 2 * a.num_kv_heads, rows_per_pass);
        g.grid = dim3((unsigned)(g.split.role[0].ctas + g.split.role[1].ctas), (unsigned)groups);
        return g;
    }
    const int64_t staged_rows_per_cta = rows_per_pass;
    const int64_t blocks =
        rows ? p->num_tokens : (a.num_rows + staged_rows_per_cta - 1) / staged_rows_per_cta;
    if (blocks > 0x7fffffff) return g;
    g.form = rows ? AP_APPEND_ROWS : AP_APPEND_STAGED;
    g.grid = dim3((unsigned)blocks, rows ? (unsigned)chunks : 1u);
    g.smem = rows ? 0 : (size_t)kThreads * kVec * sizeof(float);
    return g;
}

} // namespace

extern "C" ap_status ap_kit_append_rope_run(const ap_kit_append_rope_args *p, void *stream,
                                            const char *who, ap_msgbuf *msg) {
    ap_status st = append_rope_check(p, who, msg);
    if (st != AP_OK || p->num_tokens == 0) return st;
    const rope_args a = append_rope_args_of(p);
    const append_rope_geometry g = append_rope_geometry_of(a, p);
    if (g.grid.x == 0) {
        ap_msgbuf_add(msg, "%s: KV append: %lld tokens are more than one launch covers", who,
                      (long long)p->num_tokens);
        return AP_ERR_UNSUPPORTED;
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    ap_dispatch_q(p->in_dtype, false, [&](auto in) {
        append_rope_launch<typename decltype(in)::type>(a, p->kv_dtype, g, s);
        return true;
    });
    static const char *const names[] = {"ap_append_rope_kernel", "ap_append_rope_rows_kernel",
                                        "ap_append_rope_split_kernel"};
    return ap_cuda_launch_status(who, names[g.form], msg);
}

// save_kv: the same kernel family without RoPE, slots from the plan (no upper bound is given:
// the plan computed them from page indices the batch check bounded).
extern "C" ap_status ap_kit_paged_append_run(const ap_kit_append_args *p, void *stream,
                                             const char *who, ap_msgbuf *msg) {
    ap_kit_append_rope_args r = {}; // no q, no RoPE
    r.k = p->k;
    r.v = p->v;
    r.k_stride_token = p->k_stride_token;
    r.k_stride_head = p->k_stride_head;
    r.v_stride_token = p->v_stride_token;
    r.v_stride_head = p->v_stride_head;
    r.in_dtype = p->in_dtype;
    r.k_pages = p->k_pages;
    r.v_pages = p->v_pages;
    r.k_block_scales = p->k_block_scales;
    r.v_block_scales = p->v_block_scales;
    r.kv_dtype = p->kv_dtype;
    r.out_loc = p->slots;
    r.out_loc_stride = 1;
    r.num_slots = INT64_MAX;
    r.num_kv_heads = p->num_kv_heads;
    r.head_dim = p->head_dim;
    r.num_tokens = p->num_tokens;
    r.k_scale = p->k_scale;
    r.v_scale = p->v_scale;
    return ap_kit_append_rope_run(&r, stream, who, msg);
}
