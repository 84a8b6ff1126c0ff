// decode_finish.cuh: the 16/64-row decode kernel's per-thread state and its end (row sums,
// then the output rows or the CTA's partial state for the split-KV combine). Included by decode.cu
// only; split from it to keep that file to one screenful of jobs.
#ifndef AP_TRTLLM_MLA_DECODE_FINISH_CUH
#define AP_TRTLLM_MLA_DECODE_FINISH_CUH

#include <cuda_runtime.h>
#include <math.h>

#include "../common/dtype.cuh"
#include "decode_seq.cuh"
#include "mla.h"

namespace {

// Where this thread sits: lane (g = lane/4, t4 = lane%4) of warp (rb, cs): row block rb of the
// CTA's rows, column split cs of the tile's tokens and of the output dims.
struct WarpPos {
    int lane, g, t4, rb, cs;
};

// One warp's running state over its rows: O (rows rb*16 + g, + 8; its output dims), row maxima
// and sums, base 2.
template <int NT> struct RowState {
    float o[NT][4];
    float m_run[2], l_run[2];
};

// rows_finish's stores for the fp8 fragment layout: o[2 c] and o[2 c + 1] hold chunk c's even and
// odd dims, so a lane writes dims D + 4 t4 .. + 3 of chunk D (tile_pv) in one store.
template <int M, class L>
__device__ __forceinline__ void
finish_frag8(const mla_decode_params &p, const Seq &sq, const RowState<L::kDN / 8> &st,
             const WarpPos &w, int gr, int r, int h, float outs, float lse2, int slot) {
    if (slot < 0) {
        const int64_t orow = out_row(p, sq, gr);
        uint8_t *dst = static_cast<uint8_t *>(p.out) + orow * MLA_LATENT * 2;
#pragma unroll
        for (int c = 0; c < L::kDN / 16; c++) {
            const int d = w.cs * L::kDN + c * 16 + 4 * w.t4;
            *reinterpret_cast<uint2 *>(dst + d * 2) = make_uint2(
                ap_pack2<__nv_bfloat16>(st.o[2 * c][2 * h] * outs, st.o[2 * c + 1][2 * h] * outs),
                ap_pack2<__nv_bfloat16>(st.o[2 * c][2 * h + 1] * outs,
                                        st.o[2 * c + 1][2 * h + 1] * outs));
        }
        if (p.lse != NULL && w.cs == 0 && w.t4 == 0) p.lse[orow] = lse2 * 0.69314718055994531f;
    } else {
        const int64_t prow = static_cast<int64_t>(slot) * M + r;
        float *dst = p.partial_out + prow * MLA_LATENT;
#pragma unroll
        for (int c = 0; c < L::kDN / 16; c++) {
            const int d = w.cs * L::kDN + c * 16 + 4 * w.t4;
            *reinterpret_cast<float4 *>(dst + d) =
                make_float4(st.o[2 * c][2 * h] * outs, st.o[2 * c + 1][2 * h] * outs,
                            st.o[2 * c][2 * h + 1] * outs, st.o[2 * c + 1][2 * h + 1] * outs);
        }
        if (w.cs == 0 && w.t4 == 0) p.partial_lse[prow] = lse2;
    }
}

// End: full row sums (the other column splits' through red_sum), then rows rb*16 + g (+8),
// dims cs*DN + i*8 + 2*t4 to the output (slot < 0), or to partial slot `slot` when the rows'
// KV is split.
template <int M, class L>
__device__ __forceinline__ void rows_finish(const mla_decode_params &p, const Seq &sq,
                                            RowState<L::kDN / 8> &st, float *red_sum,
                                            const WarpPos &w, int row0, int rows, int slot) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        st.l_run[h] += __shfl_xor_sync(0xffffffffu, st.l_run[h], 1);
        st.l_run[h] += __shfl_xor_sync(0xffffffffu, st.l_run[h], 2);
    }
    __syncthreads();
    if (w.t4 == 0) {
        red_sum[w.cs * M + w.rb * 16 + w.g] = st.l_run[0];
        red_sum[w.cs * M + w.rb * 16 + w.g + 8] = st.l_run[1];
    }
    __syncthreads();
    float inv[2], lse2[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = 0.f;
#pragma unroll
        for (int c = 0; c < L::kSplits; c++) l += red_sum[c * M + w.rb * 16 + w.g + 8 * h];
        inv[h] = l > 0.f ? 1.f / l : 0.f;
        lse2[h] = l > 0.f ? st.m_run[h] + log2f(l) : -INFINITY;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = w.rb * 16 + w.g + 8 * h;
        const int gr = row0 + r;
        if (gr >= rows) continue;
        const float outs = inv[h] * p.kv_scale;
        if constexpr (L::kFragFp8) {
            finish_frag8<M, L>(p, sq, st, w, gr, r, h, outs, lse2[h], slot);
        } else if (slot < 0) {
            const int64_t orow = out_row(p, sq, gr);
            uint8_t *dst = static_cast<uint8_t *>(p.out) + orow * MLA_LATENT * 2;
#pragma unroll
            for (int i = 0; i < L::kDN / 8; i++) {
                const int d = w.cs * L::kDN + i * 8 + 2 * w.t4;
                *reinterpret_cast<uint32_t *>(dst + d * 2) =
                    ap_pack2<__nv_bfloat16>(st.o[i][2 * h] * outs, st.o[i][2 * h + 1] * outs);
            }
            if (p.lse != NULL && w.cs == 0 && w.t4 == 0)
                p.lse[orow] = lse2[h] * 0.69314718055994531f;
        } else {
            const int64_t prow = static_cast<int64_t>(slot) * M + r;
            float *dst = p.partial_out + prow * MLA_LATENT;
#pragma unroll
            for (int i = 0; i < L::kDN / 8; i++) {
                const int d = w.cs * L::kDN + i * 8 + 2 * w.t4;
                *reinterpret_cast<float2 *>(dst + d) =
                    make_float2(st.o[i][2 * h] * outs, st.o[i][2 * h + 1] * outs);
            }
            if (w.cs == 0 && w.t4 == 0) p.partial_lse[prow] = lse2[h];
        }
    }
}

} // namespace

#endif // AP_TRTLLM_MLA_DECODE_FINISH_CUH
