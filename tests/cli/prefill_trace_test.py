#!/usr/bin/env python3
"""bench/gpu/prefill_trace.py on hand-made per-block timelines: two SMs of
two blocks each with known phase lengths (17 numbers a line), a block that
wrote nothing (skipped), the first call's 13-number lines (q in place read
from the block barrier), and clear exits on a file without blocks and on a
missing file. Standard library only.
Usage: prefill_trace_test.py REPO_ROOT
"""
import os
import re
import sys
import tempfile

from checks import check, finish, run_command

TOOL = os.path.join(sys.argv[1], "bench", "gpu", "prefill_trace.py")


def block(sm, nt, c):
    """One block entering at clock c on SM sm with nt key tiles: fields f0 ..
    f15 (2 GHz: globaltimer = clock / 2); returns (fields, its end)."""
    f = [0] * 16
    f[0] = (nt << 32) | sm
    f[1], f[2] = c, c // 2
    f[3], f[4], f[12], f[5] = c + 400, c + 600, c + 1000, c + 1500
    f[6] = f[5] + 3000  # first tile
    f[7] = f[6] + 3000 * (nt - 1)  # steady tiles of 3000 cycles
    f[11] = f[7]
    f[8] = f[7] + 800  # last P V
    f[13] = f[8] + 700  # the second warpgroup's last P V
    f[9], f[10] = f[8] + 2000, f[13] + 2000  # stores of 2000 each
    return f, f[10]


def lines(rows):
    return "".join(f"{i} " + " ".join(str(x) for x in r) + "\n" for i, r in enumerate(rows))


rows = []
for sm in (0, 1):
    c = 10000
    for nt in (3, 2):
        f, end = block(sm, nt, c)
        rows.append(f)
        c = end + 300  # gap to the next block
rows.append([0] * 16)  # a block with no rows: nothing written

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "t.txt")
    with open(path, "w") as fh:
        fh.write("# blocks 5 tokens 4096 hq 32 hk 8 hd 128 tma 1 variant 3\n" + lines(rows))
    rc, out, err = run_command([sys.executable, TOOL, path])
    check(rc == 0, f"exit 0 (got {rc}: {err})")

    def cycles(name):
        m = re.search(re.escape(name) + r"\s+(\d+)\s+([\d.]+)\s+([\d.]+)%", out)
        return int(m.group(1)) if m else None

    check("4 blocks traced" in out, f"the empty block skipped (got {out})")
    check("clock 2.000 GHz" in out, f"clock from globaltimer / clock64 (got {out})")
    check("steady tile 3000 cycles" in out, f"steady tile (got {out})")
    check(cycles("prologue (entry -> q in place)") == 1000, f"prologue (got {out})")
    check(cycles("first K tile wait (q in place -> K_0 seen)") == 500, f"first K wait (got {out})")
    check(cycles("first tile (no P V overlap)") == 3000, f"first tile (got {out})")
    check(cycles("steady tiles") == 4500, f"steady tiles a block (got {out})")
    check(cycles("last P V") == 800, f"last P V (got {out})")
    check(cycles("store (to the later warpgroup's end)") == 2700, f"store (got {out})")
    check(cycles("gap (block end -> next block's entry)") == 150, f"gap (got {out})")
    check(cycles("SM idle at the launch's start / end") == 0, f"no idle SM (got {out})")
    check("cost a block beyond its key tiles: 1.72 steady tiles" in out, f"cost beyond the tiles (got {out})")
    check("second warpgroup's last P V after the first's: 700 cycles; a store alone: 2000 cycles" in out,
          f"lag and store (got {out})")
    check("entry -> first K/V box issued: 600 cycles" in out, f"first box (got {out})")

    # The first call's 13 numbers a line: q in place = the block barrier (f3).
    old = os.path.join(d, "old.txt")
    with open(old, "w") as fh:
        fh.write(lines([r[:12] for r in rows[:4]]))
    rc, out, err = run_command([sys.executable, TOOL, old])
    check(rc == 0 and cycles("prologue (entry -> q in place)") == 400, f"13-number lines (got {rc}: {out} {err})")
    check(cycles("first K tile wait (q in place -> K_0 seen)") == 1100, f"13-number lines' K wait (got {out})")
    check("second warpgroup" not in out, f"no lag without f13 (got {out})")

    empty = os.path.join(d, "empty.txt")
    with open(empty, "w") as fh:
        fh.write("# nothing\n1 2 3\n")
    rc, _, err = run_command([sys.executable, TOOL, empty])
    check(rc == 1 and "no traced blocks" in err, f"no blocks: exit 1 and why (got {rc}: {err})")
    rc, _, err = run_command([sys.executable, TOOL, os.path.join(d, "missing.txt")])
    check(rc == 1 and "prefill_trace:" in err, f"missing file: exit 1 and why (got {rc}: {err})")
    rc, _, err = run_command([sys.executable, TOOL])
    check(rc == 2, f"no arguments: exit 2 (got {rc}: {err})")

finish()
