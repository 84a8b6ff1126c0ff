// append_rope_split.cuh: the kit append's split kernel (append_rope.cu, nvfp4 caches), included
// there inside its anonymous namespace after rope_args, the row helpers and kv_write8 (it needs
// them). Kept apart so that each file stays readable.
#ifndef AP_COMMON_APPEND_ROPE_SPLIT_CUH
#define AP_COMMON_APPEND_ROPE_SPLIT_CUH

// The split kernel (nvfp4 caches): a token's q rows and its K/V rows in different CTAs, each
// thread with kSplitRows rows in flight in both. The rows kernel's CTA carries a token's
// 48 rows (32/8 heads, D128) as 3 per thread, and the quantize raised it to 68 registers: 3 CTAs
// of 256 threads per SM, 37 KB of loads in flight where the 16-bit caches have 4 CTAs and 49 KB,
// and its rate fell with that count (1962 / 2582 GB/s ~ 37 / 49). Round 1: 4 rows a thread in
// registers, at most 64: 4 CTAs, 64 KB (2181 GB/s); each CTA's life is two dependent loads long
// (position, then its cos/sin row) and its 4 rows were in flight only during the first. Round 2
// (this form): 8 rows a thread, copied to shared memory by cp.async: no register holds them, so
// the kernel fits 48 registers (5 CTAs; neox: 64, 4 CTAs) and an SM has 5 (4) x 256 x 8 x 16 B =
// 160 (128) KB of loads in flight at their issue. (APPEND_NOTES.md has every round.)
//
// A role (q: the num_qo_heads rows from 0; K/V: the 2 * num_kv_heads rows after them, k heads
// then v heads) spans passes_per_token passes of rows_per_pass rows. When that is 1, 2, 4
// ... kSplitRows (pass_shift 0 .. log2 kSplitRows), a CTA takes kSplitRows >> pass_shift whole
// tokens, one pass at a time; past kSplitRows, one token's chunk of kSplitRows passes (chunks per
// token). blockIdx.y is a group of kSplitRows tokens; in it the q CTAs come first, then the K/V CTAs, so both kinds are
// dispatched side by side and the quantize of one overlaps the streaming of the other. Position,
// slot and cos/sin rows of the CTA's tokens are staged in shared memory (registers are what
// bound the rows in flight).
struct split_role {
    int row_base, row_end; // the role's rows among the token's
    int pass_shift;        // log2(passes per token) when a CTA takes whole tokens
    int chunks;            // CTAs per token (then kRows passes each), or 1
    int ctas;              // CTAs per group of kRows tokens
};

struct split_geometry {
    split_role role[2]; // q, K/V
};

constexpr int kSplitRows = 8; // rows a thread, tokens a group
// CTAs per SM: 5 (48 registers) for interleaved pairs, 4 for neox (its partner's 8 values by
// shuffle: at 48 registers ptxas spills)
template <bool kNeox> constexpr int split_min_blocks() {
    return kNeox ? 4 : 5;
}
constexpr int kSplitMaxRotary = 256; // head_dim <= 32 lanes x 8

// A split CTA's tokens in shared memory: every thread's kSplitRows 16-byte pieces of input
// ([row][thread]: a warp's 16-byte accesses are consecutive, no bank conflict), and position,
// slot and the cos/sin row at the position of each token. 32 KB + 8 KB; 5 CTAs: 205 KB.
struct split_stage {
    uint4 raw[kSplitRows][kThreads];
    float4 cos_sin[kSplitRows][kSplitMaxRotary / 4];
    int32_t pos[kSplitRows], slot[kSplitRows];
};

// The rows of one role's CTA: tokens token_first + (j >> pass_shift) for passes j, rows
// row_base + chunk * kSplitRows passes + (j & (passes per token - 1)) * rows_per_pass + lane
// group. The rows go to shared memory by cp.async, so the registers bound neither the bytes in
// flight nor, across the two barriers and the cos/sin load behind the position, the CTAs per SM;
// each thread reads back only what it copied (cp.async.wait_group, no barrier needed), read before
// q_out's write.
// kShift >= 0: role.pass_shift known at compile time (0: the K/V role of 32/8 heads at D128
// takes a token's rows in one pass). A thread's row is then the same for all its tokens, which
// the compiler sees, so the row's kind, head, offsets and branches leave the loop over the tokens
// (the K/V rows' loop 423 -> 326 SASS a row of 8 values with the branch-free quantizer; unrolling
// the q role's two passes by 2 saved 4% of its rows' loop and spilled: not taken).
template <typename IN, typename KV, bool kNeox, int kShift = -1>
__device__ __forceinline__ void split_rows(const rope_args &a, const split_role &role,
                                           int64_t token_first, int chunk, split_stage &st) {
    constexpr int kRows = kSplitRows;
    const int lane = threadIdx.x & (a.lanes_per_row - 1);
    const int d0 = lane * kVec;
    const int rows_per_pass = kThreads >> a.lanes_shift;
    const int group = (int)(threadIdx.x >> a.lanes_shift);
    const int shift = kShift >= 0 ? kShift : role.pass_shift;
    const int tokens = kRows >> shift;
    const int pass_mask = (1 << shift) - 1;
    const int row_first = role.row_base + chunk * kRows * rows_per_pass + group;
#pragma unroll
    for (int j = 0; j < kRows; j++) {
        const int64_t token = token_first + (j >> shift);
        const int r = row_first + (j & pass_mask) * rows_per_pass;
        const bool live = token < a.num_tokens && r < role.row_end;
        // a dead row reads nothing and holds zeros (its address stays the CTA's first row's)
        const row_of w = row_kind(a, live ? r : role.row_base);
        const uint8_t *src = w.kind == 0 ? a.q : a.src[w.kind - 1];
        const uint8_t *p = src + row_src_offset(a, w, live ? token : token_first, d0, sizeof(IN));
        ap_cp_async_16((uint32_t)__cvta_generic_to_shared(&st.raw[j][threadIdx.x]), p, live);
    }
    ap_cp_async_commit();
    // A token that is not written (past the batch, or token_valid false) gets slot -1 here, once,
    // so that each row tests one sign (token_valid per row was ~14 instructions of it).
    if (threadIdx.x < (unsigned)tokens) {
        const int64_t token = token_first + threadIdx.x;
        const bool live = token < a.num_tokens;
        const int32_t pos =
            live && a.rotary_dim > 0 ? __ldg(a.positions + token * a.positions_stride) : 0;
        const int32_t slot = live ? __ldg(a.out_loc + token * a.out_loc_stride) : -1;
        st.pos[threadIdx.x] = pos;
        st.slot[threadIdx.x] = token_valid(a, pos, slot) ? slot : -1;
    }
    __syncthreads();
    if (a.rotary_dim > 0) {
        const int n4 = a.rotary_dim / 4;
        for (int i = (int)threadIdx.x; i < tokens * n4; i += kThreads) {
            const int t = i / n4, e = i - t * n4;
            const float *row = a.cos_sin + (int64_t)st.pos[t] * a.rotary_dim;
            if (st.slot[t] >= 0)
                st.cos_sin[t][e] = __ldg(reinterpret_cast<const float4 *>(row) + e);
        }
        __syncthreads();
    }
    ap_cp_async_wait<0>();
    const int half = a.rotary_dim / 2;
    const bool rotates = d0 < a.rotary_dim;
    const bool first = kNeox ? d0 < half : true;
    const int half_lanes = half / kVec;
    const int partner_lane =
        !kNeox || !rotates ? lane : (first ? lane + half_lanes : lane - half_lanes);
    // rows one at a time (unrolled, ptxas hoists the next rows' loads and spills at 48)
#pragma unroll 1
    for (int j = 0; j < kRows; j++) {
        const int t = j >> shift;
        // the same for the whole CTA, so skipping never splits a shuffle; slot -1 past the end
        if (st.slot[t] < 0) continue;
        float c[kVec], s[kVec];
        if (rotates)
            rope_cos_sin_row<kNeox>(
                reinterpret_cast<const float *>(st.cos_sin[t]), half, d0, first, c, s,
                [](const float *p) { return *reinterpret_cast<const float4 *>(p); });
        const uint4 v = st.raw[j][threadIdx.x];
        rows_piece<IN, KV, kNeox>(a, token_first + t, st.slot[t],
                                  row_first + (j & pass_mask) * rows_per_pass, role.row_end, d0, v,
                                  partner_lane, rotates, first, c, s);
    }
}

template <typename IN, bool kNeox>
__global__ void __launch_bounds__(kThreads, split_min_blocks<kNeox>())
    ap_append_rope_split_kernel(const rope_args a, const split_geometry g) {
    const int64_t group_first = (int64_t)blockIdx.y * kSplitRows;
    const bool q = (int)blockIdx.x < g.role[0].ctas;
    const split_role role = q ? g.role[0] : g.role[1];
    const int k = q ? (int)blockIdx.x : (int)blockIdx.x - g.role[0].ctas;
    const int cta_token = role.chunks == 1 ? k : k / role.chunks;
    const int chunk = k - cta_token * role.chunks;
    const int64_t token_first = group_first + (int64_t)cta_token * (kSplitRows >> role.pass_shift);
    if (token_first >= a.num_tokens) return; // the whole CTA
    __shared__ split_stage stage;
    if (q)
        split_rows<IN, void, kNeox>(a, role, token_first, chunk, stage);
    else if (role.pass_shift == 0)
        split_rows<IN, ap_nvfp4, kNeox, 0>(a, role, token_first, chunk, stage);
    else
        split_rows<IN, ap_nvfp4, kNeox>(a, role, token_first, chunk, stage);
}

#endif // AP_COMMON_APPEND_ROPE_SPLIT_CUH
