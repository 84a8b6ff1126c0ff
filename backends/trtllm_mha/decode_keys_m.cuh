// decode_keys_m.cuh: trtllm_mha's nvfp4 decode step for warps of at most 8 query rows (a GQA
// decode of group <= 8), with the keys on the M side of mma.sync m16n8k16: S^T = K Q^T and
// O^T = V^T P^T. Included by decode.cu after its decode_args and cta_work.
//
// Why: with the rows on M (tile_math_nvfp4) a warp of <= 8 rows leaves rows g + 8 of every
// fragment empty: half of each mma, of Q's A fragments and of O's accumulators is zeros. With the
// keys on M the 8 rows are N: a step takes 16 mma, not 32, for each of QK and PV, Q holds D / 8
// registers (not D / 4) and O D / 4 floats (not D / 2), so the kernel fits 4 CTAs on an SM.
// The K and V fragments are decoded exactly as tile_math_nvfp4 decodes them (the same ldmatrix
// reads, ap_nvfp4_hi_bytes / ap_nvfp4_pair14, the same block scales); only their roles change:
//   K: r[n] (keys 8n + g, dims 32c + 8t .. 8t + 7) are the A rows g (n even) and g + 8 (n odd)
//      of key tile n / 2, k-step 2c (even dims) and 2c + 1 (odd dims); Q is B (n = row g).
//   S^T's C fragment: keys 16mt + g (c0, c1) and + 8 (c2, c3), rows 2t and 2t + 1; packed to
//      halves and transposed by movmatrix it is the B fragment of P^T (keys 2t.., row g).
//   V: the pairs (keys 2t, 2t + 1 of dim 32c + 4g + e) are the A rows of the dims: tile (c, h)
//      has dim 32c + 4g + 2h in row g and 32c + 4g + 2h + 1 in row g + 8.
//   O^T's C fragment: lane (g, t) holds rows 2t, 2t + 1, dims 32c + 4g .. 4g + 3.
#ifndef AP_TRTLLM_MHA_DECODE_KEYS_M_CUH
#define AP_TRTLLM_MHA_DECODE_KEYS_M_CUH

namespace {

// One warp's rows 0..7 of a row block: Q as B fragments (row g), O^T as C fragments, per lane
// the running max m and its share of the denominator l of rows 2t and 2t + 1.
template <int D> struct km_state {
    uint32_t q[D / 16][2];
    float acc[D / 32][2][4];
    float m[2], l[2];
    int limit[2]; // the last key rows 2t, 2t + 1 see (causal): prefix + their token
    int prefix;
};

// Q's row g, its dims in tile_math_nvfp4's order (k-step ks: dims 32 (ks / 2) + 8t + ks % 2
// + {0, 2} in b0, + 4 + {0, 2} in b1), converted to half.
template <int D, typename QT>
__device__ __forceinline__ void km_begin(km_state<D> &st, const cta_work &w, const decode_args &a,
                                         int first_row, int lane) {
    const int g = lane >> 2, t = lane & 3;
    st.prefix = w.prefix;
    const int r = first_row + g;
    const bool live = r < w.rows;
    const int token = live ? r / a.group : 0, head = live ? r % a.group : 0;
    const uint16_t *q16 = reinterpret_cast<const uint16_t *>(
        static_cast<const QT *>(a.q) +
        ((int64_t)(w.q_start + token) * a.num_qo_heads + w.kv_head * a.group + head) * D);
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++)
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const int dim = 32 * (ks >> 1) + 8 * t + (ks & 1) + 4 * hi;
            uint32_t v = 0u;
            if (live) v = (uint32_t)__ldg(q16 + dim) | (uint32_t)__ldg(q16 + dim + 2) << 16;
            if constexpr (!std::is_same<QT, __half>::value) {
                const float2 f = ap_unpack2<QT>(v);
                v = ap_pack2<__half>(f.x, f.y);
            }
            st.q[ks][hi] = v;
        }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int rj = first_row + 2 * t + j;
        st.limit[j] = w.prefix + (rj < w.rows ? rj / a.group : 0);
        st.m[j] = -INFINITY;
        st.l[j] = 0.f;
    }
#pragma unroll
    for (int c = 0; c < D / 32; c++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            st.acc[c][h][0] = st.acc[c][h][1] = st.acc[c][h][2] = st.acc[c][h][3] = 0.f;
}

// A step every row of the warp sees whole: its keys end before key_end and at or before the
// prefix (every row's causal limit is at least the prefix).
template <int D>
__device__ __forceinline__ bool km_step_full(const km_state<D> &st, int first_key, int key_end) {
    return first_key + kTile <= key_end && first_key + kTile - 1 <= st.prefix;
}

// tile_softmax's online softmax over S^T (s[mt][2 hi + j]: key 16mt + 8hi + g, row 2t + j): a
// row's max runs over the lane's 4 keys, then the 8 lanes g of its column (3 shuffles).
// MASKED (v2): 0 for a step known to be full (no mask code at all), 1 for one that may not be,
// -1 (v1) to test it here.
template <int D, int MASKED = -1>
__device__ __forceinline__ void km_softmax(km_state<D> &st, float (&s)[2][4], int first_key,
                                           int key_end, float scale_log2, int g) {
    const bool full = MASKED == 0 || (MASKED < 0 && km_step_full(st, first_key, key_end));
    float alpha[2];
    bool grew = false;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                float x = s[mt][2 * hi + j];
                if (!full) {
                    const int key = first_key + 16 * mt + 8 * hi + g;
                    x = (key < key_end && key <= st.limit[j]) ? x : -INFINITY;
                    s[mt][2 * hi + j] = x;
                }
                tile_max = fmaxf(tile_max, x);
            }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 4));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 8));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 16));
        const float m_new = fmaxf(st.m[j], tile_max * scale_log2);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        alpha[j] = ap_exp2_approx(st.m[j] - base);
        float sum = 0.f;
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                const float p = ap_exp2_approx(fmaf(s[mt][2 * hi + j], scale_log2, -base));
                s[mt][2 * hi + j] = p;
                sum += p;
            }
        st.l[j] = st.l[j] * alpha[j] + sum;
        grew = grew || m_new != st.m[j];
        st.m[j] = m_new;
    }
    if (__any_sync(0xffffffffu, grew))
#pragma unroll
        for (int c = 0; c < D / 32; c++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 4; e++) st.acc[c][h][e] *= alpha[e & 1];
}

// S^T += K Q^T for dims 32c.. of a 32-key step (both forms of the step): kf holds the four
// 8-key groups' decoded K fragments (key 8n + g: dims 8t + {0, 2}, + {4, 6}, + {1, 3}, + {5, 7}).
template <int D>
__device__ __forceinline__ void km_qk(const km_state<D> &st, const uint32_t (&kf)[4][4], int c,
                                      float (&s)[2][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        const uint32_t even[4] = {kf[2 * mt][0], kf[2 * mt + 1][0], kf[2 * mt][1],
                                  kf[2 * mt + 1][1]};
        const uint32_t odd[4] = {kf[2 * mt][2], kf[2 * mt + 1][2], kf[2 * mt][3],
                                 kf[2 * mt + 1][3]};
        ap_mma_16816<__half>(s[mt], even, st.q[2 * c][0], st.q[2 * c][1]);
        ap_mma_16816<__half>(s[mt], odd, st.q[2 * c + 1][0], st.q[2 * c + 1][1]);
    }
}

__device__ __forceinline__ void nvfp4_v_scales2(const uint8_t *scale_v, int c, int g, int t,
                                                uint32_t (&vs)[2][2][2]); // the v2 section's

// O^T += V^T P^T of a 32-key step (both forms): P (s, after km_softmax) packed to P^T by
// movmatrix, V's fragments decoded per 32 dims with their block scales (V2: nvfp4_v_scales2,
// the v2 step's; else nvfp4_v_scales).
template <int D, bool V2>
__device__ __forceinline__ void km_pv(km_state<D> &st, const float (&s)[2][4], uint32_t tile_v,
                                      const uint8_t *scale_v, int lane) {
    constexpr int C = D / 32, SR = D / 16;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t lane_row = lane * (D / 2);
    uint32_t pb[2][2]; // P^T as B: keys 16kk + 2t.. (b0), + 8 (b1), row g
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
        pb[kk][0] = ap_movmatrix_trans(ap_pack2<__half>(s[kk][0], s[kk][1]));
        pb[kk][1] = ap_movmatrix_trans(ap_pack2<__half>(s[kk][2], s[kk][3]));
    }
    uint32_t vs[2][2][2];
#pragma unroll
    for (int c = 0; c < C; c++) {
        if (c % 2 == 0) {
            if constexpr (V2)
                nvfp4_v_scales2(scale_v, c, g, t, vs);
            else
                nvfp4_v_scales<SR>(scale_v, c, g, t, vs);
        }
        uint32_t r[4];
        ap_ldmatrix_x4_trans(r, tile_v + lane_row + ap_swizzle<C>(lane, c) * 16);
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t vf[2][4]; // keys 16kk + 8m + 2t, + 1 of dim 32c + 4g + e
#pragma unroll
            for (int m = 0; m < 2; m++) nvfp4_v_pairs(r[2 * kk + m], vs[c % 2][kk][m], vf[m]);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t va[4] = {vf[0][2 * h], vf[0][2 * h + 1], vf[1][2 * h],
                                        vf[1][2 * h + 1]};
                ap_mma_16816<__half>(st.acc[c][h], va, pb[kk][0], pb[kk][1]);
            }
        }
    }
}

// One 32-key step over an nvfp4 sub-tile (tile_math_nvfp4's arguments), keys on M.
template <int D>
__device__ __forceinline__ void
tile_math_km(km_state<D> &st, uint32_t tile_k, uint32_t tile_v, const uint8_t *scale_k,
             const uint8_t *scale_v, int first_key, int key_end, float scale_log2, int lane) {
    constexpr int C = D / 32, SR = D / 16;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t lane_row = lane * (D / 2);
    float s[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++) s[mt][0] = s[mt][1] = s[mt][2] = s[mt][3] = 0.f;
    uint32_t ks[2][4];
#pragma unroll
    for (int c = 0; c < C; c++) {
        if (c % 2 == 0) nvfp4_k_scales<SR>(scale_k, c, g, t, ks);
        uint32_t r[4];
        ap_ldmatrix_x4(r, tile_k + lane_row + ap_swizzle<C>(lane, c) * 16);
        uint32_t kf[4][4]; // key 8n + g: dims 8t + {0, 2}, + {4, 6}, + {1, 3}, + {5, 7}
#pragma unroll
        for (int n = 0; n < 4; n++) nvfp4_k_pairs(r[n], ks[c % 2][n], kf[n]);
        km_qk<D>(st, kf, c, s);
    }
    km_softmax<D>(st, s, first_key, key_end, scale_log2, g);
    km_pv<D, false>(st, s, tile_v, scale_v, lane);
}

// ---- v2 (D = 128, the default there: option nvfp4_keys_m auto; v1 keeps the step above, as D = 64 does) ----
// The same fragments and the same mma as tile_math_km, with fewer instructions around them
// (counted in the sm_90a SASS of one 32-key step, .dev-notes/nvfp4c.md):
// - K's block scales: one prmt takes the lane's four (p = t / 2: blocks p, 2 + p, 4 + p, 6 + p,
//   one per 32-dim chunk) from the key's 8-byte scale row, two cvt make them two half2, and the
//   scaling multiply reads its half through HMUL2's operand selector (.H0_H0 / .H1_H1): 3
//   instructions per key row of the step, not 2 x (prmt, 2 cvt, shift).
// - V's block-scale pairs: the high pair of a prmt word is converted through the register's
//   upper half (ap_fp8x4_to_half2x2), not after a shift.
// - tile_issue_km2: one page-table shuffle and one slot per thread and stage (its rows share a
//   page), not one per copy.

// Pair of halves times half H (0: low, 1: high) of the half2 `scales`, as bits (the
// duplication folds into HMUL2's operand selector).
template <int H>
__device__ __forceinline__ uint32_t scaled_pair_half(uint32_t pair, uint32_t scales) {
    uint32_t out;
    if constexpr (H == 0)
        asm("{\n.reg .b16 l, h;\n.reg .b32 d;\nmov.b32 {l, h}, %2;\nmov.b32 d, {l, l};\n"
            "mul.rn.f16x2 %0, %1, d;\n}"
            : "=r"(out)
            : "r"(pair), "r"(scales));
    else
        asm("{\n.reg .b16 l, h;\n.reg .b32 d;\nmov.b32 {l, h}, %2;\nmov.b32 d, {h, h};\n"
            "mul.rn.f16x2 %0, %1, d;\n}"
            : "=r"(out)
            : "r"(pair), "r"(scales));
    return out;
}

// K (D = 128): key 8n + g's block scales of chunks 0..3 (blocks 2c + p, p = t / 2): ks[n][0]
// holds chunks 0 (low) and 1 (high), ks[n][1] chunks 2 and 3.
__device__ __forceinline__ void nvfp4_k_scales2(const uint8_t *scale_k, int g, int t,
                                                uint32_t (&ks)[4][2]) {
    const uint32_t sel = (uint32_t)(t >> 1) * 0x1111u + 0x6420u;
#pragma unroll
    for (int n = 0; n < 4; n++) {
        const uint2 row = *reinterpret_cast<const uint2 *>(scale_k + (8 * n + g) * 8);
        ap_fp8x4_to_half2x2(ap_nvfp4_prmt(row.x, row.y, sel), ks[n][0], ks[n][1]);
    }
}

// nvfp4_k_pairs with chunk c's scale: half c % 2 of the lane's scale word.
template <int H>
__device__ __forceinline__ void nvfp4_k_pairs2(uint32_t r, uint32_t sc, uint32_t (&b)[4]) {
    const ap_nvfp4_hi h = ap_nvfp4_hi_bytes(r);
    b[0] = scaled_pair_half<H>(ap_nvfp4_pair14(h.even, 0, 1), sc);
    b[1] = scaled_pair_half<H>(ap_nvfp4_pair14(h.even, 2, 3), sc);
    b[2] = scaled_pair_half<H>(ap_nvfp4_pair14(h.odd, 0, 1), sc);
    b[3] = scaled_pair_half<H>(ap_nvfp4_pair14(h.odd, 2, 3), sc);
}

// V (D = 128): nvfp4_v_scales for chunks c, c + 1 (c even) from both keys' rows (one 16-byte
// load: keys 2t and 2t + 1 are adjacent rows), the high pair read as the upper half.
__device__ __forceinline__ void nvfp4_v_scales2(const uint8_t *scale_v, int c, int g, int t,
                                                uint32_t (&vs)[2][2][2]) {
    const uint32_t sel = (uint32_t)(g >> 2) * 0x1111u + 0x6240u;
#pragma unroll
    for (int kk = 0; kk < 2; kk++)
#pragma unroll
        for (int m = 0; m < 2; m++) {
            const uint4 rows =
                *reinterpret_cast<const uint4 *>(scale_v + (16 * kk + 8 * m + 2 * t) * 8);
            const uint32_t a = c == 0 ? rows.x : rows.y, b = c == 0 ? rows.z : rows.w;
            ap_fp8x4_to_half2x2(ap_nvfp4_prmt(a, b, sel), vs[0][kk][m], vs[1][kk][m]);
        }
}

// tile_math_km, v2 (D = 128). MASKED: whether the step may need the mask (km_step_full), so
// that a full step has no mask code: left to the compiler, the masked softmax is if-converted
// and its ~40 compares and selects run on every step.
template <bool MASKED>
__device__ __forceinline__ void
tile_math_km2(km_state<128> &st, uint32_t tile_k, uint32_t tile_v, const uint8_t *scale_k,
              const uint8_t *scale_v, int first_key, int key_end, float scale_log2, int lane) {
    constexpr int D = 128, C = D / 32;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t lane_row = lane * (D / 2);
    float s[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++) s[mt][0] = s[mt][1] = s[mt][2] = s[mt][3] = 0.f;
    uint32_t ks[4][2];
    nvfp4_k_scales2(scale_k, g, t, ks);
#pragma unroll
    for (int c = 0; c < C; c++) {
        uint32_t r[4];
        ap_ldmatrix_x4(r, tile_k + lane_row + ap_swizzle<C>(lane, c) * 16);
        uint32_t kf[4][4]; // key 8n + g: dims 8t + {0, 2}, + {4, 6}, + {1, 3}, + {5, 7}
#pragma unroll
        for (int n = 0; n < 4; n++) {
            if (c % 2 == 0)
                nvfp4_k_pairs2<0>(r[n], ks[n][c / 2], kf[n]);
            else
                nvfp4_k_pairs2<1>(r[n], ks[n][c / 2], kf[n]);
        }
        km_qk<D>(st, kf, c, s);
    }
    km_softmax<D, MASKED ? 1 : 0>(st, s, first_key, key_end, scale_log2, g);
    km_pv<D, true>(st, s, tile_v, scale_v, lane);
}

// The copies of stage `index` for v2 (D = 128: rows of 4 chunks and an 8-byte scale row, 128
// keys a stage, page-table entries a step ahead). Thread (q = tid / 4, c = tid % 4) copies
// chunk c of rows r0 + 2j (j = 0..3, r0 = 8 (q / 2) + q % 2) and the scale rows of row r0 + 2c.
// The stage starts on a page (key_begin and the stage size are multiples of 128, pages of
// 16..64), so a thread's 8-row group lies in one page: one shuffle and one slot, the four rows
// at slot + 2j. The copies of one instruction are still 8 whole 64-byte rows (the 8 lanes of a
// quarter warp: rows r0 + 2j and r0 + 1 + 2j, one 128-byte line of the stage), and the swizzle
// of row r0 + 2j is chunk c ^ j (ap_swizzle<4>: chunk ^ (row / 2) % 4), an XOR of the
// thread's first destination (the stage and r0 * 64 are multiples of 64).
// Where a thread's copies read (tile_issue_km2), set once before the loop: its chunk of the
// KV head's row in slot 0 of K and of V (one wide multiply-add per copy then).
struct km2_sources {
    const uint8_t *k, *v;
};

// The copy sources' bases: the CTA's (first) KV head, chunk (lane % CHUNKS) of a row, CHUNKS 4
// (v2: a quarter warp's lanes over one head's 64 bytes) or 8 (v2h: over two heads' 128).
// (The moves hide the sum from the compiler, which would otherwise keep only the offset and add
// each base again per copy: two more instructions for each of the stage's 8 copies.)
template <class S, int CHUNKS = 4>
__device__ __forceinline__ km2_sources km2_sources_of(const cta_work &w, const decode_args &a) {
    const int64_t head = (int64_t)w.kv_head * S::raw_row + (threadIdx.x & (CHUNKS - 1)) * 16;
    uint64_t k, v;
    asm("mov.b64 %0, %1;" : "=l"(k) : "l"(a.k_pages + head));
    asm("mov.b64 %0, %1;" : "=l"(v) : "l"(a.v_pages + head));
    return {reinterpret_cast<const uint8_t *>(k), reinterpret_cast<const uint8_t *>(v)};
}

template <class S>
__device__ __forceinline__ void tile_issue_km2(const cta_work &w, const decode_args &a,
                                               const km2_sources &from, int index, uint32_t stage,
                                               int32_t pages) {
    static_assert(S::keys == kThreads && S::raw_chunks == 4 && S::scale_row == 8 &&
                      S::pages_ahead && S::stage_bytes % 64 == 0,
                  "v2: D = 128, 128 keys a stage");
    const int q = threadIdx.x >> 2, c = threadIdx.x & 3, shift = a.log2_page_size;
    const int r0 = 8 * (q >> 1) + (q & 1);
    const int first = w.key_begin + index * S::keys, pos = first + r0;
    const uint32_t page = __shfl_sync(0xffffffffu, pages, (pos >> shift) - (first >> shift));
    const uint32_t slot = (page << shift) + (pos & ((1 << shift) - 1));
    const int left = w.key_end - pos; // row r0 + 2j is a key when 2j < left
    const uint32_t stride = (uint32_t)a.num_kv_heads * S::raw_row;
    const uint32_t dst = stage + r0 * S::raw_row + c * 16;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t at = (dst ^ (16u * j)) + 128u * j;
        const uint64_t src = (uint64_t)(slot + 2 * j) * stride;
        ap_cp_async_16(at, from.k + src, 2 * j < left);
        ap_cp_async_16(at + S::raw_tile, from.v + src, 2 * j < left);
    }
    const uint64_t scale_src =
        (uint64_t)(slot + 2 * c) * ((uint32_t)a.num_kv_heads * 8u) + (uint32_t)w.kv_head * 8u;
    const uint32_t scale_dst = stage + S::rows * S::raw_row + (r0 + 2 * c) * 8;
    cp_async_small<8>(scale_dst, a.k_scales + scale_src, 2 * c < left);
    cp_async_small<8>(scale_dst + S::raw_tile, a.v_scales + scale_src, 2 * c < left);
}

// v2h: one CTA over KV heads 2p and 2p + 1 of a sequence (auto's kernel at D = 128 with an
// even num_kv_heads). A stage holds 64 keys of both heads in the v2 ring layout of 128 rows:
// row h * 64 + k is key k of head 2p + h (its 64 value bytes swizzled as v2's row of that index,
// its 8-byte scale row at keys * raw_row + row * 8), so warp w's 32-row sub-tile is head w / 2,
// keys 32 (w % 2) ..: tile_math_km2 reads it unchanged, and warps (2h, 2h + 1) fold their
// states as v2's key warps do.
// In global memory a key's two heads are 128 contiguous value bytes (NHD: [slot][head][64]) and
// 16 contiguous scale bytes. Thread (w = tid / 32, q = lane / 8, h = lane / 4 % 2, c = lane % 4)
// copies chunk c of head h of keys k = 16w + q + 4j (j = 0..3): the 8 lanes of a quarter warp
// read one key's 128 bytes (one request of one 128-byte line, where v2 read two 64-byte halves
// of two lines), a warp's copy instruction 4 consecutive keys. The thread's four keys lie in the
// 16-key group 16w.. (a stage starts at a multiple of 64 keys; pages of 16..64): one page-table
// shuffle, slots slot + 4j. Destination row h * 64 + k: chunk c ^ (k / 2) % 4 = c ^ q / 2 ^ 2 (j
// % 2), so copy j lands at (dst ^ 32 (j % 2)) + 256 j. Scales: thread tid copies head tid % 2's
// 8 bytes of key tid / 2 (a warp's 32 copies are 16 keys' 16 contiguous bytes, v2's 32 keys' 8).
template <class S>
__device__ __forceinline__ void tile_issue_km2h(const cta_work &w, const decode_args &a,
                                                const km2_sources &from, int index, uint32_t stage,
                                                int32_t pages) {
    static_assert(S::heads == 2 && S::keys == 64 && S::rows == kThreads && S::raw_chunks == 4 &&
                      S::scale_row == 8 && S::pages_ahead && S::stage_bytes % 64 == 0,
                  "v2h: D = 128, 64 keys of two heads a stage");
    const int lane = threadIdx.x & 31, wq = threadIdx.x >> 5, shift = a.log2_page_size;
    const int q = lane >> 3, h = (lane >> 2) & 1, c = lane & 3;
    const int first = w.key_begin + index * S::keys, group0 = first + 16 * wq;
    const uint32_t page = __shfl_sync(0xffffffffu, pages, (group0 >> shift) - (first >> shift));
    const uint32_t slot0 = (page << shift) + (group0 & ((1 << shift) - 1)); // key 16 wq
    const int left = w.key_end - group0; // key 16 wq + i of the stage is a key when i < left
    const uint32_t stride = (uint32_t)a.num_kv_heads * S::raw_row;
    const uint32_t dst = stage + (h * 64 + 16 * wq + q) * S::raw_row + ((c ^ (q >> 1)) * 16);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t at = (dst ^ (32u * (j & 1))) + 256u * j;
        const uint64_t src = (uint64_t)(slot0 + q + 4 * j) * stride;
        ap_cp_async_16(at, from.k + src, q + 4 * j < left);
        ap_cp_async_16(at + S::raw_tile, from.v + src, q + 4 * j < left);
    }
    const int ks = lane >> 1, hs = lane & 1; // key 16 wq + ks, head hs
    const uint64_t scale_src =
        (uint64_t)(slot0 + ks) * ((uint32_t)a.num_kv_heads * 8u) + (uint32_t)(w.kv_head + hs) * 8u;
    const uint32_t scale_dst = stage + S::rows * S::raw_row + (hs * 64 + 16 * wq + ks) * 8;
    cp_async_small<8>(scale_dst, a.k_scales + scale_src, ks < left);
    cp_async_small<8>(scale_dst + S::raw_tile, a.v_scales + scale_src, ks < left);
}

// Rows 2t + j, dims 32c + 4g .. 4g + 3 of O (unnormalised) as four floats.
template <int D> __device__ __forceinline__ float4 km_row4(const km_state<D> &st, int c, int j) {
    return make_float4(st.acc[c][0][j], st.acc[c][0][2 + j], st.acc[c][1][j], st.acc[c][1][2 + j]);
}

// The full denominators of rows 2t and 2t + 1: the lane shares of the 8 lanes g summed.
template <int D> __device__ __forceinline__ void km_row_sums(const km_state<D> &st, float (&l)[2]) {
#pragma unroll
    for (int j = 0; j < 2; j++) {
        l[j] = st.l[j] + __shfl_xor_sync(0xffffffffu, st.l[j], 4);
        l[j] += __shfl_xor_sync(0xffffffffu, l[j], 8);
        l[j] += __shfl_xor_sync(0xffffffffu, l[j], 16);
    }
}

// state_merge for km_state (KW warps over different keys of the same 8 rows): warps 1..KW-1
// leave O, m and the full l of each row in shared memory, warp 0 folds them in.
template <int D>
__device__ __forceinline__ void km_merge(km_state<D> &st, float *scratch, int base, int kg, int kw,
                                         int lane) {
    const int g = lane >> 2, t = lane & 3;
    float l[2];
    km_row_sums<D>(st, l);
    float *mine = scratch + (base + kg) * 16 * (D + 2);
    if (kg > 0) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float *row = mine + (2 * t + j) * (D + 2);
#pragma unroll
            for (int c = 0; c < D / 32; c++) {
                const float4 o = km_row4<D>(st, c, j);
                *reinterpret_cast<float2 *>(row + 32 * c + 4 * g) = make_float2(o.x, o.y);
                *reinterpret_cast<float2 *>(row + 32 * c + 4 * g + 2) = make_float2(o.z, o.w);
            }
            if (g == 0) {
                row[D] = st.m[j];
                row[D + 1] = l[j];
            }
        }
    }
    __syncthreads();
    if (kg > 0) return;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int row = 2 * t + j;
        float m = st.m[j];
        for (int k = 1; k < kw; k++)
            m = fmaxf(m, scratch[(base + k) * 16 * (D + 2) + row * (D + 2) + D]);
        const float ref = m == -INFINITY ? 0.f : m;
        const float own = ap_exp2_approx(st.m[j] - ref);
        float lj = l[j] * own;
#pragma unroll
        for (int c = 0; c < D / 32; c++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                st.acc[c][h][j] *= own;
                st.acc[c][h][2 + j] *= own;
            }
        for (int k = 1; k < kw; k++) {
            const float *other = scratch + (base + k) * 16 * (D + 2) + row * (D + 2);
            const float wk = ap_exp2_approx(other[D] - ref);
            lj += other[D + 1] * wk;
#pragma unroll
            for (int c = 0; c < D / 32; c++) {
                const float2 lo = *reinterpret_cast<const float2 *>(other + 32 * c + 4 * g);
                const float2 hi = *reinterpret_cast<const float2 *>(other + 32 * c + 4 * g + 2);
                st.acc[c][0][j] += lo.x * wk;
                st.acc[c][0][2 + j] += lo.y * wk;
                st.acc[c][1][j] += hi.x * wk;
                st.acc[c][1][2 + j] += hi.y * wk;
            }
        }
        st.m[j] = m;
        st.l[j] = g == 0 ? lj : 0.f; // km_finish sums the eight lanes' shares
    }
}

// state_finish for km_state: o = O / l * v_scale, lse2 = m + log2(l), rows 2t and 2t + 1 of the
// warp (local0 + 2t + j of the CTA's block), to the output or the CTA's partial slot.
template <int D, typename QT>
__device__ __forceinline__ void km_finish(km_state<D> &st, const cta_work &w, const decode_args &a,
                                          int64_t partial, int local0, int block_rows, int lane) {
    const int g = lane >> 2, t = lane & 3;
    float l[2];
    km_row_sums<D>(st, l);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const float inv = l[j] > 0.f ? a.v_scale / l[j] : 0.f;
        const float lse2 = l[j] > 0.f ? st.m[j] + __log2f(l[j]) : -INFINITY;
        const int local = local0 + 2 * t + j;
        const int r = w.block * block_rows + local;
        if (r >= w.rows) continue;
        if (a.num_splits == 1) {
            const int64_t row = (int64_t)(w.q_start + r / a.group) * a.num_qo_heads +
                                w.kv_head * a.group + r % a.group;
            QT *out = static_cast<QT *>(a.out) + row * D;
#pragma unroll
            for (int c = 0; c < D / 32; c++) {
                const float4 o = km_row4<D>(st, c, j);
                *reinterpret_cast<uint2 *>(out + 32 * c + 4 * g) = make_uint2(
                    ap_pack2<QT>(o.x * inv, o.y * inv), ap_pack2<QT>(o.z * inv, o.w * inv));
            }
            if (a.lse != NULL && g == 0) a.lse[row] = ap_lse2_to_ln(lse2);
        } else {
            float *out = a.partial_out + (partial * MHA_BLOCK_ROWS + local) * D;
#pragma unroll
            for (int c = 0; c < D / 32; c++) {
                const float4 o = km_row4<D>(st, c, j);
                *reinterpret_cast<float4 *>(out + 32 * c + 4 * g) =
                    make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
            }
            if (g == 0) a.partial_lse[partial * MHA_BLOCK_ROWS + local] = lse2;
        }
    }
}

} // namespace

#endif // AP_TRTLLM_MHA_DECODE_KEYS_M_CUH
