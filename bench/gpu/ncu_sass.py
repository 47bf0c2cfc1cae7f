#!/usr/bin/env python3
"""Summarises one kernel's per-instruction Nsight Compute source counters.

usage: ncu_sass.py SOURCE_CSV [--top N] [--list]

SOURCE_CSV is what `ncu --import REPORT.ncu-rep --page source --csv
--print-source sass` prints for a report taken with `--set full
--import-source yes` (docs/bench.md). Prints
  - the executed warp instructions and the warp-state samples by SASS opcode
    (share of each), so that the instruction mix and where the warps wait
    can be set side by side;
  - the N instructions with the most samples, with their stall reasons;
  - the runs of consecutive instructions executed the same number of times
    (a loop body, a prologue), with their share of the instructions and of
    the samples, and how many instructions one pass through them issues.
--list prints every instruction: index, times executed, samples, SASS.
"""
import collections
import csv
import re
import sys


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # Line 1 names the kernel; line 2 is the header.
    start = next((i for i, r in enumerate(rows) if "Source" in r and "Address" in r), None)
    if start is None:
        return None
    header = rows[start]
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[start + 1:]:
        if len(r) < len(header):
            continue
        src = r[col["Source"]].strip()
        executed = int(r[col["Instructions Executed"]] or 0)
        samples = int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        reasons = {h[len("stall_"):]: int(r[col[h]]) for h in stalls if r[col[h]] not in ("", "0")}
        out.append((src, executed, samples, reasons))
    return out


def opcode(src):
    return re.sub(r"^@!?U?P\w+\s+", "", src).split(" ")[0]


def main() -> int:
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    top = 20
    if "--top" in args:
        top = int(args[args.index("--top") + 1])
    insts = load(args[0])
    if insts is None:
        print(f"{args[0]}: not an ncu source page (no Address / Source header; see --page source --csv)",
              file=sys.stderr)
        return 2
    total_exec = sum(i[1] for i in insts) or 1
    total_samples = sum(i[2] for i in insts) or 1
    print(f"{len(insts)} instructions, {total_exec} warp instructions executed, {total_samples} samples")

    by_op_exec = collections.Counter()
    by_op_samples = collections.Counter()
    for src, executed, samples, _ in insts:
        by_op_exec[opcode(src)] += executed
        by_op_samples[opcode(src)] += samples
    print("\nopcode                          executed  samples")
    for op, n in by_op_exec.most_common(25):
        print(f"{op:30s} {n / total_exec * 100:8.1f}% {by_op_samples[op] / total_samples * 100:7.1f}%")

    print(f"\ntop {top} instructions by samples (index, executed, samples, reasons)")
    order = sorted(range(len(insts)), key=lambda k: -insts[k][2])[:top]
    for k in order:
        src, executed, samples, reasons = insts[k]
        main_reasons = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items(), key=lambda x: -x[1])[:3])
        print(f"{k:6d} {executed:10d} {samples:7d}  {src[:60]:60s} {main_reasons}")

    print("\nruns executed alike (first, last, instructions, executed share, sample share, per pass)")
    runs = []
    first = 0
    for k in range(1, len(insts) + 1):
        if k == len(insts) or insts[k][1] != insts[first][1]:
            runs.append((first, k - 1))
            first = k
    for a, b in runs:
        executed = sum(i[1] for i in insts[a:b + 1])
        samples = sum(i[2] for i in insts[a:b + 1])
        if executed / total_exec < 0.01 and samples / total_samples < 0.01:
            continue
        passes = insts[a][1]
        print(f"{a:6d} {b:6d} {b - a + 1:5d} {executed / total_exec * 100:7.1f}% {samples / total_samples * 100:7.1f}%"
              f"  {passes} passes")

    if "--list" in args:
        print()
        for k, (src, executed, samples, _) in enumerate(insts):
            print(f"{k:6d} {executed:10d} {samples:7d}  {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
