"""flat_emu.py: trtllm_mha's flat decode schedule (decode_flat.cuh; decode.cu: the share, the walk
flat_begin / flat_advance / flat_work and mha_decode_flat_kernel's issue and compute loops) and its
combine (combine.cu: mha_flat_combine_kernel) as written, CTA by CTA, on random and adversarial
batches. Checked: the issue side and the compute side walk the same pieces in the same order;
every stage of every unit is attended by exactly one piece, with the key range cta_work_find gives
its row block; a unit in one piece goes straight to out, a cut unit's pieces land in slots no other
piece uses, and exactly one combine CTA merges exactly those slots (slots and units, not numbers).
Plain Python. Run: python3 backends/trtllm_mha/emu/flat_emu.py"""

import random
import sys

PER_LANE = 8


def cdiv(a, b):
    return (a + b - 1) // b


class Batch:
    def __init__(self, q_lens, kv_lens, kv_heads, group, block_rows, stage_keys):
        self.q, self.kv = q_lens, kv_lens
        self.n, self.h, self.group = len(q_lens), kv_heads, group
        self.block_rows, self.keys = block_rows, stage_keys

    def blocks(self, s):  # mha_flat_blocks, 0 without work (flat_seq_of)
        live = self.q[s] > 0 and self.kv[s] > 0
        return cdiv(self.q[s] * self.group, self.block_rows) if live else 0

    def stages(self, s):  # mha_flat_stages, 0 without work
        live = self.q[s] > 0 and self.kv[s] > 0
        return cdiv(self.kv[s], self.keys) if live else 0

    def tiles(self, s):  # mha_flat_tiles
        return self.h * self.blocks(s) * self.stages(s)


def scan_find(tiles, pos):
    """ApFlatScan::find, the warp's passes collapsed: (seq, seq_start) of the sequence holding
    tile pos, the first such sequence (empty sequences hold none)."""
    n, carry = len(tiles), 0
    for base in range(0, n, 32 * PER_LANE):
        lane_t = [[tiles[s] if s < n else 0
                   for s in (base + lane * PER_LANE + i for i in range(PER_LANE))]
                  for lane in range(32)]
        incl = 0
        hits = []
        for lane in range(32):
            s = sum(lane_t[lane])
            incl += s
            start = carry + incl - s
            if start <= pos < start + s:
                at = start
                for i in range(PER_LANE):
                    if at <= pos < at + lane_t[lane][i]:
                        hits.append((base + lane * PER_LANE + i, at))
                    at += lane_t[lane][i]
        if hits:
            return hits[0]
        carry += incl
    return None


class Cursor:
    """flat_cursor: sq (seq, stages, blocks), unit, k, steps, left."""

    def __init__(self, b, seq, seq_start, begin, total):
        self.b, self.seq = b, seq
        within = begin - seq_start
        st = b.stages(seq)
        self.unit = within // st
        self.k = within - self.unit * st
        self.steps = min(st - self.k, total)
        self.left = total - self.steps

    def advance(self):
        b = self.b
        self.unit += 1
        if self.unit == b.h * b.blocks(self.seq):
            self.unit = 0
            seq = self.seq + 1
            while b.stages(seq) == 0 and seq + 1 < b.n:
                seq += 1
            self.seq = seq
        self.k = 0
        self.steps = min(self.b.stages(self.seq), self.left)
        self.left -= self.steps

    def piece(self):
        return (self.seq, self.unit, self.k, self.steps)

    def work(self):
        """flat_work: (kv_head, block, key_begin, key_end)."""
        b, s = self.b, self.seq
        blocks = b.blocks(s)
        kv_head = self.unit // blocks
        block = self.unit - kv_head * blocks
        rows = b.q[s] * b.group
        prefix = b.kv[s] - b.q[s]
        last_row = min(rows, (block + 1) * b.block_rows) - 1
        keys = min(b.kv[s], prefix + last_row // b.group + 1)
        return kv_head, block, min(keys, self.k * b.keys), min(keys, (self.k + self.steps) * b.keys)


def run(b, ctas, ring_stages):
    tiles = [b.tiles(s) for s in range(b.n)]
    total_all = sum(tiles)
    per = cdiv(total_all, ctas)
    seen = {}      # (seq, unit) -> list of (k, steps, slot)
    for cta in range(ctas):
        begin = min(cta * per, total_all)
        end = min(begin + per, total_all)
        found = scan_find(tiles, begin) if begin < end else None
        total = end - begin if found is not None else 0
        if total <= 0:
            continue
        seq, seq_start = found
        ic = Cursor(b, seq, seq_start, begin, total)
        cc = Cursor(b, seq, seq_start, begin, total)
        issued = []   # the issue side's (piece, index) per stream stage
        ii = 0

        def issue():
            nonlocal ii
            issued.append((ic.piece(), ii))
            ii += 1
            if ii == ic.steps and ic.left > 0:
                ic.advance()
                ii = 0

        for s in range(ring_stages - 1):
            if s < total:
                issue()
        ci, first_piece = 0, True
        for i in range(total):
            nxt = i + ring_stages - 1
            if nxt < total:
                issue()
            assert issued[i] == (cc.piece(), ci), (cta, i, issued[i], cc.piece(), ci)
            ci += 1
            if ci < cc.steps:
                continue
            seq_, unit, k, steps = cc.piece()
            whole = k == 0 and steps == b.stages(seq_)
            slot = None if whole else 2 * cta + (0 if first_piece else 1)
            kv_head, block, kb, ke = cc.work()
            # cta_work_find's range for this row block, cut at the piece's stages
            rows = b.q[seq_] * b.group
            last_row = min(rows, (block + 1) * b.block_rows) - 1
            keys = min(b.kv[seq_], b.kv[seq_] - b.q[seq_] + last_row // b.group + 1)
            assert (kb, ke) == (min(keys, k * b.keys), min(keys, (k + steps) * b.keys))
            assert block * b.block_rows < rows and kv_head < b.h
            seen.setdefault((seq_, unit), []).append((k, steps, slot))
            if cc.left == 0:
                break
            cc.advance()
            ci, first_piece = 0, False
        assert len(issued) == total and ic.left == 0 and cc.left == 0
    # every unit's stages covered once, in order
    for s in range(b.n):
        for unit in range(b.h * b.blocks(s)):
            pieces = seen.get((s, unit), [])
            assert pieces, (s, unit)
            at = 0
            for k, steps, _ in pieces:
                assert k == at, (s, unit, pieces)
                at += steps
            assert at == b.stages(s), (s, unit, pieces)
            if len(pieces) == 1:
                assert pieces[0][2] is None
            else:
                assert all(p[2] is not None for p in pieces)
    assert sum(len(v) for k, v in seen.items()) > 0 or total_all == 0
    slots = [p[2] for v in seen.values() for p in v if p[2] is not None]
    assert len(slots) == len(set(slots)) and all(0 <= x < 2 * ctas for x in slots)
    # the combine: CTA b - 1 for boundary b
    merged = {}
    for bnd in range(1, ctas):
        pos = bnd * per
        if pos >= total_all:
            continue
        seq, seq_start = scan_find(tiles, pos)
        st = b.stages(seq)
        unit = (pos - seq_start) // st
        unit_start = seq_start + unit * st
        if not (unit_start < pos and unit_start >= pos - per):
            continue
        c0, c1 = unit_start // per, (unit_start + st - 1) // per
        first = 2 * c0 + (0 if unit_start == c0 * per else 1)
        got = [first] + [2 * c for c in range(c0 + 1, c1 + 1)]
        assert (seq, unit) not in merged
        merged[(seq, unit)] = got
    for key, pieces in seen.items():
        want = [p[2] for p in pieces]
        if len(pieces) == 1:
            assert key not in merged
        else:
            assert merged.get(key) == want, (key, merged.get(key), want)
    return sum(1 for v in seen.values() if len(v) > 1)


def main():
    rng = random.Random(20261127)
    cut_total, batches = 0, 0
    shapes = [  # (kv_heads, group, block_rows, stage_keys, ring stages)
        (8, 4, 16, 128, 3), (2, 32, 64, 32, 4), (4, 4, 16, 128, 2), (1, 16, 32, 64, 3),
        (8, 8, 32, 64, 4),
    ]
    fixed = [
        ([1] * 64, [4096] * 64), ([1], [8192]), ([1], [32768]), ([1] * 256, [1024] * 256),
        ([1] + [1] * 63, [32768] + [1024] * 63), ([1] * 300, [1] * 300), ([8, 0, 3], [5000, 7, 4]),
        ([1, 1, 1], [0, 0, 1]), ([4] * 5, [4, 60, 61, 4995, 9000]),
    ]
    for q, kv in fixed:
        for h, g, br, keys, stages in shapes:
            for ctas in (1, 2, 7, 132, 264):
                if sum(1 for x, y in zip(q, kv) if x > 0 and y > 0) == 0:
                    continue
                cut_total += run(Batch(q, kv, h, g, br, keys), ctas, stages)
                batches += 1
    for _ in range(300):
        n = rng.choice([1, 2, 3, 17, 64, 255, 256, 257, 600])
        q = [rng.choice([0, 1, 1, 1, 2, 4, 8]) for _ in range(n)]
        kv = [rng.choice([0, 1, 17, 127, 128, 129, 1000, 4097, 20000]) for _ in range(n)]
        kv = [max(x, y) for x, y in zip(q, kv)]
        if sum(1 for x, y in zip(q, kv) if x > 0 and y > 0) == 0:
            q[0], kv[0] = 1, 5
        h, g, br, keys, stages = rng.choice(shapes)
        cut_total += run(Batch(q, kv, h, g, br, keys), rng.choice([1, 3, 66, 132, 264]), stages)
        batches += 1
    print(f"flat_emu: {batches} batches, {cut_total} cut units merged: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
