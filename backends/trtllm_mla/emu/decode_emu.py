#!/usr/bin/env python3
"""decode_emu.py: a lane-level emulation of decode.cu's data flow (no GPU needed).

Replays the kernel's shared-memory layout (tile_off / p_off swizzles), its ldmatrix addressing,
the m16n8k16 fragment layouts, the per-warp softmax bookkeeping with the cross-warp max/sum
exchange, the causal mask, the split over KV tiles and the combine, on random inputs, and
compares the result with plain float64 attention. It checks the index math of the kernel as
written (the formulas below are copied from decode.cu by hand: keep them in step), not the
compiler or the hardware. Summation order is not modelled: the 16-row kernel's four S accumulator
chains and the combine's eight warps sharing the splits add the same terms in another order. Run: python3 backends/trtllm_mla/emu/decode_emu.py
"""
import math
import sys

import numpy as np

ROW, LAT, TILE = 576, 512, 64


def tile_off(row, chunk):  # bytes
    return row * (ROW * 2) + ((chunk ^ (row & 7)) << 4)


def p_off(row, chunk):
    return row * 128 + ((chunk ^ (row & 7)) << 4)


def ldmatrix_x4(smem, addrs, trans=False):
    """addrs[lane] = byte address of a row; returns regs[lane][4][2] (two 16-bit values each)."""
    regs = np.zeros((32, 4, 2))
    for i in range(4):
        rows = [smem[addrs[8 * i + r] // 2: addrs[8 * i + r] // 2 + 8] for r in range(8)]
        m = np.array(rows)  # 8x8, m[r][c]
        for l in range(32):
            if not trans:
                regs[l, i] = m[l // 4, 2 * (l % 4): 2 * (l % 4) + 2]
            else:
                regs[l, i] = [m[2 * (l % 4), l // 4], m[2 * (l % 4) + 1, l // 4]]
    return regs


def mma(c, a, b0, b1):
    """c[32][4] += A(16x16 from a[32][4][2]) @ B(16x8 from b0, b1 [32][2])."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for l in range(32):
        g, t = l // 4, l % 4
        A[g, 2 * t:2 * t + 2] = a[l, 0]
        A[g + 8, 2 * t:2 * t + 2] = a[l, 1]
        A[g, 2 * t + 8:2 * t + 10] = a[l, 2]
        A[g + 8, 2 * t + 8:2 * t + 10] = a[l, 3]
        B[2 * t:2 * t + 2, g] = b0[l]
        B[2 * t + 8:2 * t + 10, g] = b1[l]
    C = A @ B
    for l in range(32):
        g, t = l // 4, l % 4
        c[l, 0] += C[g, 2 * t]
        c[l, 1] += C[g, 2 * t + 1]
        c[l, 2] += C[g + 8, 2 * t]
        c[l, 3] += C[g + 8, 2 * t + 1]


def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def run_cta(M, q_rows, keys, kv_len, q_len, H, row0, t_begin, t_end, scale2):
    """One CTA: q_rows [M][576] (zero past the rows), keys [n][576]; returns (o, m, l) per row."""
    RB = M // 16
    SPL = 8 // RB
    TN, DN = TILE // SPL, LAT // SPL
    qs = np.zeros(M * ROW)
    for r in range(M):
        for c in range(ROW // 8):
            qs[tile_off(r, c) // 2: tile_off(r, c) // 2 + 8] = q_rows[r, c * 8:c * 8 + 8]
    rows = q_len * H
    o = {w: np.zeros((32, DN // 8, 4)) for w in range(8)}
    m_run = {w: np.full((32, 2), -np.inf) for w in range(8)}
    l_run = {w: np.zeros((32, 2)) for w in range(8)}
    limit = {}
    for w in range(8):
        rb = w % RB
        lim = np.zeros((32, 2), dtype=int)
        for l in range(32):
            for h in range(2):
                gr = row0 + rb * 16 + l // 4 + 8 * h
                tok = gr // H if gr < rows else 0
                lim[l, h] = kv_len - q_len + tok
        limit[w] = lim
    for tile in range(t_begin, t_end):
        ks = np.zeros(TILE * ROW)
        for r in range(TILE):
            pos = tile * TILE + r
            if pos < kv_len:
                for c in range(ROW // 8):
                    ks[tile_off(r, c) // 2: tile_off(r, c) // 2 + 8] = keys[pos, c * 8:c * 8 + 8]
        S = {}
        red_max = np.zeros((SPL, M))
        for w in range(8):
            rb, cs = w % RB, w // RB
            kSN = TN // 8
            s = np.zeros((32, kSN, 4))
            for k32 in range(ROW // 32):
                qa = [tile_off(rb * 16 + (l & 15), 4 * k32 + (l >> 4)) for l in range(32)]
                qb = [tile_off(rb * 16 + (l & 15), 4 * k32 + 2 + (l >> 4)) for l in range(32)]
                a0, a1 = ldmatrix_x4(qs, qa), ldmatrix_x4(qs, qb)
                for j in range(kSN):
                    ka = [tile_off(cs * TN + j * 8 + (l & 7), 4 * k32 + (l >> 3)) for l in range(32)]
                    b = ldmatrix_x4(ks, ka)
                    sj = s[:, j, :]
                    mma(sj, a0, b[:, 0], b[:, 1])
                    mma(sj, a1, b[:, 2], b[:, 3])
            pos0 = tile * TILE + cs * TN
            if tile * TILE + TILE - 1 > kv_len - q_len:
                for l in range(32):
                    for j in range(kSN):
                        for e in range(4):
                            pos = pos0 + j * 8 + 2 * (l % 4) + (e & 1)
                            if pos > limit[w][l, e >> 1]:
                                s[l, j, e] = -np.inf
            S[w] = s
            for l in range(32):
                if l % 4 == 0:
                    for h in range(2):
                        vals = s[l:l + 4, :, 2 * h:2 * h + 2]
                        red_max[cs, rb * 16 + l // 4 + 8 * h] = vals.max()
        P = np.zeros(M * TILE)
        for w in range(8):
            rb, cs = w % RB, w // RB
            kSN = TN // 8
            s = S[w]
            alpha = np.zeros((32, 2))
            m_use = np.zeros((32, 2))
            for l in range(32):
                for h in range(2):
                    tmax = red_max[:, rb * 16 + l // 4 + 8 * h].max()
                    m_new = max(m_run[w][l, h], tmax * scale2)
                    m_use[l, h] = 0.0 if m_new == -np.inf else m_new
                    alpha[l, h] = 2.0 ** (m_run[w][l, h] - m_use[l, h])
                    m_run[w][l, h] = m_new
            rs = np.zeros((32, 2))
            for l in range(32):
                g, t = l // 4, l % 4
                for j in range(kSN):
                    pv = [2.0 ** (s[l, j, e] * scale2 - m_use[l, e >> 1]) for e in range(4)]
                    for e in range(4):
                        rs[l, e >> 1] += pv[e]
                    col = cs * TN + j * 8 + 2 * t
                    r = rb * 16 + g
                    base = p_off(r, col >> 3) // 2 + (col & 7)
                    P[base:base + 2] = bf16(pv[0:2])
                    base = p_off(r + 8, col >> 3) // 2 + (col & 7)
                    P[base:base + 2] = bf16(pv[2:4])
            l_run[w] = l_run[w] * alpha + rs
            o[w][:, :, 0:2] *= alpha[:, None, 0:1]
            o[w][:, :, 2:4] *= alpha[:, None, 1:2]
        for w in range(8):
            rb, cs = w % RB, w // RB
            kNT = DN // 8
            for k16 in range(TILE // 16):
                a = ldmatrix_x4(P, [p_off(rb * 16 + (l & 15), 2 * k16 + (l >> 4)) for l in range(32)])
                for i in range(0, kNT, 2):
                    addrs = [tile_off(k16 * 16 + ((l >> 3) & 1) * 8 + (l & 7),
                                      (cs * DN + i * 8) // 8 + (l >> 4)) for l in range(32)]
                    b = ldmatrix_x4(ks, addrs, trans=True)
                    mma(o[w][:, i, :], a, b[:, 0], b[:, 1])
                    mma(o[w][:, i + 1, :], a, b[:, 2], b[:, 3])
    # finish: full row sums, normalised rows, base-2 lse
    red_sum = np.zeros((SPL, M))
    for w in range(8):
        rb, cs = w % RB, w // RB
        for l in range(0, 32, 4):
            for h in range(2):
                red_sum[cs, rb * 16 + l // 4 + 8 * h] = l_run[w][l:l + 4, h].sum()
    out = np.zeros((M, LAT))
    lse2 = np.zeros(M)
    for w in range(8):
        rb, cs = w % RB, w // RB
        for l in range(32):
            g, t = l // 4, l % 4
            for h in range(2):
                r = rb * 16 + g + 8 * h
                lt = red_sum[:, r].sum()
                inv = 1.0 / lt if lt > 0 else 0.0
                lse2[r] = m_run[w][l, h] + math.log2(lt) if lt > 0 else -np.inf
                for i in range(DN // 8):
                    d = cs * DN + i * 8 + 2 * t
                    out[r, d:d + 2] = o[w][l, i, 2 * h:2 * h + 2] * inv
    return out, lse2


def check(M, H, q_len, kv_len, splits, seed):
    rng = np.random.default_rng(seed)
    keys = bf16(rng.uniform(-1, 1, size=(kv_len, ROW)))
    q = bf16(rng.uniform(-1, 1, size=(q_len * H, ROW)))
    sm = 1 / math.sqrt(192)
    scale2 = sm * math.log2(math.e)
    rows = q_len * H
    tiles = (kv_len + TILE - 1) // TILE
    per = (tiles + splits - 1) // splits
    worst = 0.0
    for rb_cta in range((rows + M - 1) // M):
        row0 = rb_cta * M
        qr = np.zeros((M, ROW))
        n = min(M, rows - row0)
        qr[:n] = q[row0:row0 + n]
        parts = []
        for sidx in range(splits):
            tb = min(sidx * per, tiles)
            te = min(tb + per, tiles)
            parts.append(run_cta(M, qr, keys, kv_len, q_len, H, row0, tb, te, scale2))
        for r in range(n):
            gr = row0 + r
            tok = gr // H
            vis = kv_len - q_len + tok + 1
            logit = (q[gr] @ keys[:vis].T) * sm
            p = np.exp(logit - logit.max())
            ref = (p / p.sum()) @ keys[:vis, :LAT]
            ref_lse = logit.max() + math.log(p.sum())
            l2s = np.array([pt[1][r] for pt in parts])
            mx = l2s.max()
            ws = np.where(np.isfinite(l2s), 2.0 ** (l2s - mx), 0.0)
            got = sum(w * pt[0][r] for w, pt in zip(ws, parts)) / ws.sum()
            got_lse = (mx + math.log2(ws.sum())) * math.log(2)
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            worst = max(worst, err, abs(got_lse - ref_lse))
    return worst


if __name__ == "__main__":
    cases = [  # (M, H, q_len, kv_len, splits)
        (16, 16, 1, 70, 1),
        (16, 16, 1, 130, 3),
        (64, 64, 1, 65, 1),
        (64, 32, 2, 100, 2),  # MTP rows across tokens, causal mask, a split
        (16, 8, 2, 3, 1),     # q_len 2 over 3 keys: the first token sees 2
        (64, 16, 2, 150, 2),  # 32 rows in a 64-row block: the rest zero and unwritten
        (16, 16, 1, 65, 4),   # 2 tiles over 4 splits: two splits empty (lse -inf)
        (64, 128, 1, 64, 1),  # two row blocks, one full tile
    ]
    bad = 0
    for c in cases:
        err = check(*c, seed=len(c) + c[3])
        ok = err < 1e-2
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'} M={c[0]} H={c[1]} q_len={c[2]} kv_len={c[3]} "
              f"splits={c[4]}: worst error {err:.2e}")
        sys.stdout.flush()
    sys.exit(1 if bad else 0)
