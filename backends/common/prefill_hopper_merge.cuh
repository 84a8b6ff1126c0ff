/* prefill_hopper_merge.cuh: the pipelined consumers of the kit's Hopper prefill kernel over a
 * persistent CTA's work tiles with the tile boundary merged (AP_HOPPER_QBUF 2): tile r's last
 * O += P V and tile r + 1's first S = Q K issued in one turn, then r + 1's softmax and r's
 * epilogue while the other warpgroup's GEMMs run. A part of prefill_hopper.cuh, which includes it
 * after tile_at; not a header of its own. */
#ifndef AP_COMMON_PREFILL_HOPPER_MERGE_CUH
#define AP_COMMON_PREFILL_HOPPER_MERGE_CUH

#ifndef AP_COMMON_PREFILL_HOPPER_CUH
#error "prefill_hopper_merge.cuh is included by prefill_hopper.cuh only"
#endif

/* Without the merge a work tile's first turn issues S_0 alone and its softmax has no P V to hide
 * under, and its last turn's P V is followed by the epilogue with only the other warpgroup's last
 * P V in flight: two half-empty turns per tile. Merged, the boundary is one full turn.
 * The boundary of tile r (shape sh, nb K/V tiles from ring position ring, head h) and tile r + 1
 * (sh2, nb2 > 0, ring position ring + nb, Q load qn + 1): issues S_0 of r + 1 and r's last P V,
 * releases the K stage (and r + 1's Q when nb2 is 1), runs r + 1's first softmax statistics, then
 * (P V done) releases r's last V stage and writes r's O and LSE; o, m, l, pf leave holding r + 1's
 * state after its first tile, as pipe_first_scores leaves them. The barrier waits are those of
 * pipe_last_pv and pipe_first_scores, in one turn: the producer issued r + 1's Q and first K
 * without waiting for anything this turn releases (its Q buffer was freed by tile r - 1, its K
 * stage by r's step nb - kStg + 1), so both can be waited for before the turn. kPvHalf: r's last
 * P V is of a half K tile (pipe_half; r has one K/V tile); kHalf: r + 1's first K tile is one. */
template <typename T, bool kSplitN, bool kPingPong, bool kPvHalf, bool kHalf, class Q,
          class G = typename Q::G>
__device__ __forceinline__ void
pipe_boundary(const Params &p, const Shape &sh, const Shape &sh2, Q &q, const uint8_t *sq,
              const uint8_t *sk, const uint8_t *sv, Bars *b, int ring, int qn, int h, int wg,
              int rw, int lane, float (&o)[G::kOn], float (&m)[2], float (&l)[2],
              uint32_t (&pf)[G::kPk][4]) {
    constexpr int kStg = G::kStg, kVStg = G::kVStg, kQBufs = G::kQBufs;
    const int nb = sh.n_blocks, nb2 = sh2.n_blocks;
    const int g = ring + nb - 1; /* r's last K/V tile: its V */
    const int sp = g % kVStg;
    const int g2 = ring + nb; /* r + 1's first K/V tile: its K */
    const int s2 = g2 % kStg;
    const int qn2 = qn + 1;
    const int qb2 = qn2 % kQBufs;
    float sc[G::kSn];
    bar_wait(&b->q_full[qb2], (qn2 / kQBufs) & 1);
    q.load(p, sq + qb2 * G::kQBytes, wg);
    bar_wait(&b->k_full[s2], (g2 / kStg) & 1);
    bar_wait(&b->v_full[sp], (g / kVStg) & 1);
    turn_take<kPingPong>(wg);
    wg_fence();
    if constexpr (kHalf) {
        q.template qk<true>(sc, sk + s2 * G::kKBytes);
    } else {
        q.qk(sc, sk + s2 * G::kKBytes);
    }
    wg_commit();
    pv_gemm<typename Q::PT, kSplitN, G::kOn, G::kPk, kPvHalf>(o, pf, sv + sp * G::kVBytes);
    wg_commit();
    turn_give<kPingPong, G::kWGs>(wg);
    wg_wait1();
    half_mask<kHalf>(sc);
    release_stage(&b->k_empty[s2]);
    if (nb2 == 1) {
        release_stage(&b->q_empty[qb2]);
    }
    if (pipe_needs_mask<G::kKeys>(p, sh2, nb2 - 1)) {
        mask_tile(sc, sh2, p, nb2 - 1, rw, lane);
    }
    float m2[2] = {-INFINITY, -INFINITY}, l2[2] = {0.f, 0.f}, corr[2];
    softmax_stats(sc, m2, l2, corr, q.sl2);
    wg_wait0();
    release_stage(&b->v_empty[sp]);
    epilogue<T>(p, sh, o, m, l, h, rw, lane, q.ms, q.os);
#pragma unroll
    for (int i = 0; i < G::kOn; ++i) {
        o[i] = 0.f;
    }
    m[0] = m2[0];
    m[1] = m2[1];
    l[0] = l2[0];
    l[1] = l2[1];
    rescale_pack<typename Q::PT>(sc, o, corr, false, pf); /* O is 0: nothing to rescale */
}

/* AP_HOPPER_HALF 1 (the default): the merged consumers at head dim 128 run half K tiles
 * (pipe_half) as such; 0: never. H100, 2026-11-27 (call 52), --time, two invocations x two
 * rounds, TFLOP/s, off / on: the varlen mix packed 465-489 / 483-499, every other shape within
 * the noise; at head dim 64 the doubled stage code cost 1-4% (causal B4 S4096 361 / 356 and 362 /
 * 348), so it stays off there. A variant without the half P V in the boundary (fewer instances)
 * lost D64 12% and gained nothing more. */
#ifndef AP_HOPPER_HALF
#define AP_HOPPER_HALF 1
#endif

/* pipe_boundary's instance for (pv_half, half): r's last P V of a half K tile, r + 1's first K
 * tile a half one. */
template <typename T, bool kPingPong, class Q, class G = typename Q::G>
__device__ __forceinline__ void
pipe_boundary_any(bool pv_half, bool half, const Params &p, const Shape &sh, const Shape &sh2, Q &q,
                  const uint8_t *sq, const uint8_t *sk, const uint8_t *sv, Bars *b, int ring,
                  int qn, int h, int wg, int rw, int lane, float (&o)[G::kOn], float (&m)[2],
                  float (&l)[2], uint32_t (&pf)[G::kPk][4]) {
    if (pv_half) {
        if (half) {
            pipe_boundary<T, false, kPingPong, true, true>(p, sh, sh2, q, sq, sk, sv, b, ring, qn,
                                                           h, wg, rw, lane, o, m, l, pf);
        } else {
            pipe_boundary<T, false, kPingPong, true, false>(p, sh, sh2, q, sq, sk, sv, b, ring, qn,
                                                            h, wg, rw, lane, o, m, l, pf);
        }
    } else if (half) {
        pipe_boundary<T, false, kPingPong, false, true>(p, sh, sh2, q, sq, sk, sv, b, ring, qn, h,
                                                        wg, rw, lane, o, m, l, pf);
    } else {
        pipe_boundary<T, false, kPingPong, false, false>(p, sh, sh2, q, sq, sk, sv, b, ring, qn, h,
                                                         wg, rw, lane, o, m, l, pf);
    }
}

/* Q load qn_next's TileDesc, once its q_full completed. */
__device__ __forceinline__ TileDesc next_desc(Bars *b, int qn_next) {
    const int qb = qn_next % 2;
    bar_wait(&b->q_full[qb], (qn_next / 2) & 1);
    return desc_load(&b->desc[qb]);
}

/* The CTA's work tile after round r (tile_at from r + 1: r2, h2) and its shape; false past the
 * last. qn_next: the Q load of the next tile with K/V tiles, whose TileDesc the producer published
 * with that Q (or the end) on its q_full: that tile's round and shape come from there, and only a
 * tile without K/V tiles in between (or after the last) is found by tile_at and item_shape. Found
 * by the plan item and then its indptrs, two dependent loads, the boundary waited on their latency
 * (ncu, H100, 2026-11-27, the varlen mix: ~2% of all stall samples); the handoff gained 4-6% there
 * (docs/ARCHITECTURE.md). The q_full wait is the one pipe_boundary makes: that Q load was issued
 * kQLead K/V tiles before this tile's last (or the producer is past its last).
 * AP_HOPPER_TILEDESC 0: the tile and its shape from tile_at and item_shape alone (no TileDesc;
 * d.r = -1 matches no round). The dynamic schedule (Params.queue_items, claim_load): the
 * producer's rounds are its count of loaded tiles, so every tile's TileDesc is round r + 1, and
 * at the end's marker tile_at finds no tile (num_items is 0 there). */
template <int kPaged, int kKeys, int kTR = kRows>
__device__ __forceinline__ bool next_tile(const Params &p, Bars *b, int r, int qn_next, int &r2,
                                          int &h2, Shape &sh2) {
    const TileDesc d = kTileDesc ? next_desc(b, qn_next) : TileDesc{-1, 0, {}};
    if (kTileDesc && d.r == r + 1) {
        r2 = d.r;
        h2 = d.h;
        sh2 = d.sh;
        return true;
    }
    r2 = r + 1;
    int item2 = 0;
    if (!tile_at(p, r2, item2, h2)) {
        return false;
    }
    if (r2 == d.r) {
        sh2 = d.sh;
    } else if (kTileDesc) {
        /* a tile the producer passed over: it has no K/V tile (a split of it past its keys, or
         * none at all), so its shape needs no split */
        sh2 = item_shape<kPaged, kKeys, kTR, false>(p, item2, h2);
        sh2.n_blocks = min(sh2.n_blocks, 0);
    } else {
        sh2 = item_shape<kPaged, kKeys, kTR>(p, item2, h2);
    }
    return true;
}

/* The consumer warpgroups over the CTA's work tiles (consumer_loop's kMode 1 / 2 with
 * AP_HOPPER_QBUF 2): as consume_pipe per tile, except that a tile followed by one with K/V tiles
 * ends in pipe_boundary, which also starts the next one (`primed`). Both warpgroups take the same
 * tiles and merge the same boundaries (from the same plan items), so the ping-pong turns stay
 * matched: a tile of nb K/V tiles takes nb turns, plus one for the last tile's P V. */
template <typename T, bool kPingPong, int kPaged, class Q, class G = typename Q::G>
__device__ __forceinline__ void consumer_loop_merged(const uint8_t *sq, const uint8_t *sk,
                                                     const uint8_t *sv, Bars *b, const Params &p) {
    const int wg = threadIdx.x / 128 - 1;
    const int lane = threadIdx.x % 32;
    const int rw = wg * 64 + (threadIdx.x % 128 / 32) * 16 + lane / 4; /* row in the tile */
    float o[G::kOn], m[2], l[2];
    uint32_t pf[G::kPk][4];
    Q q;
    q.init(p);
    static_assert(G::kQBufs == 2, "the producer's TileDesc: two Q buffers");
    int ring = 0, qn = 0, h = 0, r = 0;
    bool primed = false; /* this tile's first S and softmax ran in the previous one's boundary */
    bool half = false;   /* this tile's first K tile is a half one (pipe_half) */
    /* the ping-pong consumers of the default build only: the overlapped ones and the 2-stage or
     * non-persistent builds ran out of registers for the half stages (ptxas C7511 serialized
     * every wgmma of the kernel) */
    constexpr bool kHalfOn = AP_HOPPER_HALF != 0 && kPaged == kRagged && G::kDv == 128 &&
                             G::kKeys == 128 && kPingPong && kPersistent && kStages >= 3;
    /* Each tile's place and shape are found once: the lookahead that decides the boundary hands
     * them to the next iteration (found twice, the integer division and the dependent loads of
     * tile_at and item_shape were a sixth of the consumers' per-tile samples on the varlen mix:
     * ncu, H100, 2026-11-27); next_tile reads them from the producer's TileDesc. */
    Shape sh = {};
    bool have = next_tile<kPaged, G::kKeys, G::kTileRows>(p, b, -1, 0, r, h, sh);
    while (have) {
        const int nb = sh.n_blocks; /* < 0: not a tile start, another tile covers these tokens */
        if (!primed && nb >= 0) {
            state_init(o, m, l);
        }
        if (nb > 0 && !primed) {
            const int qb = qn % G::kQBufs;
            bar_wait(&b->q_full[qb], (qn / G::kQBufs) & 1);
            q.load(p, sq + qb * G::kQBytes, wg);
            half = kHalfOn && pipe_half<G::kKeys, G::kTileRows>(p, sh);
            if (half) {
                pipe_first_scores<kPingPong, true>(p, sh, q, sk, b, ring, qb, wg, rw, lane, o, m, l,
                                                   pf);
            } else {
                pipe_first_scores<kPingPong>(p, sh, q, sk, b, ring, qb, wg, rw, lane, o, m, l, pf);
            }
        }
        primed = false;
        int i = 1;
        if (half && nb > 1) { /* P_0 V of the half K tile: a step of its own */
            pipe_step<false, kPingPong, true>(p, sh, q, sk, sv, b, ring, qn % G::kQBufs, 1, wg, rw,
                                              lane, o, m, l, pf);
            i = 2;
        }
        for (; i < nb; ++i) {
            pipe_step<false, kPingPong>(p, sh, q, sk, sv, b, ring, qn % G::kQBufs, i, wg, rw, lane,
                                        o, m, l, pf);
        }
        int h2 = 0, r2 = 0;
        Shape sh2 = {};
        const bool have2 =
            next_tile<kPaged, G::kKeys, G::kTileRows>(p, b, r, nb > 0 ? qn + 1 : qn, r2, h2, sh2);
        if (nb >= 0) {
            primed = nb > 0 && have2 && sh2.n_blocks > 0;
            if (primed) {
                const bool half2 = kHalfOn && pipe_half<G::kKeys, G::kTileRows>(p, sh2);
                pipe_boundary_any<T, kPingPong>(nb == 1 && half, half2, p, sh, sh2, q, sq, sk, sv,
                                                b, ring, qn, h, wg, rw, lane, o, m, l, pf);
                half = half2;
            } else {
                if (nb == 1 && half) {
                    pipe_last_pv<typename Q::PT, false, kPingPong, G, true>(sv, b, ring, nb, wg, o,
                                                                            pf);
                } else if (nb > 0) {
                    pipe_last_pv<typename Q::PT, false, kPingPong, G>(sv, b, ring, nb, wg, o, pf);
                }
                epilogue<T>(p, sh, o, m, l, h, rw, lane, q.ms, q.os);
            }
        }
        if (nb > 0) {
            ring += nb;
            ++qn;
        }
        have = have2;
        r = r2;
        h = h2;
        sh = sh2;
    }
}

#endif /* AP_COMMON_PREFILL_HOPPER_MERGE_CUH */
