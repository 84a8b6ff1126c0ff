#!/usr/bin/env python3
"""seesaw_ring_sim.py: a protocol model of decode_wgmma.cu's seesaw (MLA_WG_SEESAW 1): the
producer thread, the two consumer warpgroups, the 2-stage ring of nine 64-column blocks a tile
with one full mbarrier per block, the two release groups a stage (empty_l: warpgroup 0's 4 warps;
empty: all 8), the named barriers A and B (bar.arrive by one warpgroup, bar.sync by the other, 256
threads), P_A's buffer, P_B in stage 1's rope block, the hand-over values (xch) and the finish's
red_sum, which shares xch's m_a / alpha_A bytes.

TMA completions land in random order after random delays and the three actors run in random
order. Checks: no deadlock (an mbarrier parity wait that fell two phases behind never returns);
every read (S, P V, xch) sees the tile, P or pair it expects; no TMA lands in a block and no
generic write lands in a buffer while a wgmma still reads it; no hand-over value is overwritten
before it is read. A warpgroup is one actor: its 4 warps wait on the same barriers and arrive
together (release_stage: 4 arrivals).

`--mutants` runs protocol variants that break one rule each and fails unless every one of them is
caught, so the checks are shown to fail where the protocol is wrong.
Run: python3 backends/trtllm_mla/emu/seesaw_ring_sim.py [seeds] [--mutants]
"""
import random
import sys


class SimError(Exception):
    pass


def check(cond, *what):
    if not cond:
        raise SimError(what)


class MBar:
    """An mbarrier: `count` arrivals (and the expected transaction bytes) complete a phase."""

    def __init__(self, count):
        self.count, self.pending, self.phase, self.tx = count, count, 0, 0

    def arrive(self, n=1):
        self.pending -= n
        self._flip()

    def expect_arrive(self, tx):
        self.tx += tx
        self.arrive()

    def complete_tx(self, tx):
        self.tx -= tx
        self._flip()

    def _flip(self):
        check(self.pending >= 0, "mbarrier over-arrived")
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity):  # try_wait.parity: the phase of that parity has completed
        return (self.phase & 1) != parity


class Named:
    """A named barrier of 256 threads: each warpgroup's arrive or sync counts 128."""

    def __init__(self):
        self.arrived, self.gen = 0, 0

    def arrive(self):
        self.arrived += 1
        if self.arrived == 2:
            self.arrived, self.gen = 0, self.gen + 1

    def sync(self):
        gen = self.gen
        self.arrive()
        while self.gen == gen:
            yield


def run(n_tiles, seed, mutant=None):
    rng = random.Random(seed)
    full = [[MBar(1) for _ in range(9)] for _ in range(2)]
    empty_l = [MBar(4) for _ in range(2)]
    empty = [MBar(8) for _ in range(2)]
    bar_a, bar_b = Named(), Named()
    blocks = [[None] * 9 for _ in range(2)]  # what each block holds: (tile, kb) or ('PB', tile)
    pa = [None]  # P_A's buffer
    holds = {}  # buffer -> set of warpgroups whose wgmma reads it
    xch = {"A": None, "B": None}  # the pair whose values each half holds, None once read
    pending = []  # issued TMA loads: (stage, kb, tile)
    done = [False, False]

    def hold(wg, buf, want, have):
        check(have == want, "read", wg, buf, have, want)
        holds.setdefault(buf, set()).add(wg)

    def unhold(wg, bufs):
        for buf in bufs:
            holds[buf].discard(wg)

    def write(buf, who):
        check(not holds.get(buf), "written while a wgmma reads it", buf, who, holds.get(buf))

    def wait(bar, parity):
        while not bar.done(parity):
            yield

    def producer():
        for i in range(n_tiles):
            st, par = i & 1, ((i >> 1) + 1) & 1
            first = [0, 1, 2, 3] + ([8] if st == 0 else [])
            rest = [4, 5, 6, 7] + ([8] if st == 1 else [])
            if mutant == "rope1_early" and st == 1:
                first, rest = first + [8], rest[:-1]
            if i >= 2:
                yield from wait(empty_l[st], par)
            for kb in first:
                full[st][kb].expect_arrive(1)
                pending.append((st, kb, i))
            if i >= 2:
                yield from wait(empty[st], par)
            for kb in rest:
                full[st][kb].expect_arrive(1)
                pending.append((st, kb, i))
            yield

    def qk(wg, st, tile, ph):  # S over the nine blocks as they land, then wait for the wgmma
        for kb in range(9):
            yield from wait(full[st][kb], ph)
            hold(wg, (st, kb), (tile, kb), blocks[st][kb])
        yield
        unhold(wg, [(st, kb) for kb in range(9)])

    def wg0():
        for k in range((n_tiles + 1) // 2):
            ta, has_b, ph = 2 * k, 2 * k + 1 < n_tiles, k & 1
            yield from qk(0, 0, ta, ph)
            write("pa", "P_A")
            pa[0] = ("PA", ta)
            check(xch["A"] is None, "xch A overwritten before read", k)
            xch["A"] = k
            bar_a.arrive()
            reads = [(0, kb) for kb in range(4)] + ["pa"]
            for kb in range(4):
                hold(0, (0, kb), (ta, kb), blocks[0][kb])
            hold(0, "pa", ("PA", ta), pa[0])
            yield
            if mutant == "wg0_release_early":
                empty_l[0].arrive(4)
            yield
            unhold(0, reads)
            if mutant != "wg0_release_early":
                empty_l[0].arrive(4)
            empty[0].arrive(4)
            yield from bar_b.sync()
            check(xch["B"] == k, "xch B read", k, xch["B"])
            xch["B"] = None
            if not has_b:
                continue
            for kb in [0, 1, 2, 3, 8]:
                yield from wait(full[1][kb], ph)
            reads = [(1, kb) for kb in [0, 1, 2, 3, 8]]
            for kb in range(4):
                hold(0, (1, kb), (ta + 1, kb), blocks[1][kb])
            hold(0, (1, 8), ("PB", ta + 1), blocks[1][8])
            yield
            unhold(0, reads)
            empty_l[1].arrive(4)
            empty[1].arrive(4)
        # finish: warpgroup 0's row sums into red_sum[0, 64), xch's m_a bytes
        check(xch["A"] is None, "red_sum over an unread m_a")
        done[0] = True

    def wg1():
        for k in range((n_tiles + 1) // 2):
            ta, has_b, ph = 2 * k, 2 * k + 1 < n_tiles, k & 1
            if has_b:
                yield from qk(1, 1, ta + 1, ph)
            yield from bar_a.sync()
            check(xch["A"] == k, "xch A read", k, xch["A"])
            xch["A"] = None
            wanted = [0, 1, 2, 3, 4, 5, 6, 7] if mutant == "wg1_waits_all" else [4, 5, 6, 7]
            for kb in wanted:
                yield from wait(full[0][kb], ph)
            reads = [(0, kb) for kb in range(4, 8)] + ["pa"]
            for kb in range(4, 8):
                hold(1, (0, kb), (ta, kb), blocks[0][kb])
            hold(1, "pa", ("PA", ta), pa[0])
            if has_b:
                write((1, 8), "P_B")
                blocks[1][8] = ("PB", ta + 1)
            check(xch["B"] is None, "xch B overwritten before read", k)
            xch["B"] = k
            if mutant == "wg1_release_before_wait":
                empty[0].arrive(4)
            bar_b.arrive()
            yield
            unhold(1, reads)
            if mutant != "wg1_release_before_wait":
                empty[0].arrive(4)
            if not has_b:
                continue
            reads = [(1, kb) for kb in range(4, 9)]
            for kb in range(4, 8):
                hold(1, (1, kb), (ta + 1, kb), blocks[1][kb])
            hold(1, (1, 8), ("PB", ta + 1), blocks[1][8])
            yield
            unhold(1, reads)
            empty[1].arrive(4)
        # finish: warpgroup 1's row sums into red_sum[64, 128), xch's alpha_A bytes
        check(xch["A"] is None, "red_sum over an unread alpha_A")
        done[1] = True

    procs = [producer(), wg0(), wg1()]
    alive = [True] * 3
    steps = 0
    while any(alive) or pending:
        steps += 1
        check(steps < 200000, "deadlock", n_tiles, seed)
        if pending and (rng.random() < 0.35 or not any(alive)):
            st, kb, tile = pending.pop(rng.randrange(len(pending)) if rng.random() < 0.5 else 0)
            check(not holds.get((st, kb)), "TMA into a block being read", st, kb, holds.get((st, kb)))
            blocks[st][kb] = (tile, kb)
            full[st][kb].complete_tx(1)
            continue
        i = rng.randrange(3)
        if alive[i]:
            try:
                next(procs[i])
            except StopIteration:
                alive[i] = False
    check(done == [True, True], "a warpgroup did not finish")
    check(bar_a.arrived == 0 and bar_b.arrived == 0, "named barrier left half arrived")


MUTANTS = ["wg1_waits_all", "rope1_early", "wg0_release_early", "wg1_release_before_wait"]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    seeds = int(args[0]) if args else 200
    runs = 0
    for seed in range(seeds):
        for n_tiles in (1, 2, 3, 4, 5, 8, 9):
            run(n_tiles, seed * 31 + n_tiles)
            runs += 1
    print("ok", runs, "runs")
    if "--mutants" in sys.argv:
        for m in MUTANTS:
            caught = None
            for seed in range(seeds):
                for n_tiles in (3, 4, 5, 8):
                    try:
                        run(n_tiles, seed * 31 + n_tiles, m)
                    except SimError as e:
                        caught = e.args[0]
                        break
                if caught:
                    break
            if not caught:
                print("mutant not caught:", m)
                sys.exit(1)
            print("mutant", m, "caught:", caught[0])


if __name__ == "__main__":
    main()
