#!/usr/bin/env python3
"""seesaw_emu.py: a row-level emulation of decode_wgmma.cu's seesaw schedule (MLA_WG_SEESAW 1): the pair
protocol's running maximum handover, alpha factors, per-warpgroup row sums and the odd-tile /
masked-tail / MTP-causal cases, against float64 softmax attention, plus the lane map of tile_p (each of the 128 threads of a
warpgroup, its 32 S accumulators -> (row, key) of the 64 x 64 tile, as the mask and the P store
use it: a bijection). Plain Python (no numpy). The formulas are copied from decode_wgmma.cu by
hand: keep them in step. Run: python3 backends/trtllm_mla/emu/seesaw_emu.py
"""
import math
import random

NEG = -math.inf


def ex2(x):
    return 0.0 if x == NEG else 2.0 ** x


def tile_p(s_row, m, scale2):
    mx = max(s_row)
    m_new = max(m, mx * scale2 if mx != NEG else NEG)
    m_use = 0.0 if m_new == NEG else m_new
    alpha = ex2(m - m_use) if m != NEG else 0.0
    p = [ex2(v * scale2 - m_use) if v != NEG else 0.0 for v in s_row]
    return m_new, alpha, p


def run(kv_len, q_len, heads, d, t_begin, t_end, seed):
    rnd = random.Random(seed)
    rows = q_len * heads
    q = [[rnd.gauss(0, 1) for _ in range(d)] for _ in range(rows)]
    kv = [[rnd.gauss(0, 1) for _ in range(d)] for _ in range(kv_len)]
    sm = 0.3
    scale2 = sm * 1.4426950408889634
    out = []
    for r in range(rows):
        limit = kv_len - q_len + r // heads
        # warpgroup states: O_L (wg0) and O_R (wg1) over the same dims here, their own l
        o = [[0.0] * d, [0.0] * d]
        l = [0.0, 0.0]
        m_run = [NEG, NEG]

        def s_of(t):
            res = []
            for j in range(64):
                pos = t * 64 + j
                if pos > limit or pos >= kv_len:
                    res.append(NEG)
                else:
                    res.append(sum(a * b for a, b in zip(q[r], kv[pos])))
            return res

        def pv(c, p, t, scale):
            o[c] = [x * scale for x in o[c]]
            for j in range(64):
                pos = t * 64 + j
                v = kv[pos] if pos < kv_len else [0.0] * d  # zeroed tail rows
                for k in range(d):
                    o[c][k] += p[j] * v[k]

        for ta in range(t_begin, t_end, 2):
            has_b = ta + 1 < t_end
            # WG0: tile A from its m (m_b of the previous pair)
            m_a, alpha_a, p_a = tile_p(s_of(ta), m_run[0], scale2)
            l[0] = l[0] * alpha_a + sum(p_a)
            pv(0, p_a, ta, alpha_a)
            # WG1: receives m_a, alpha_a
            l[1] *= alpha_a
            pv(1, p_a, ta, alpha_a)
            m_run[1] = m_a
            alpha_b, p_b = 1.0, None
            if has_b:
                m_run[1], alpha_b, p_b = tile_p(s_of(ta + 1), m_a, scale2)
            # WG0 receives m_b, alpha_b
            m_run[0] = m_run[1]
            if has_b:
                l[0] *= alpha_b
                pv(0, p_b, ta + 1, alpha_b)
                l[1] = l[1] * alpha_b + sum(p_b)
                pv(1, p_b, ta + 1, alpha_b)
        assert m_run[0] == m_run[1]
        lt = l[0] + l[1]
        # reference over the same key range
        keys = [pos for pos in range(t_begin * 64, min(t_end * 64, kv_len)) if pos <= limit]
        if not keys:
            assert lt == 0.0
            out.append(0.0)
            continue
        logits = [sm * sum(a * b for a, b in zip(q[r], kv[pos])) for pos in keys]
        mx = max(logits)
        w = [math.exp(x - mx) for x in logits]
        z = sum(w)
        ref = [sum(wi * kv[pos][k] for wi, pos in zip(w, keys)) / z for k in range(d)]
        lse_ref = mx + math.log(z)
        lse = (m_run[0] + math.log2(lt)) * math.log(2)
        err = 0.0
        for c in range(2):
            err = max(err, max(abs(a / lt - b) for a, b in zip(o[c], ref)))
        err = max(err, abs(lse - lse_ref))
        out.append(err)
    return max(out)


def lane_map():
    seen = set()
    for tid in range(128):
        w, lane = tid // 32, tid % 32
        g, t4 = lane // 4, lane % 4
        for e in range(32):
            row = w * 16 + g + 8 * ((e >> 1) & 1)
            key = (e >> 2) * 8 + 2 * t4 + (e & 1)
            seen.add((row, key))
    assert seen == {(r, k) for r in range(64) for k in range(64)}, "tile_p lane map"


lane_map()
cases = [  # kv_len, q_len, heads, d, t_begin, t_end
    (1, 1, 2, 8, 0, 1), (63, 1, 2, 8, 0, 1), (64, 1, 2, 8, 0, 1), (65, 1, 2, 8, 0, 2),
    (200, 1, 2, 8, 0, 4), (300, 2, 2, 8, 0, 5), (259, 4, 1, 8, 0, 5), (258, 4, 2, 8, 4, 5),
    (700, 3, 2, 8, 3, 8), (640, 1, 2, 8, 4, 10), (130, 4, 2, 8, 2, 3),
]
worst = 0.0
for i, c in enumerate(cases):
    e = run(*c, seed=i)
    print(c, "max err %.2e" % e)
    worst = max(worst, e)
assert worst < 1e-9, worst
print("seesaw emulation: all cases agree with float64 (worst %.2e)" % worst)
