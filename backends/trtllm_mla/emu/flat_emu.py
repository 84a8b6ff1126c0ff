"""flat_emu.py: the flat schedule of decode.cu (decode_flat.cuh: flat_share, run_flat) and its
combine (combine.cu: mla_flat_combine_kernel) as written, CTA by CTA, on random and adversarial
batches: every tile of every sequence is attended by exactly one piece, each piece's state lands
in a slot no other piece uses, a sequence in one piece goes straight to out, and the combine
merges exactly a cut sequence's pieces into each (row, 64-dim chunk) of it once (slots and items
checked, not numbers); batches the whole-sequence rule keeps whole are checked the same way.
Plain Python. Run: python3 backends/trtllm_mla/emu/flat_emu.py"""

import random
import sys

TILE, PER_LANE = 64, 8


def seq_tiles(q_len, kv_len):
    return (kv_len + TILE - 1) // TILE if q_len > 0 and kv_len > 0 else 0


def flat_share(tiles, cta, ctas, cut=False):
    """flat_share: (begin, end, seq, seq_start, per, whole), the warp's passes collapsed; cut:
    option decode_schedule cut (no whole-sequence rule)."""
    total = sum(tiles)
    per = (total + ctas - 1) // ctas
    begin = min(cta * per, total)
    end = min(begin + per, total)
    waves = (len(tiles) + ctas - 1) // ctas
    whole = not cut and max(tiles + [0]) * waves <= per + per // 8 + 4
    if whole or begin >= end:
        return begin, end, -1, begin, per, whole
    n = len(tiles)
    carry = 0
    for base in range(0, n, 32 * PER_LANE):
        lane_t = [[tiles[s] if s < n else 0
                   for s in (base + lane * PER_LANE + i for i in range(PER_LANE))]
                  for lane in range(32)]
        sums = [sum(t) for t in lane_t]
        incl = 0
        for lane in range(32):
            incl += sums[lane]
            start = carry + incl - sums[lane]
            if start <= begin < start + sums[lane]:
                at = start
                for i in range(PER_LANE):
                    if at <= begin < at + lane_t[lane][i]:
                        return begin, end, base + lane * PER_LANE + i, at, per, whole
                    at += lane_t[lane][i]
        carry += incl
    raise AssertionError("begin past the tiles")


def run(q_lens, kv_lens, heads, ctas, cut=False):
    n = len(q_lens)
    tiles = [seq_tiles(q, k) for q, k in zip(q_lens, kv_lens)]
    covered = [[0] * t for t in tiles]   # tile -> times attended
    whole = [0] * n                        # seq -> times written straight to out
    slots = {}                             # slot -> (seq, first tile, end tile)
    for cta in range(ctas):
        begin, end, seq, at, per, whole_mode = flat_share(tiles, cta, ctas, cut)
        if whole_mode:
            for s in range(cta, n, ctas):
                if q_lens[s] * heads > 0 and tiles[s] > 0:
                    for i in range(tiles[s]):
                        covered[s][i] += 1
                    whole[s] += 1
            continue
        if seq < 0:
            continue
        pos = begin
        while pos < end and seq < n:
            rows = q_lens[seq] * heads
            t = seq_tiles(q_lens[seq], kv_lens[seq])
            tb, te = pos - at, min(t, end - at)
            if te > tb:
                assert rows > 0
                for i in range(tb, te):
                    covered[seq][i] += 1
                if tb == 0 and te == t:
                    whole[seq] += 1
                else:
                    slot = 2 * cta + (0 if pos == begin else 1)
                    assert slot not in slots, "slot reused"
                    slots[slot] = (seq, tb, te)
                pos = at + te
            at += t
            seq += 1
    for s in range(n):
        assert all(c == 1 for c in covered[s]), f"seq {s}: tiles attended {covered[s]}"
    # the combine: CTA b computes the same share, then takes its items (row, chunk of 8)
    merged = {}  # (seq, row, chunk) -> sorted slots
    for b in range(1, ctas):
        begin, end, seq, start, per, whole_mode = flat_share(tiles, b, ctas, cut)
        if whole_mode or seq < 0 or start == begin:
            continue
        rows = q_lens[seq] * heads
        t = seq_tiles(q_lens[seq], kv_lens[seq])
        c0, c1 = start // per, (start + t - 1) // per
        cnt, helpers, k = c1 - c0 + 1, c1 - c0, b - c0 - 1
        first = 2 * c0 + (0 if start == c0 * per else 1)
        slot_of = [first] + [2 * (c0 + i) for i in range(1, cnt)]
        items = rows * 8
        mine = (items - k + helpers - 1) // helpers if items > k else 0
        for j in range(mine):
            item = k + j * helpers
            key = (seq, item // 8, item % 8)
            assert key not in merged, "item merged twice"
            merged[key] = sorted(slot_of)
    for s in range(n):
        rows = q_lens[s] * heads
        pieces = sorted(k for k, v in slots.items() if v[0] == s)
        if tiles[s] == 0:
            assert whole[s] == 0 and not pieces
            continue
        if whole[s]:
            assert whole[s] == 1 and not pieces, f"seq {s}: whole and pieces"
            assert all((s, r, c) not in merged for r in range(rows) for c in range(8))
            continue
        spans = sorted((slots[k][1], slots[k][2]) for k in pieces)
        assert spans[0][0] == 0 and spans[-1][1] == tiles[s], f"seq {s}: {spans}"
        for r in range(rows):
            for c in range(8):
                got = merged.get((s, r, c))
                assert got == pieces, f"seq {s} row {r} chunk {c}: {got} {pieces}"
    return len(slots)


def main():
    rng = random.Random(5)
    cases = [
        ([1], [32768], 16, 132), ([1] * 128, [4096] * 128, 16, 132),
        ([1] * 132, [4096] * 132, 16, 132), ([1] * 64, [32768] + [1024] * 63, 16, 132),
        ([1, 1, 1, 1, 1], [1, 63, 64, 65, 5000], 16, 132), ([4, 2, 1], [70, 5000, 3], 16, 132),
        ([1], [1], 16, 132), ([1] * 300, [rng.randrange(1, 9000) for _ in range(300)], 16, 132),
        ([0, 1, 0, 2], [50, 700, 9, 130], 16, 7), ([1] * 5, [64, 64, 64, 64, 64], 16, 2),
        ([1] * 600, [64] * 600, 16, 132), ([3] * 10, [100000] * 10, 16, 132),
    ]
    for _ in range(300):
        n = rng.randrange(1, 700)
        q = [rng.choice([0, 1, 1, 1, 2, 4]) for _ in range(n)]
        kv = [max(q[i], rng.choice([1, 63, 64, 65, rng.randrange(1, 20000)])) for i in range(n)]
        cases.append((q, kv, rng.choice([16, 4, 1]), rng.choice([1, 2, 3, 7, 66, 132])))
    cut = wholes = 0
    for q, kv, h, ctas in cases:
        if run(q, kv, h, ctas):
            cut += 1
        else:
            wholes += 1
        run(q, kv, h, ctas, cut=True)
    print(f"flat_emu: {len(cases)} batches: every tile once, slots distinct, every cut row merged "
          f"once from exactly its pieces ({cut} of them cut, {wholes} run whole; all again cut): ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
