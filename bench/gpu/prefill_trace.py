#!/usr/bin/env python3
"""Where a prefill attention launch's time goes, block by block (issue 8).

Reads the per-block timeline that the diagnostic patch
bench/results/gpu/s29/prefill_trace.diff makes the warp-specialised
prefill kernel write (OSPREY_PREFILL_TRACE=N, OSPREY_PREFILL_TRACE_FILE):
one line a block, "index f0 .. f15" (f0 .. f11 in session 29's first
call), f0 = key tiles << 32 | SM, f1 = clock at entry, f2 = globaltimer at
entry, f3 = the copying warpgroup's key range known (the block barrier in
the first call's kernel), f4 = first TMA box issued, f5 = first K tile seen
by the first computing warpgroup, f6 = after its first tile, f7 = after its
last tile, f8 = after its last P V, f9 / f10 = after each computing
warpgroup's store, f11 = copier done, f12 = the first computing
warpgroup's q in place (after its barrier), f13 = the second computing
warpgroup's last P V done.

Prints, over all blocks, the mean and share of each phase of an SM's time
(including the gap between one block's end and the next one's entry on
that SM, and the SM's idle time at the end of the launch), and the
per-block cost beyond the steady key tiles in units of a steady tile.

    python3 bench/gpu/prefill_trace.py trace.txt [more.txt ...]
"""
import sys
from collections import defaultdict

PHASES = [
    ("prologue (entry -> q in place)", lambda b: b[12] - b[1]),
    ("first K tile wait (q in place -> K_0 seen)", lambda b: b[5] - b[12]),
    ("first tile (no P V overlap)", lambda b: b[6] - b[5]),
    ("steady tiles", lambda b: b[7] - b[6]),
    ("last P V", lambda b: b[8] - b[7]),
    ("store (to the later warpgroup's end)", lambda b: max(b[9], b[10]) - b[8]),
]


def load(path):
    head, blocks = "", []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                head = line[1:].strip()
                continue
            v = [int(x) for x in line.split()]
            if len(v) not in (13, 17) or v[2] == 0:  # a block that wrote nothing (no rows)
                continue
            b = v[1:] + [0] * (17 - len(v))
            if len(v) == 13:  # first call: q in place at the block barrier, no second last-P V time
                b[12] = b[3]
            blocks.append(b)
    return head, blocks


def report(path):
    head, blocks = load(path)
    if not blocks:
        raise ValueError("no traced blocks (lines of 13 or 17 numbers with a globaltimer)")
    print(f"== {path}: {head}; {len(blocks)} blocks traced")
    by_sm = defaultdict(list)
    for b in blocks:
        by_sm[b[0] & 0xFFFFFFFF].append(b)
    # ns per cycle from globaltimer against clock64 across each SM's first and last block.
    rates = []
    for sm, bl in by_sm.items():
        bl.sort(key=lambda b: b[1])
        if len(bl) >= 2 and bl[-1][1] > bl[0][1]:
            rates.append((bl[-1][2] - bl[0][2]) / (bl[-1][1] - bl[0][1]))
    ns = sorted(rates)[len(rates) // 2] if rates else 1 / 1.98
    print(f"SMs {len(by_sm)}; clock {1 / ns:.3f} GHz (median over SMs, globaltimer / clock64)")
    tot = defaultdict(float)
    gaps, tail, tiles = 0.0, 0.0, 0
    span_end = {}
    for sm, bl in by_sm.items():
        for i, b in enumerate(bl):
            for name, f in PHASES:
                tot[name] += f(b)
            tiles += b[0] >> 32
            end = max(b[9], b[10])
            if i + 1 < len(bl):
                gaps += bl[i + 1][1] - end
        span_end[sm] = (bl[0][2], bl[-1][2] + (max(bl[-1][9], bl[-1][10]) - bl[-1][1]) * ns)
    t_first = min(s for s, _ in span_end.values())
    t_last = max(e for _, e in span_end.values())
    for sm, (s, e) in span_end.items():
        tail += (t_last - e) / ns + (s - t_first) / ns
    tot["gap (block end -> next block's entry)"] = gaps
    tot["SM idle at the launch's start / end"] = tail
    allc = sum(tot.values())
    nb = len(blocks)
    steady_tiles = tiles - nb  # the first tile of each block is its own phase
    per_tile = tot["steady tiles"] / max(steady_tiles, 1)
    print(f"span {(t_last - t_first) / 1e3:.1f} us; key tiles {tiles} ({tiles / nb:.2f} a block); "
          f"steady tile {per_tile:.0f} cycles ({per_tile * ns:.0f} ns)")
    print(f"{'phase':45s} {'cycles/block':>12s} {'tiles/block':>11s} {'share':>7s}")
    for name, v in tot.items():
        print(f"{name:45s} {v / nb:12.0f} {v / nb / per_tile:11.2f} {100 * v / allc:6.1f}%")
    extra = (allc - tot["steady tiles"]) / nb / per_tile - 1  # beyond the block's tiles (first tile counted as one)
    print(f"cost a block beyond its key tiles: {extra:.2f} steady tiles")
    if all(b[13] for b in blocks):
        lag = sum(b[13] - b[8] for b in blocks) / nb
        st = sum(max(b[9] - b[8], b[10] - b[13]) for b in blocks) / nb
        print(f"second warpgroup's last P V after the first's: {lag:.0f} cycles; a store alone: {st:.0f} cycles")
    cp = sum(b[4] - b[1] for b in blocks) / nb
    print(f"entry -> first K/V box issued: {cp:.0f} cycles")


def main(paths):
    if not paths:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for p in paths:
        try:
            report(p)
        except (OSError, ValueError) as e:
            print(f"prefill_trace: {p}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
