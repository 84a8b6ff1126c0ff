// append_rope_persist.cuh: round 3 of the kit append's split kernel for nvfp4 caches
// (AP_APPEND_NVFP4_SPLIT 3), included by append_rope.cu after append_rope_split.cuh, whose roles,
// row helpers and rows_piece it reuses.
#ifndef AP_COMMON_APPEND_ROPE_PERSIST_CUH
#define AP_COMMON_APPEND_ROPE_PERSIST_CUH

// Round 2's CTA lives one group of 8 tokens: its rows' cp.async, then positions and slots, a
// barrier, the cos/sin rows at those positions, a barrier, then the math and stores; its loads in
// flight drop to zero before it ends. Here a CTA keeps its role (blockIdx.x, as in round 2) and
// walks the groups blockIdx.y, + gridDim.y, ... (about one wave of CTAs), with kSplitStages
// groups in a ring of shared memory: while it does group i's math, the rows and cos/sin rows of
// groups i + 1 .. i + kSplitStages - 1 are in flight (cp.async), and the positions and slots of
// group i + kSplitStages load into registers (stored after the math). Per CTA at 32/8 heads D128
// (rotary 128): 3 x 32 KB of rows + 3 x 4 KB of cos/sin + the rings = 108 KB, 2 CTAs per SM,
// 2 x 2 x 32 KB = 128 KB of rows in flight per SM at every point of the loop, not only at each
// CTA's start. Each thread reads back only the rows it copied (its own wait); the cos/sin rows
// and positions are read by every thread, so a barrier follows the wait and the ring writes.
constexpr int kSplitStages = 3;

// The dynamic shared memory of a persistent CTA: rows [stage][kSplitRows][kThreads], cos/sin
// [stage][kSplitRows][rotary_dim], positions and slots [kSplitStages + 1][kSplitRows].
__host__ __device__ constexpr size_t persist_rows_bytes() {
    return (size_t)kSplitStages * kSplitRows * kThreads * sizeof(uint4);
}
__host__ __device__ inline size_t persist_cos_sin_bytes(int rotary_dim) {
    return (size_t)kSplitStages * kSplitRows * (size_t)rotary_dim * sizeof(float);
}
__host__ __device__ inline size_t persist_smem_bytes(int rotary_dim) {
    return persist_rows_bytes() + persist_cos_sin_bytes(rotary_dim) +
           2 * (kSplitStages + 1) * kSplitRows * sizeof(int32_t);
}

// A CTA's place in every group: its first token and chunk (fixed by blockIdx.x and the role).
struct persist_cta {
    split_role role;
    int64_t token_offset; // from the group's first token
    int chunk;
    int tokens;    // kSplitRows >> pass_shift
    int row_first; // this thread's first row (row_base + chunk's rows + lane group)
    int rows_per_pass;
    int d0;
};

// Item i's positions and slots: what this thread (one of the first `tokens`) loads for token t.
__device__ __forceinline__ void persist_pos_slot(const rope_args &a, int64_t token_first,
                                                 bool item_live, int32_t *pos, int32_t *slot) {
    const int64_t token = token_first + threadIdx.x;
    const bool live = item_live && token < a.num_tokens;
    *pos = live && a.rotary_dim > 0 ? __ldg(a.positions + token * a.positions_stride) : 0;
    *slot = live ? __ldg(a.out_loc + token * a.out_loc_stride) : -1;
}

// The cp.async of an item's rows (this thread's kSplitRows pieces) and cos/sin rows (the CTA's
// tokens, spread over the threads) into one stage. Dead rows and invalid tokens read nothing
// and hold zeros (their address: row 0 of token 0, or the table's first row).
template <typename IN>
__device__ __forceinline__ void persist_issue(const rope_args &a, const persist_cta &c,
                                              int64_t token_first, uint4 *raw, float *cos_sin,
                                              const int32_t *pos, const int32_t *slot) {
    const int pass_mask = (1 << c.role.pass_shift) - 1;
#pragma unroll
    for (int j = 0; j < kSplitRows; j++) {
        const int64_t token = token_first + (j >> c.role.pass_shift);
        const int r = c.row_first + (j & pass_mask) * c.rows_per_pass;
        const bool live = token < a.num_tokens && r < c.role.row_end;
        const row_of w = row_kind(a, live ? r : c.role.row_base);
        const uint8_t *src = w.kind == 0 ? a.q : a.src[w.kind - 1];
        const uint8_t *p = src + row_src_offset(a, w, live ? token : 0, c.d0, sizeof(IN));
        ap_cp_async_16((uint32_t)__cvta_generic_to_shared(raw + j * kThreads + threadIdx.x), p,
                       live);
    }
    if (a.rotary_dim > 0) {
        const int n4 = a.rotary_dim / 4;
        for (int i = (int)threadIdx.x; i < c.tokens * n4; i += kThreads) {
            const int t = i / n4, e = i - t * n4;
            const bool valid = token_valid(a, pos[t], slot[t]);
            const float *row = a.cos_sin + (valid ? (int64_t)pos[t] * a.rotary_dim + 4 * e : 0);
            ap_cp_async_16((uint32_t)__cvta_generic_to_shared(cos_sin + t * a.rotary_dim + 4 * e),
                           row, valid);
        }
    }
}

// An item's math and stores, its rows and cos/sin in one stage (round 2's second half).
template <typename IN, typename KV, bool kNeox>
__device__ __forceinline__ void
persist_compute(const rope_args &a, const persist_cta &c, int64_t token_first, const uint4 *raw,
                const float *cos_sin, const int32_t *pos, const int32_t *slot) {
    const int lane = threadIdx.x & (a.lanes_per_row - 1);
    const int half = a.rotary_dim / 2;
    const bool rotates = c.d0 < a.rotary_dim;
    const bool first = kNeox ? c.d0 < half : true;
    const int half_lanes = half / kVec;
    const int partner_lane =
        !kNeox || !rotates ? lane : (first ? lane + half_lanes : lane - half_lanes);
    const int pass_mask = (1 << c.role.pass_shift) - 1;
#pragma unroll 1
    for (int j = 0; j < kSplitRows; j++) {
        const int t = j >> c.role.pass_shift;
        // the same for the whole CTA, so skipping never splits a shuffle; slot -1 past the end
        if (!token_valid(a, pos[t], slot[t])) continue;
        float cv[kVec], sv[kVec];
        if (rotates)
            rope_cos_sin_row<kNeox>(
                cos_sin + t * a.rotary_dim, half, c.d0, first, cv, sv,
                [](const float *p) { return *reinterpret_cast<const float4 *>(p); });
        rows_piece<IN, KV, kNeox>(a, token_first + t, slot[t],
                                  c.row_first + (j & pass_mask) * c.rows_per_pass, c.role.row_end,
                                  c.d0, raw[j * kThreads + threadIdx.x], partner_lane, rotates,
                                  first, cv, sv);
    }
}

// One role's walk over its groups (every thread of the CTA runs the same iterations: the
// barriers and the shuffles in rows_piece).
template <typename IN, typename KV, bool kNeox>
__device__ __forceinline__ void persist_walk(const rope_args &a, const persist_cta &c,
                                             unsigned char *smem) {
    constexpr int S = kSplitStages, R = kSplitStages + 1;
    uint4 *raw = reinterpret_cast<uint4 *>(smem);
    float *cos_sin = reinterpret_cast<float *>(smem + persist_rows_bytes());
    int32_t *pos = reinterpret_cast<int32_t *>(smem + persist_rows_bytes() +
                                               persist_cos_sin_bytes(a.rotary_dim));
    int32_t *slot = pos + R * kSplitRows;
    const int64_t groups = (a.num_tokens + kSplitRows - 1) / kSplitRows;
    const int64_t y = blockIdx.y, step = gridDim.y;
    if (y >= groups) return; // the whole CTA
    const int64_t n = (groups - 1 - y) / step + 1;
    const int cs_stage = kSplitRows * a.rotary_dim;
    const bool loader = threadIdx.x < (unsigned)c.tokens;
    auto first_token = [&](int64_t i) { return (y + i * step) * kSplitRows + c.token_offset; };
    for (int i = 0; i < S; i++)
        if (loader)
            persist_pos_slot(a, first_token(i), i < n, &pos[i * kSplitRows + threadIdx.x],
                             &slot[i * kSplitRows + threadIdx.x]);
    __syncthreads();
    for (int i = 0; i < S - 1; i++) {
        if (i < n)
            persist_issue<IN>(a, c, first_token(i), raw + i * kSplitRows * kThreads,
                              cos_sin + i * cs_stage, pos + i * kSplitRows, slot + i * kSplitRows);
        ap_cp_async_commit();
    }
    for (int64_t i = 0; i < n; i++) {
        const int cur = (int)(i % S), ring = (int)(i % R);
        const int64_t ahead = i + S - 1;
        if (ahead < n) {
            const int st = (int)(ahead % S), rg = (int)(ahead % R);
            persist_issue<IN>(a, c, first_token(ahead), raw + st * kSplitRows * kThreads,
                              cos_sin + st * cs_stage, pos + rg * kSplitRows,
                              slot + rg * kSplitRows);
        }
        ap_cp_async_commit();
        int32_t next_pos = 0, next_slot = -1;
        if (loader) persist_pos_slot(a, first_token(i + S), i + S < n, &next_pos, &next_slot);
        ap_cp_async_wait<S - 1>(); // item i's copies (this thread's)
        __syncthreads();           // and every thread's cos/sin rows
        persist_compute<IN, KV, kNeox>(a, c, first_token(i), raw + cur * kSplitRows * kThreads,
                                       cos_sin + cur * cs_stage, pos + ring * kSplitRows,
                                       slot + ring * kSplitRows);
        if (loader) {
            const int rg = (int)((i + S) % R); // item i - 1's, read before the last barrier
            pos[rg * kSplitRows + threadIdx.x] = next_pos;
            slot[rg * kSplitRows + threadIdx.x] = next_slot;
        }
        __syncthreads(); // the ring's new entry; item i's stage free for item i + S
    }
}

template <typename IN, bool kNeox>
__global__ void __launch_bounds__(kThreads, split_min_blocks<kNeox>())
    ap_append_rope_persist_kernel(const rope_args a, const split_geometry g) {
    extern __shared__ __align__(16) unsigned char persist_smem[];
    const bool q = (int)blockIdx.x < g.role[0].ctas;
    persist_cta c;
    c.role = q ? g.role[0] : g.role[1];
    const int k = q ? (int)blockIdx.x : (int)blockIdx.x - g.role[0].ctas;
    const int cta_token = c.role.chunks == 1 ? k : k / c.role.chunks;
    c.chunk = k - cta_token * c.role.chunks;
    c.tokens = kSplitRows >> c.role.pass_shift;
    c.token_offset = (int64_t)cta_token * c.tokens;
    c.rows_per_pass = kThreads >> a.lanes_shift;
    c.d0 = (int)(threadIdx.x & (a.lanes_per_row - 1)) * kVec;
    c.row_first = c.role.row_base + c.chunk * kSplitRows * c.rows_per_pass +
                  (int)(threadIdx.x >> a.lanes_shift);
    if (q)
        persist_walk<IN, void, kNeox>(a, c, persist_smem);
    else
        persist_walk<IN, ap_nvfp4, kNeox>(a, c, persist_smem);
}

#endif // AP_COMMON_APPEND_ROPE_PERSIST_CUH
