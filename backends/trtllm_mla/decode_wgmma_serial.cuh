// decode_wgmma_serial.cuh: decode_wgmma.cu's schedule before the seesaw (MLA_WG_SEESAW 0), kept
// to measure the two in one build each: per tile, consumer warpgroup c computes S for keys
// 32c..32c+31 (wgmma m64n32, 36 k-steps), the two exchange their row maxima through shared memory
// (a 256-thread barrier), each writes its half of P, and after a second barrier each accumulates
// O[:, 256c..] += P V over all 64 keys. Included by decode_wgmma.cu only, inside its anonymous
// namespace (it uses that file's constants, Pos, State, pv and zero_v_tail).
#ifndef AP_TRTLLM_MLA_DECODE_WGMMA_SERIAL_CUH
#define AP_TRTLLM_MLA_DECODE_WGMMA_SERIAL_CUH

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
    // both S done (so both P V of the last tile too): maxima, P, V rows free
    named_sync_split<256>(1);
    float m_use[2], alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float t = fmaxf(red_max[r0 + 8 * h], red_max[64 + r0 + 8 * h]);
        const float m_new = fmaxf(st.m_run[h], t * scale2);
        m_use[h] = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = ex2(st.m_run[h] - m_use[h]);
        st.m_run[h] = m_new;
    }
    const int valid = sq.kv_len - tile * MLA_TILE;
    if (valid < MLA_TILE) zero_v_tail(k, valid, ps.c, ps.w * 32 + ps.g * 4 + ps.t4);
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float a = ex2(s[4 * j + 2 * h] * scale2 - m_use[h]);
            const float b2 = ex2(s[4 * j + 2 * h + 1] * scale2 - m_use[h]);
            rs[h] += a + b2;
            store_p2(pm, r0 + 8 * h, ps.c * 32 + j * 8 + 2 * ps.t4, a, b2);
        }
#pragma unroll
    for (int h = 0; h < 2; h++) st.l_run[h] = st.l_run[h] * alpha[h] + rs[h];
#pragma unroll
    for (int i = 0; i < 128; i++) st.o[i] *= alpha[(i >> 1) & 1];
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_sync_split<256>(1); // P and the zeroed rows visible to both warpgroups' wgmma
}

// The consumers' main loop, one tile at a time through the 2-stage ring.
__device__ __forceinline__ void serial_loop(State &st, const Pos &ps, const Seq &sq, uint8_t *base,
                                            Bars *b, const int (&limit)[2], float scale2,
                                            float *red, int t_begin, int t_end) {
    uint8_t *pm = base + kOffP;
    for (int tile = t_begin; tile < t_end; tile++) {
        const int i = tile - t_begin, stg = i & 1;
        uint8_t *k = base + kOffK + stg * kTileBytes;
        wait_blocks(b->full[stg], (i >> 1) & 1, 0, 8, true);
        float s[16];
        qk(s, base, k, ps.c);
        softmax(s, st, ps, sq, tile, limit, scale2, red, pm, k);
        pv(st.o, pm, k, ps.c);
        // warpgroup 1 read blocks 0..3 only in S, done before softmax's barrier
        if (ps.c == 0) release_stage(&b->empty_l[stg]);
        release_stage(&b->empty[stg]);
    }
}

#endif // AP_TRTLLM_MLA_DECODE_WGMMA_SERIAL_CUH
