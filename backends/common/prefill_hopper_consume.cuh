/* prefill_hopper_consume.cuh: the consumer warpgroups of the kit's Hopper prefill kernel, one work
 * tile (128 query rows of one head) at a time: S = Q K^T, online softmax and O += P V, plain
 * (consume) or pipelined with ping-pong (consume_pipe). `ring` is the CTA's count of K/V tiles
 * before this work tile (the ring runs on across a persistent CTA's tiles: K/V tile g sits in
 * K stage g % kStg, phase (g / kStg) & 1; its V in V stage g % kVStg, phase (g / kVStg) & 1) and
 * qn its count of Q loads (in Q buffer qn % kQBufs, phase (qn / kQBufs) & 1). A part of
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
/* kWGs consumer warpgroups take their turns in a ring: 0, 1, (2,) 0, ... The general form gives
 * two warpgroups the same barriers as 2 - wg but other code (a select), 128-512 bytes more in
 * every two-warpgroup kernel, so those keep 2 - wg. */
template <bool kPingPong, int kWGs = 2> __device__ __forceinline__ void turn_give(int wg) {
    if constexpr (kPingPong && kWGs == 2) {
        named_arrive<256>(2 - wg);
    } else if constexpr (kPingPong) {
        named_arrive<256>(wg == kWGs - 1 ? 1 : wg + 2);
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

template <typename T, bool kSplitN, int kD, int kSrc = kRagged>
__device__ __forceinline__ void consume(const Params &p, const Shape &sh, const uint8_t *sq,
                                        const uint8_t *sk, const uint8_t *sv, Bars *b, int h,
                                        int ring, int qn) {
    constexpr int kStg = Geo<kD, kSrc>::kStg, kVStg = Geo<kD, kSrc>::kVStg,
                  kQBufs = Geo<kD, kSrc>::kQBufs;
    const int wg = threadIdx.x / 128 - 1;
    const int lane = threadIdx.x % 32;
    const int rw = wg * 64 + (threadIdx.x % 128 / 32) * 16 + lane / 4; /* row in the tile */
    const int qb = qn % kQBufs;
    float o[Geo<kD, kSrc>::kOn], m[2], l[2];
    state_init(o, m, l);
    if (sh.n_blocks > 0) {
        bar_wait(&b->q_full[qb], (qn / kQBufs) & 1);
    }
    const uint8_t *q = sq + qb * Geo<kD, kSrc>::kQBytes + wg * 64 * 128;
    for (int i = 0; i < sh.n_blocks; ++i) {
        const int s = (ring + i) % kStg;
        const uint32_t ph = ((ring + i) / kStg) & 1;
        const int vs = (ring + i) % kVStg;
        const uint32_t vph = ((ring + i) / kVStg) & 1;
        const int n = sh.n_blocks - 1 - i;
        float sc[Geo<kD, kSrc>::kSn];
        bar_wait(&b->k_full[s], ph);
        wg_fence();
        qk_gemm<T, Geo<kD, kSrc>>(sc, q, sk + s * Geo<kD, kSrc>::kKBytes);
        wg_commit();
        wg_wait0();
        release_stage(&b->k_empty[s]);
        if (i == sh.n_blocks - 1) {
            release_stage(&b->q_empty[qb]);
        }
        if (pipe_needs_mask<Geo<kD, kSrc>::kKeys>(p, sh, n)) {
            mask_tile(sc, sh, p, n, rw, lane);
        }
        uint32_t pf[Geo<kD, kSrc>::kPk][4];
        const float sl2[2] = {p.scale_log2, p.scale_log2};
        softmax_tile<T>(sc, o, m, l, pf, sl2);
        bar_wait(&b->v_full[vs], vph);
        wg_fence();
        pv_gemm<T, kSplitN>(o, pf, sv + vs * Geo<kD, kSrc>::kVBytes);
        wg_commit();
        wg_wait0();
        release_stage(&b->v_empty[vs]);
    }
    const float ms[2] = {p.sm_scale, p.sm_scale};
    epilogue<T>(p, sh, o, m, l, h, rw, lane, ms, 1.f);
}

/* The Q operand of the pipelined consumers' S = Q K^T: here the 16-bit Q tile in shared memory,
 * this warpgroup's 64 rows (prefill_hopper_f8.cuh has the fp8 one). init() sets the softmax's
 * and the epilogue's scales (sl2 / ms / os: softmax_stats, epilogue); load() runs once per work
 * tile after q_full; qk() issues one S GEMM against a K stage. G: the ring's geometry; PT: the
 * type of P and V in P V. */
template <typename T, int kD, int kSrc = kRagged> struct QSmem {
    using G = Geo<kD, kSrc>;
    using PT = T;
    const uint8_t *q;
    float sl2[2], ms[2], os;
    __device__ __forceinline__ void init(const Params &p) {
        sl2[0] = sl2[1] = p.scale_log2;
        ms[0] = ms[1] = p.sm_scale;
        os = 1.f;
    }
    __device__ __forceinline__ void load(const Params &, const uint8_t *sq, int wg) {
        q = sq + wg * 64 * 128;
    }
    /* kHalf: the K tile's first 64 keys only (pipe_half), into the first half of s */
    template <bool kHalf = false>
    __device__ __forceinline__ void qk(float (&s)[G::kSn], const uint8_t *k) const {
        qk_gemm<T, G, kHalf>(s, q, k);
    }
};

/* Whether the first K/V tile of a work tile (its highest, n_blocks - 1: the producer loads them
 * from the diagonal down) holds no key past its first half that a row of the tile may see: from
 * kKeys / 2 on, all its keys lie past the causal bound of the tile's last token, or past kv_len.
 * The merged consumers (prefill_hopper_merge.cuh: 128-key tiles of 16-bit Q in shared memory)
 * then run its S and P V over those 64 keys only, half the tensor time: a packed tile of 32
 * tokens starting 0 or 32 tokens into a 128-key tile is one, as is a sequence's last tile where
 * it ends 1..64 keys into a K tile. The stages that take it are instances of their own (kHalf
 * template arguments), chosen by a branch around the whole stage: a branch between a stage's
 * wgmma instructions made ptxas serialize them all (C7515 / C7520; H100, 2026-11-27: every
 * shape 25% slower). Its end is item_shape's, computed again: one helper for both (the same
 * values) left the D128 kernel too few registers for the wgmma pipeline (ptxas C7511, every wgmma
 * serialized; caught by kit-wgmma-serial), and a field in Shape costs a register across the loop. */
template <int kKeys, int kTR = kRows>
__device__ __forceinline__ bool pipe_half(const Params &p, const Shape &sh) {
    int end = sh.kv_len;
    if (p.causal) {
        end = min(end, sh.kv_len - sh.q_len + sh.m0 + (kTR >> p.pack_shift));
    }
    return kKeys == 128 && end - (sh.n_blocks - 1) * kKeys <= kKeys / 2;
}

/* kHalf: the S of a half K tile (pipe_half) has its scores past the first 64 keys at -inf. */
template <bool kHalf, int kSn> __device__ __forceinline__ void half_mask(float (&s)[kSn]) {
    if constexpr (kHalf) {
#pragma unroll
        for (int i = 32; i < kSn; ++i) {
            s[i] = -INFINITY;
        }
    }
}

/* The pipeline's first tile: S_0 = Q K_0 in this warpgroup's turn, masked, then softmax into the
 * running state and P_0 (pf). kHalf: K_0 is a half tile (pipe_half). */
template <bool kPingPong, bool kHalf = false, class Q, class G = typename Q::G>
__device__ __forceinline__ void
pipe_first_scores(const Params &p, const Shape &sh, const Q &q, const uint8_t *sk, Bars *b,
                  int ring, int qb, int wg, int rw, int lane, float (&o)[G::kOn], float (&m)[2],
                  float (&l)[2], uint32_t (&pf)[G::kPk][4]) {
    constexpr int kStg = G::kStg;
    const int nb = sh.n_blocks;
    const int s = ring % kStg;
    float sc[G::kSn];
    bar_wait(&b->k_full[s], (ring / kStg) & 1);
    turn_take<kPingPong>(wg);
    wg_fence();
    if constexpr (kHalf) {
        q.template qk<true>(sc, sk + s * G::kKBytes);
    } else {
        q.qk(sc, sk + s * G::kKBytes);
    }
    wg_commit();
    turn_give<kPingPong, G::kWGs>(wg);
    wg_wait0();
    half_mask<kHalf>(sc);
    release_stage(&b->k_empty[s]);
    if (nb == 1) {
        release_stage(&b->q_empty[qb]);
    }
    if (pipe_needs_mask<G::kKeys>(p, sh, nb - 1)) {
        mask_tile(sc, sh, p, nb - 1, rw, lane);
    }
    softmax_tile<typename Q::PT>(sc, o, m, l, pf, q.sl2);
}

/* Step i of the pipeline: S_i = Q K_i and O += P_(i-1) V_(i-1) issued back to back in this
 * warpgroup's turn; the statistics of S_i while P V runs; then stage i-1 is released and S_i
 * becomes P_i. The last step's S done, Q is released. kPvHalf: P_(i-1) is a half tile's
 * (pipe_half: i is 1), whose P V takes the first half of the k-steps. */
template <bool kSplitN, bool kPingPong, bool kPvHalf = false, class Q, class G = typename Q::G>
__device__ __forceinline__ void
pipe_step(const Params &p, const Shape &sh, const Q &q, const uint8_t *sk, const uint8_t *sv,
          Bars *b, int ring, int qb, int i, int wg, int rw, int lane, float (&o)[G::kOn],
          float (&m)[2], float (&l)[2], uint32_t (&pf)[G::kPk][4]) {
    constexpr int kStg = G::kStg, kVStg = G::kVStg;
    const int g = ring + i;
    const int s = g % kStg;
    const int sp = (g - 1) % kVStg;
    const int n = sh.n_blocks - 1 - i;
    float sc[G::kSn];
    bar_wait(&b->k_full[s], (g / kStg) & 1);
    bar_wait(&b->v_full[sp], ((g - 1) / kVStg) & 1);
    turn_take<kPingPong>(wg);
    wg_fence();
    q.qk(sc, sk + s * G::kKBytes);
    wg_commit();
    pv_gemm<typename Q::PT, kSplitN, G::kOn, G::kPk, kPvHalf>(o, pf, sv + sp * G::kVBytes);
    wg_commit();
    turn_give<kPingPong, G::kWGs>(wg);
    wg_wait1();
    release_stage(&b->k_empty[s]);
    if (i == sh.n_blocks - 1) {
        release_stage(&b->q_empty[qb]);
    }
    if (pipe_needs_mask<G::kKeys>(p, sh, n)) {
        mask_tile(sc, sh, p, n, rw, lane);
    }
    float corr[2];
    const bool move = softmax_stats(sc, m, l, corr, q.sl2);
    wg_wait0();
    release_stage(&b->v_empty[sp]);
    rescale_pack<typename Q::PT>(sc, o, corr, move, pf);
}

/* The pipeline's last GEMM: O += P_(nb-1) V_(nb-1) (kPvHalf: of a half tile); then the turn goes
 * to the other warpgroup (warpgroup 1's hand-over is taken by warpgroup 0's next tile, or its
 * final wait). */
template <typename PT, bool kSplitN, bool kPingPong, class G, bool kPvHalf = false>
__device__ __forceinline__ void pipe_last_pv(const uint8_t *sv, Bars *b, int ring, int nb, int wg,
                                             float (&o)[G::kOn], const uint32_t (&pf)[G::kPk][4]) {
    constexpr int kVStg = G::kVStg;
    const int g = ring + nb - 1;
    const int sp = g % kVStg;
    bar_wait(&b->v_full[sp], (g / kVStg) & 1);
    turn_take<kPingPong>(wg);
    wg_fence();
    pv_gemm<PT, kSplitN, G::kOn, G::kPk, kPvHalf>(o, pf, sv + sp * G::kVBytes);
    wg_commit();
    turn_give<kPingPong, G::kWGs>(wg);
    wg_wait0();
    release_stage(&b->v_empty[sp]);
}

/* The pipelined consumer over one work tile: in its turn (named barriers 1 + wg, ping-pong
 * between the two warpgroups) a warpgroup issues S_i = Q K_i and O += P_(i-1) V_(i-1) back to
 * back, hands the tensor cores to the other warpgroup, then runs softmax i while the other one's
 * GEMMs run. The turns run on across tiles (consumer_loop starts and ends them). Q: the Q
 * operand (QSmem, or the fp8 one of prefill_hopper_f8.cuh) and with it the ring's geometry. */
template <typename T, bool kSplitN, bool kPingPong, class Q>
__device__ __forceinline__ void consume_pipe(const Params &p, const Shape &sh, const uint8_t *sq,
                                             const uint8_t *sk, const uint8_t *sv, Bars *b, int h,
                                             int ring, int qn) {
    using G = typename Q::G;
    const int wg = threadIdx.x / 128 - 1;
    const int lane = threadIdx.x % 32;
    const int rw = wg * 64 + (threadIdx.x % 128 / 32) * 16 + lane / 4; /* row in the tile */
    float o[G::kOn], m[2], l[2];
    state_init(o, m, l);
    const int nb = sh.n_blocks;
    Q q;
    q.init(p);
    uint32_t pf[G::kPk][4];
    const int qb = qn % G::kQBufs;
    if (nb > 0) {
        bar_wait(&b->q_full[qb], (qn / G::kQBufs) & 1);
        q.load(p, sq + qb * G::kQBytes, wg);
        pipe_first_scores<kPingPong>(p, sh, q, sk, b, ring, qb, wg, rw, lane, o, m, l, pf);
    }
    for (int i = 1; i < nb; ++i) {
        pipe_step<kSplitN, kPingPong>(p, sh, q, sk, sv, b, ring, qb, i, wg, rw, lane, o, m, l, pf);
    }
    if (nb > 0) {
        pipe_last_pv<typename Q::PT, kSplitN, kPingPong, G>(sv, b, ring, nb, wg, o, pf);
    }
    epilogue<T>(p, sh, o, m, l, h, rw, lane, q.ms, q.os);
}

#endif /* AP_COMMON_PREFILL_HOPPER_CONSUME_CUH */
