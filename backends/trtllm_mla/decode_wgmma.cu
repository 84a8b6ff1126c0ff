// decode_wgmma.cu: MLA absorbed decode for 64-row blocks on Hopper (sm_90a): TMA + mbarriers +
// wgmma, one producer warp and two consumer warpgroups. Same math, row order, split-KV plan,
// partial states and combine (combine.cu) as decode.cu's 64-row kernel; bf16 latent cache.
//
// Shared memory (1024-aligned): Q [64][576] as nine 64-column blocks of 128-byte rows in the
// 128-byte swizzle (8 KB each, 72 KB), a 2-stage ring of latent tiles [64 tokens][576] in the same
// layout (TMA boxes of 64 columns x 32 rows, so pages of 32 and 64 both work), P [64][64] bf16
// (one swizzled block), the row max / sum exchange and the barriers: 225 KB.
// Consumer warpgroup c (0, 1) computes S for keys 32c..32c+31 of the tile (wgmma m64n32, 36
// k-steps over 576), the two exchange their row maxima through shared memory, each writes its
// half of P (bf16), and then each accumulates O[:, 256c..256c+255] += P V over all 64 keys
// (wgmma m64n256k16, B = V rows MN-major): S is computed once, O is split by columns (128 fp32
// registers a thread).
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>

#include <atomic>

#include "../common/cp_async.cuh"
#include "../common/cuda_status.cuh"
#include "../common/dtype.cuh"
#include "../common/mma.cuh"
#include "../common/pdl.cuh"
#include "decode_seq.cuh"
#include "mla.h"

#ifdef AP_KIT_HOPPER
#include "../common/sm90.cuh"
#include "../common/wgmma.cuh"
#endif

#define MLA_WG_WHO "trtllm_mla decode (wgmma)"

#ifdef AP_KIT_HOPPER
namespace {

using namespace ap_sm90;

constexpr int kThreads = 384;               // producer warpgroup + two consumer warpgroups
constexpr int kBlockBytes = 64 * 128;       // one 64-column block of 64 rows
constexpr int kTileBytes = 9 * kBlockBytes; // Q or one latent tile: 72 KB
constexpr int kOffK = kTileBytes;
constexpr int kOffP = kOffK + 2 * kTileBytes;
constexpr int kOffRed = kOffP + kBlockBytes; // red_max [2][64], red_sum [2][64]
constexpr int kOffBar = kOffRed + 4 * 64 * 4;
constexpr int kSmemBytes = kOffBar + 64 + 1024; // + alignment slack
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kSmemBytes <= 232448, "over the H100's shared memory per block");

struct Bars {
    uint64_t full[2], empty[2];
};

// Byte offset of (row, 16-byte chunk) in a [64][576] tile of 64-column swizzled blocks.
__device__ __forceinline__ uint32_t sw_off(int row, int chunk) {
    return static_cast<uint32_t>((chunk >> 3) * kBlockBytes + row * 128 +
                                 (((chunk & 7) ^ (row & 7)) << 4));
}

// The producer's one thread: tiles t_begin..t_end into the ring, each 18 boxes (nine 64-column
// blocks x two 32-row halves) completing on full[stage]; a stage is reused once the 8 consumer
// warps released it.
__device__ void produce(const CUtensorMap *map, const mla_decode_params &p, const Seq &sq,
                        uint8_t *k, Bars *b, int t_begin, int t_end) {
    const int npages = (sq.kv_len + p.page_size - 1) / p.page_size;
    for (int tile = t_begin; tile < t_end; tile++) {
        const int i = tile - t_begin, st = i & 1;
        if (i >= 2) bar_wait(&b->empty[st], ((i >> 1) + 1) & 1);
        bar_expect_tx(&b->full[st], kTileBytes);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int slot;
            if (p.page_size == 64) {
                slot = __ldg(sq.pages + tile) * 64 + half * 32;
            } else {
                int pi = 2 * tile + half;
                if (pi >= npages) pi = 2 * tile; // past the sequence: any loaded page, masked
                slot = __ldg(sq.pages + pi) * 32;
            }
#pragma unroll
            for (int kb = 0; kb < 9; kb++)
                tma_load(map, k + st * kTileBytes + kb * kBlockBytes + half * 4096, &b->full[st],
                         kb * 64, 0, slot);
        }
    }
}

// Q rows row0.. of the sequence into shared memory (cp.async, in place from q_nope / q_rope;
// zero rows past the sequence's rows), by the 256 consumer threads.
__device__ __forceinline__ void load_q(const mla_decode_params &p, const Seq &sq, int row0,
                                       uint8_t *q, int ct) {
    const uint32_t base = smem_u32(q);
    const uint8_t *qn = static_cast<const uint8_t *>(p.q_nope);
    const uint8_t *qr = static_cast<const uint8_t *>(p.q_rope);
    const int rows = sq.q_len * p.num_heads;
    for (int i = ct; i < 64 * 72; i += 256) {
        const int r = i / 72, c = i % 72;
        const int gr = row0 + r;
        const bool valid = gr < rows;
        const int tok = valid ? gr / p.num_heads : 0, head = valid ? gr % p.num_heads : 0;
        const int64_t t = sq.q_begin + tok;
        const uint8_t *src =
            c < 64 ? qn + 2 * (t * p.q_stride_t + head * p.q_stride_h + c * 8)
                   : qr + 2 * (t * p.qr_stride_t + head * p.qr_stride_h + (c - 64) * 8);
        ap_cp_async_16(base + sw_off(r, c), src, valid);
    }
    ap_cp_async_commit();
    ap_cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// What one consumer thread is: warpgroup c, warp w of it, lane (g = lane / 4, t4 = lane % 4);
// its rows are w*16 + g and + 8.
struct Pos {
    int c, w, g, t4;
};

struct State {
    float o[128];
    float m_run[2], l_run[2];
};

// S = Q K^T over keys 32c.. of the tile: 36 k-steps of 16.
__device__ __forceinline__ void qk(float (&s)[16], const uint8_t *q, const uint8_t *k, int c) {
    wg_fence();
#pragma unroll
    for (int kb = 0; kb < 9; kb++)
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const uint64_t da = make_desc(q + kb * kBlockBytes + kk * 32, 16, 1024);
            const uint64_t db = make_desc(k + kb * kBlockBytes + c * 4096 + kk * 32, 16, 1024);
            wgmma_ss_n32_bf16(s, da, db, kb + kk > 0);
        }
    wg_commit();
    wg_wait0();
}

// O[:, 256c..] += P V over the tile's 64 keys.
__device__ __forceinline__ void pv(float (&o)[128], const uint8_t *pm, const uint8_t *k, int c) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint64_t da = make_desc(pm + kk * 32, 16, 1024);
        const uint64_t db = make_desc(k + 4 * c * kBlockBytes + kk * 2048, kBlockBytes, 1024);
        wgmma_ss_n256t_bf16(o, da, db, 1);
    }
    wg_commit();
    wg_wait0();
}

// Online softmax of one tile: mask, row maxima exchanged between the warpgroups, P (bf16) into
// shared memory, row sums and O rescaled. Ends with P complete for both warpgroups.
__device__ __forceinline__ void softmax(float (&s)[16], State &st, const Pos &ps, const Seq &sq,
                                        int tile, const int (&limit)[2], float scale2,
                                        float *red_max, uint8_t *pm, uint8_t *k) {
    if (tile * MLA_TILE + MLA_TILE - 1 > sq.kv_len - sq.q_len) {
#pragma unroll
        for (int e = 0; e < 16; e++) {
            const int pos = tile * MLA_TILE + ps.c * 32 + (e >> 2) * 8 + 2 * ps.t4 + (e & 1);
            if (pos > limit[(e >> 1) & 1]) s[e] = -INFINITY;
        }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int e = 0; e < 16; e++) mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], s[e]);
    const int r0 = ps.w * 16 + ps.g;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        if (ps.t4 == 0) red_max[ps.c * 64 + r0 + 8 * h] = mx[h];
    }
    named_sync<256>(1); // both S done (so both P V of the last tile too): maxima, P, V rows free
    float m_use[2], alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float t = fmaxf(red_max[r0 + 8 * h], red_max[64 + r0 + 8 * h]);
        const float m_new = fmaxf(st.m_run[h], t * scale2);
        m_use[h] = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = ex2(st.m_run[h] - m_use[h]);
        st.m_run[h] = m_new;
    }
    // Keys past the sequence in its last tile: zero this warpgroup's V columns of those rows (the
    // page may hold anything there, and 0 x NaN is NaN).
    const int valid = sq.kv_len - tile * MLA_TILE;
    if (valid < MLA_TILE) {
        const int tid = ps.w * 32 + ps.g * 4 + ps.t4;
        for (int i = tid; i < (MLA_TILE - valid) * 32; i += 128) {
            const int row = valid + i / 32, blk = 4 * ps.c + (i % 32) / 8, ch = i % 8;
            *reinterpret_cast<uint4 *>(k + blk * kBlockBytes + row * 128 + ch * 16) =
                make_uint4(0, 0, 0, 0);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float a = ex2(s[4 * j + 2 * h] * scale2 - m_use[h]);
            const float b2 = ex2(s[4 * j + 2 * h + 1] * scale2 - m_use[h]);
            rs[h] += a + b2;
            const int row = r0 + 8 * h, key = ps.c * 32 + j * 8 + 2 * ps.t4;
            *reinterpret_cast<uint32_t *>(pm + row * 128 + (((key >> 3) ^ (row & 7)) << 4) +
                                          (key & 7) * 2) = ap_pack2<__nv_bfloat16>(a, b2);
        }
#pragma unroll
    for (int h = 0; h < 2; h++) st.l_run[h] = st.l_run[h] * alpha[h] + rs[h];
#pragma unroll
    for (int i = 0; i < 128; i++) st.o[i] *= alpha[(i >> 1) & 1];
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_sync<256>(1); // P and the zeroed rows visible to both warpgroups' wgmma
}

// End: row sums of both warpgroups, then this warpgroup's 256 columns of the rows to out, or to
// the CTA's partial slot when the KV is split (as decode.cu's rows_finish).
__device__ void finish(const mla_decode_params &p, const Seq &sq, State &st, float *red_sum,
                       const Pos &ps, int row0, int rows, int cta) {
    const int r0 = ps.w * 16 + ps.g;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        st.l_run[h] += __shfl_xor_sync(0xffffffffu, st.l_run[h], 1);
        st.l_run[h] += __shfl_xor_sync(0xffffffffu, st.l_run[h], 2);
        if (ps.t4 == 0) red_sum[ps.c * 64 + r0 + 8 * h] = st.l_run[h];
    }
    named_sync<256>(1);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + 8 * h, gr = row0 + r;
        const float l = red_sum[r] + red_sum[64 + r];
        const float lse2 = l > 0.f ? st.m_run[h] + log2f(l) : -INFINITY;
        const float outs = (l > 0.f ? 1.f / l : 0.f) * p.kv_scale;
        if (gr >= rows) continue;
        if (p.num_splits == 1) {
            const int64_t orow = out_row(p, sq, gr);
            uint8_t *dst = static_cast<uint8_t *>(p.out) + orow * MLA_LATENT * 2;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const int d = ps.c * 256 + j * 8 + 2 * ps.t4;
                *reinterpret_cast<uint32_t *>(dst + d * 2) = ap_pack2<__nv_bfloat16>(
                    st.o[4 * j + 2 * h] * outs, st.o[4 * j + 2 * h + 1] * outs);
            }
            if (p.lse != NULL && ps.c == 0 && ps.t4 == 0) p.lse[orow] = lse2 * 0.69314718055994531f;
        } else {
            const int64_t prow = static_cast<int64_t>(cta) * 64 + r;
            float *dst = p.partial_out + prow * MLA_LATENT;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const int d = ps.c * 256 + j * 8 + 2 * ps.t4;
                *reinterpret_cast<float2 *>(dst + d) =
                    make_float2(st.o[4 * j + 2 * h] * outs, st.o[4 * j + 2 * h + 1] * outs);
            }
            if (ps.c == 0 && ps.t4 == 0) p.partial_lse[prow] = lse2;
        }
    }
}

__device__ void consume(const mla_decode_params &p, const Seq &sq, uint8_t *base, Bars *b, int row0,
                        int rows, int cta, int t_begin, int t_end) {
    const int ct = threadIdx.x - 128, lane = ct & 31;
    const Pos ps = {ct >> 7, (ct >> 5) & 3, lane >> 2, lane & 3};
    uint8_t *q = base, *pm = base + kOffP;
    float *red = reinterpret_cast<float *>(base + kOffRed);
    load_q(p, sq, row0, q, ct);
    named_sync<256>(1);
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int gr = row0 + ps.w * 16 + ps.g + 8 * h;
        limit[h] = sq.kv_len - sq.q_len + (gr < rows ? gr / p.num_heads : 0);
    }
    const float scale2 = p.sm_scale * p.kv_scale * kLog2e;
    State st;
#pragma unroll
    for (int i = 0; i < 128; i++) st.o[i] = 0.f;
    st.m_run[0] = st.m_run[1] = -INFINITY;
    st.l_run[0] = st.l_run[1] = 0.f;
    for (int tile = t_begin; tile < t_end; tile++) {
        const int i = tile - t_begin, stg = i & 1;
        uint8_t *k = base + kOffK + stg * kTileBytes;
        bar_wait(&b->full[stg], (i >> 1) & 1);
        float s[16];
        qk(s, q, k, ps.c);
        softmax(s, st, ps, sq, tile, limit, scale2, red, pm, k);
        pv(st.o, pm, k, ps.c);
        release_stage(&b->empty[stg]);
    }
    ap_pdl_launch_dependents();
    finish(p, sq, st, red + 128, ps, row0, rows, cta);
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_wgmma_kernel(const __grid_constant__ CUtensorMap map,
                            const __grid_constant__ mla_decode_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                ~static_cast<uintptr_t>(1023));
    Bars *b = reinterpret_cast<Bars *>(base + kOffBar);
    const int split = blockIdx.x, rb_cta = blockIdx.y, seq = blockIdx.z;
    const Seq sq = seq_of(p, seq);
    const int row0 = rb_cta * 64, rows = sq.q_len * p.num_heads;
    const int cta = (seq * gridDim.y + rb_cta) * gridDim.x + split;
    if (row0 >= rows) return; // a row block past this sequence's rows: nothing to write
    const int tiles = (sq.kv_len + MLA_TILE - 1) / MLA_TILE;
    const int per = (tiles + p.num_splits - 1) / p.num_splits;
    const int t_begin = min(split * per, tiles), t_end = min(t_begin + per, tiles);
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; s++) {
            bar_init(&b->full[s], 1);
            bar_init(&b->empty[s], 8); // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) produce(&map, p, sq, base + kOffK, b, t_begin, t_end);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        consume(p, sq, base, b, row0, rows, cta, t_begin, t_end);
    }
#endif
}

// The latent cache as a 3-D map {576 columns, 1, slots}: boxes of 64 columns x 32 rows, 128-byte
// swizzle; slots = num_pages * page_size of the cache (every box the producer asks for lies in a
// page of the sequence).
int make_kv_map(CUtensorMap *map, const void *kv, int64_t slots) {
    EncodeTiledFn fn = encode_tiled_fn();
    if (fn == nullptr) return -1;
    const cuuint64_t dims[3] = {MLA_ROW, 1, static_cast<cuuint64_t>(slots)};
    const cuuint64_t strides[2] = {MLA_ROW * 2, MLA_ROW * 2};
    const cuuint32_t box[3] = {64, 1, 32};
    const cuuint32_t estride[3] = {1, 1, 1};
    const CUresult r =
        fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void *>(kv), dims, strides, box,
           estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -2;
}

int device_is_sm90() {
    static std::atomic<int> cached{-1};
    int v = cached.load();
    if (v >= 0) return v;
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    v = major == 9 && minor == 0;
    cached.store(v);
    return v;
}

} // namespace

extern "C" int mla_decode_wgmma_covers(const mla_decode_params *p) {
    return p->kv_dtype == AP_DTYPE_BF16 &&
           mla_decode_block_rows(p->num_heads, p->max_q_len) == 64 &&
           (p->page_size == 32 || p->page_size == 64) && p->kv_slots > 0 &&
           p->kv_slots <= (static_cast<int64_t>(1) << 32) &&
           (reinterpret_cast<uintptr_t>(p->kv_pages) & 15) == 0 && encode_tiled_fn() != nullptr &&
           device_is_sm90();
}

extern "C" ap_status mla_decode_wgmma_run(const mla_decode_params *p, void *stream_ptr,
                                          ap_msgbuf *msg) {
    if (p->num_seqs == 0) return AP_OK;
    static std::atomic<uint64_t> ready{0};
    ap_status st =
        ap_cuda_smem_optin_once(mla_decode_wgmma_kernel, kSmemBytes, ready, MLA_WG_WHO, msg);
    if (st != AP_OK) return st;
    CUtensorMap map;
    if (p->kv_slots <= 0 || p->kv_slots > (static_cast<int64_t>(1) << 32)) {
        ap_msgbuf_add(msg, "%s: the latent cache has %lld rows (1 .. 2^32 needed)", MLA_WG_WHO,
                      static_cast<long long>(p->kv_slots));
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (make_kv_map(&map, p->kv_pages, p->kv_slots) != 0) {
        ap_msgbuf_add(msg, "%s: cuTensorMapEncodeTiled failed for the latent cache", MLA_WG_WHO);
        return AP_ERR_CUDA;
    }
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    const int row_blocks = (p->max_q_len * p->num_heads + 63) / 64;
    dim3 grid(p->num_splits, row_blocks, p->num_seqs);
    mla_decode_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(map, *p);
    st = ap_cuda_launch_status(MLA_WG_WHO, "mla_decode_wgmma_kernel", msg);
    if (st != AP_OK || p->num_splits == 1) return st;
    return mla_combine_run(p, 64, stream, msg);
}

#else // no sm_90a code in this build: decode.cu serves every case

extern "C" int mla_decode_wgmma_covers(const mla_decode_params *p) {
    (void)p;
    return 0;
}

extern "C" ap_status mla_decode_wgmma_run(const mla_decode_params *p, void *stream_ptr,
                                          ap_msgbuf *msg) {
    (void)p;
    (void)stream_ptr;
    ap_msgbuf_add(msg, "%s: not built (no sm_90a code)", MLA_WG_WHO);
    return AP_ERR_UNSUPPORTED;
}

#endif
