/* prefill_hopper_consume.cuh: the consumer warpgroups of the kit's Hopper prefill kernel, one work
 * tile (128 query rows of one head) at a time: S = Q K^T, online softmax and O += P V, plain
 * (consume) or pipelined with ping-pong (consume_pipe). `ring` is the CTA's count of K/V tiles
 * before this work tile (the ring runs on across a persistent CTA's tiles: K/V tile g sits in
 * stage g % kStg, phase (g / kStg) & 1) and qn its count of Q loads (q_full's phase). A part of
 * prefill_hopper.cuh, which includes it after the softmax and the epilogue; not a header of its
 * own. */
#ifndef AP_COMMON_PREFILL_HOPPER_CONSUME_CUH
#define AP_COMMON_PREFILL_HOPPER_CONSUME_CUH

#ifndef AP_COMMON_PREFILL_HOPPER_CUH
#error "prefill_hopper_consume.cuh is included by prefill_hopper.cuh only"
#endif

/* Whether key tile n needs the mask: it runs past kv_len, or (causal) past the diagonal of the
 * CTA's first row. */
template <int kKeys>
__device__ __forceinline__ bool pipe_needs_mask(const Params &p, const Shape &sh, int n) {
    const int diag_from = sh.kv_len - sh.q_len + sh.m0;
    return (n + 1) * kKeys > sh.kv_len || (p.causal && (n + 1) * kKeys - 1 > diag_from);
}

/* Ping-pong turns (named barrier 1 + wg): a warpgroup takes its turn before issuing its GEMMs
 * and gives it to the other once they are issued. */
template <bool kPingPong> __device__ __forceinline__ void turn_take(int wg) {
    if constexpr (kPingPong) {
        named_sync<256>(1 + wg);
    }
}
template <bool kPingPong> __device__ __forceinline__ void turn_give(int wg) {
    if constexpr (kPingPong) {
        named_arrive<256>(2 - wg);
    }
}

/* A tile's running state: O 0, row max -inf, row sum 0. */
template <int kN>
__device__ __forceinline__ void state_init(float (&o)[kN], float (&m)[2], float (&l)[2]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
        o[i] = 0.f;
    }
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
}

template <typename T, bool kSplitN, int kD>
__device__ __forceinline__ void consume(const Params &p, const Shape &sh, const uint8_t *sq,
                                        const uint8_t *sk, const uint8_t *sv, Bars *b, int h,
                                        int ring, int qn) {
    constexpr int kStg = Geo<kD>::kStg;
    const int wg = threadIdx.x / 128 - 1;
    const int lane = threadIdx.x % 32;
    const int r0 = sh.m0 + wg * 64 + (threadIdx.x % 128 / 32) * 16 + lane / 4;
    float o[Geo<kD>::kOn], m[2], l[2];
    state_init(o, m, l);
    if (sh.n_blocks > 0) {
        bar_wait(&b->q_full, qn & 1);
    }
    const uint8_t *q = sq + wg * 64 * 128;
    for (int i = 0; i < sh.n_blocks; ++i) {
        const int s = (ring + i) % kStg;
        const uint32_t ph = ((ring + i) / kStg) & 1;
        const int n = sh.n_blocks - 1 - i;
        float sc[Geo<kD>::kSn];
        bar_wait(&b->k_full[s], ph);
        wg_fence();
        qk_gemm<T, kD>(sc, q, sk + s * Geo<kD>::kKBytes);
        wg_commit();
        wg_wait0();
        release_stage(&b->k_empty[s]);
        if (i == sh.n_blocks - 1) {
            release_stage(&b->q_empty);
        }
        if (pipe_needs_mask<Geo<kD>::kKeys>(p, sh, n)) {
            mask_tile(sc, sh, p.causal, n, r0, lane);
        }
        uint32_t pf[Geo<kD>::kPk][4];
        softmax_tile<T>(sc, o, m, l, pf, p.scale_log2);
        bar_wait(&b->v_full[s], ph);
        wg_fence();
        pv_gemm<T, kSplitN>(o, pf, sv + s * Geo<kD>::kVBytes);
        wg_commit();
        wg_wait0();
        release_stage(&b->v_empty[s]);
    }
    epilogue<T>(p, sh, o, m, l, h, r0, lane);
}

/* The pipeline's first tile: S_0 = Q K_0 in this warpgroup's turn, masked, then softmax into the
 * running state and P_0 (pf). */
template <typename T, bool kPingPong, int kD>
__device__ __forceinline__ void
pipe_first_scores(const Params &p, const Shape &sh, const uint8_t *q, const uint8_t *sk, Bars *b,
                  int ring, int wg, int r0, int lane, float (&o)[Geo<kD>::kOn], float (&m)[2],
                  float (&l)[2], uint32_t (&pf)[Geo<kD>::kPk][4]) {
    constexpr int kStg = Geo<kD>::kStg;
    const int nb = sh.n_blocks;
    const int s = ring % kStg;
    float sc[Geo<kD>::kSn];
    bar_wait(&b->k_full[s], (ring / kStg) & 1);
    turn_take<kPingPong>(wg);
    wg_fence();
    qk_gemm<T, kD>(sc, q, sk + s * Geo<kD>::kKBytes);
    wg_commit();
    turn_give<kPingPong>(wg);
    wg_wait0();
    release_stage(&b->k_empty[s]);
    if (nb == 1) {
        release_stage(&b->q_empty);
    }
    if (pipe_needs_mask<Geo<kD>::kKeys>(p, sh, nb - 1)) {
        mask_tile(sc, sh, p.causal, nb - 1, r0, lane);
    }
    softmax_tile<T>(sc, o, m, l, pf, p.scale_log2);
}

/* Step i of the pipeline: S_i = Q K_i and O += P_(i-1) V_(i-1) issued back to back in this
 * warpgroup's turn; the statistics of S_i while P V runs; then stage i-1 is released and S_i
 * becomes P_i. The last step's S done, Q is released. */
template <typename T, bool kSplitN, bool kPingPong, int kD>
__device__ __forceinline__ void
pipe_step(const Params &p, const Shape &sh, const uint8_t *q, const uint8_t *sk, const uint8_t *sv,
          Bars *b, int ring, int i, int wg, int r0, int lane, float (&o)[Geo<kD>::kOn],
          float (&m)[2], float (&l)[2], uint32_t (&pf)[Geo<kD>::kPk][4]) {
    constexpr int kStg = Geo<kD>::kStg;
    const int g = ring + i;
    const int s = g % kStg;
    const int sp = (g - 1) % kStg;
    const int n = sh.n_blocks - 1 - i;
    float sc[Geo<kD>::kSn];
    bar_wait(&b->k_full[s], (g / kStg) & 1);
    bar_wait(&b->v_full[sp], ((g - 1) / kStg) & 1);
    turn_take<kPingPong>(wg);
    wg_fence();
    qk_gemm<T, kD>(sc, q, sk + s * Geo<kD>::kKBytes);
    wg_commit();
    pv_gemm<T, kSplitN>(o, pf, sv + sp * Geo<kD>::kVBytes);
    wg_commit();
    turn_give<kPingPong>(wg);
    wg_wait1();
    release_stage(&b->k_empty[s]);
    if (i == sh.n_blocks - 1) {
        release_stage(&b->q_empty);
    }
    if (pipe_needs_mask<Geo<kD>::kKeys>(p, sh, n)) {
        mask_tile(sc, sh, p.causal, n, r0, lane);
    }
    float corr[2];
    const bool move = softmax_stats(sc, m, l, corr, p.scale_log2);
    wg_wait0();
    release_stage(&b->v_empty[sp]);
    rescale_pack<T>(sc, o, corr, move, pf);
}

/* The pipeline's last GEMM: O += P_(nb-1) V_(nb-1); then the turn goes to the other warpgroup
 * (warpgroup 1's hand-over is taken by warpgroup 0's next tile, or its final wait). */
template <typename T, bool kSplitN, bool kPingPong, int kD>
__device__ __forceinline__ void pipe_last_pv(const uint8_t *sv, Bars *b, int ring, int nb, int wg,
                                             float (&o)[Geo<kD>::kOn],
                                             const uint32_t (&pf)[Geo<kD>::kPk][4]) {
    constexpr int kStg = Geo<kD>::kStg;
    const int g = ring + nb - 1;
    const int sp = g % kStg;
    bar_wait(&b->v_full[sp], (g / kStg) & 1);
    turn_take<kPingPong>(wg);
    wg_fence();
    pv_gemm<T, kSplitN>(o, pf, sv + sp * Geo<kD>::kVBytes);
    wg_commit();
    turn_give<kPingPong>(wg);
    wg_wait0();
    release_stage(&b->v_empty[sp]);
}

/* The pipelined consumer over one work tile: in its turn (named barriers 1 + wg, ping-pong
 * between the two warpgroups) a warpgroup issues S_i = Q K_i and O += P_(i-1) V_(i-1) back to
 * back, hands the tensor cores to the other warpgroup, then runs softmax i while the other one's
 * GEMMs run. The turns run on across tiles (consumer_loop starts and ends them). */
template <typename T, bool kSplitN, bool kPingPong, int kD>
__device__ __forceinline__ void consume_pipe(const Params &p, const Shape &sh, const uint8_t *sq,
                                             const uint8_t *sk, const uint8_t *sv, Bars *b, int h,
                                             int ring, int qn) {
    const int wg = threadIdx.x / 128 - 1;
    const int lane = threadIdx.x % 32;
    const int r0 = sh.m0 + wg * 64 + (threadIdx.x % 128 / 32) * 16 + lane / 4;
    float o[Geo<kD>::kOn], m[2], l[2];
    state_init(o, m, l);
    const int nb = sh.n_blocks;
    const uint8_t *q = sq + wg * 64 * 128;
    uint32_t pf[Geo<kD>::kPk][4];
    if (nb > 0) {
        bar_wait(&b->q_full, qn & 1);
        pipe_first_scores<T, kPingPong, kD>(p, sh, q, sk, b, ring, wg, r0, lane, o, m, l, pf);
    }
    for (int i = 1; i < nb; ++i) {
        pipe_step<T, kSplitN, kPingPong, kD>(p, sh, q, sk, sv, b, ring, i, wg, r0, lane, o, m, l,
                                             pf);
    }
    if (nb > 0) {
        pipe_last_pv<T, kSplitN, kPingPong, kD>(sv, b, ring, nb, wg, o, pf);
    }
    epilogue<T>(p, sh, o, m, l, h, r0, lane);
}

#endif /* AP_COMMON_PREFILL_HOPPER_CONSUME_CUH */
