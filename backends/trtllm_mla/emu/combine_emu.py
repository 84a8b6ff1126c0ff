"""combine_emu.py: the split-KV combine of combine.cu as written, lane by lane, against a direct
log-sum-exp merge in float64: which thread loads which split (16 slots x kCombinePer, batches
past 144 splits), the per-thread and per-slot maxima, the rescale of a running state, and empty
splits (lse -inf, zeros), all splits empty, one split. Plain Python, no numpy. Run:
python3 backends/trtllm_mla/emu/combine_emu.py"""

import math
import random
import sys

SLOTS, LANES, PER, DIMS = 16, 16, 9, 64  # a CTA: 16 slots x 16 lanes, a float4 each: 64 dims


def exp2(x):
    return 0.0 if x == -math.inf else 2.0 ** x


def merge_splits(lse, out, s0, S, st, lane):
    """One call of merge_splits: the thread's kCombinePer loads, then the merge."""
    ls, vs = [], []
    for i in range(PER):
        s = s0 + i * SLOTS
        ls.append(lse[s] if s < S else -math.inf)
        vs.append(out[s][4 * lane:4 * lane + 4] if s < S else [0.0] * 4)
    mx = max([st["m"]] + ls)
    base = 0.0 if mx == -math.inf else mx
    r = exp2(st["m"] - base) if st["m"] != -math.inf else 0.0
    st["acc"] = [a * r for a in st["acc"]]
    st["w"] *= r
    for li, vi in zip(ls, vs):
        wi = exp2(li - base) if li != -math.inf else 0.0
        st["w"] += wi
        st["acc"] = [a + wi * v for a, v in zip(st["acc"], vi)]
    st["m"] = mx


def combine(lse, out, S):
    """One CTA of mla_combine_kernel: the 64 outputs of its chunk and the row's lse (natural)."""
    part, part_mw = {}, {}
    for slot in range(SLOTS):
        for lane in range(LANES):
            st = {"acc": [0.0] * 4, "m": -math.inf, "w": 0.0}
            s0 = slot
            while s0 < S:
                merge_splits(lse, out, s0, S, st, lane)
                s0 += SLOTS * PER
            part[slot, lane] = st["acc"]
            if lane == 0:
                part_mw[slot] = (st["m"], st["w"])
    mx = max(m for m, _ in part_mw.values())
    base = 0.0 if mx == -math.inf else mx
    got = []
    wsum = 0.0
    for lane in range(LANES):
        acc, wsum = [0.0] * 4, 0.0
        for k in range(SLOTS):
            f = exp2(part_mw[k][0] - base) if part_mw[k][0] != -math.inf else 0.0
            wsum += f * part_mw[k][1]
            acc = [a + f * v for a, v in zip(acc, part[k, lane])]
        inv = 1.0 / wsum if wsum > 0 else 0.0
        got += [a * inv for a in acc]
    lse_out = (mx + math.log2(wsum)) * math.log(2) if wsum > 0 else -math.inf
    return got, lse_out


def reference(lse, out, S):
    live = [s for s in range(S) if lse[s] != -math.inf]
    if not live:
        return [0.0] * DIMS, -math.inf
    mx = max(lse[s] for s in live)
    w = {s: 2.0 ** (lse[s] - mx) for s in live}
    tot = sum(w.values())
    ref = [sum(w[s] * out[s][d] for s in live) / tot for d in range(DIMS)]
    return ref, (mx + math.log2(tot)) * math.log(2)


def check(S, empty, seed):
    rng = random.Random(seed)
    lse = [rng.uniform(-30, 30) for _ in range(S)]
    out = [[rng.uniform(-1, 1) for _ in range(DIMS)] for _ in range(S)]
    for s in range(S):
        if rng.random() < empty:  # an empty split: zeros and -inf
            lse[s] = -math.inf
            out[s] = [0.0] * DIMS
    got, got_lse = combine(lse, out, S)
    ref, ref_lse = reference(lse, out, S)
    err = max(abs(g - r) for g, r in zip(got, ref))
    if ref_lse == -math.inf:
        return err if got_lse == -math.inf else math.inf
    return max(err, abs(got_lse - ref_lse))


if __name__ == "__main__":
    bad = 0
    for S, empty in [(1, 0), (2, 0.5), (7, 0), (16, 0.2), (17, 0), (132, 0), (132, 0.05),
                     (144, 0), (145, 0.1), (256, 0.3), (300, 0), (5, 1.0)]:
        err = check(S, empty, seed=S)
        ok = err < 1e-12
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'} splits={S} empty={empty}: worst error {err:.2e}")
    sys.exit(1 if bad else 0)
