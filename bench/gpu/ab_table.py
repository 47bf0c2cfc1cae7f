#!/usr/bin/env python3
"""The figures of a bench/gpu/ab.sh run as one table: a row per (run tag,
case), a column per variant (A, B, ...), each cell the range over the
rounds and, for the variants after A, the change of their mean against A's.

Reads the run outputs ab.sh leaves (TAG_V_rN.txt, in OUT/ab or packed in
OUT/ab.tgz) and picks, from each:
  - the prefill attention bench (gpu_tests *PrefillAttentionBench*): a row
    per tokens / dtype / kernel, TFLOP/s;
  - model_bench: "TTFT(N) ms", the prompt's "paged_attention ms" line of
    its prefill breakdown, and each batch-1 decode context's ms/step in
    graph replay ("decode C graph ms").
Lines it does not know are left out. Needs the standard library only.

Usage: ab_table.py OUT/ab.tgz | OUT/ab | a folder of TAG_V_rN.txt files
"""
import os
import re
import sys
import tarfile

NAME = re.compile(r"^(?P<tag>.+)_(?P<v>[A-H])_r(?P<r>\d+)\.txt$")
# (pattern, its value in group "v"; the case a match names; the unit)
PATTERNS = [
    (re.compile(r"^(?P<tokens>\S+)\s+(?P<dtype>(?:bf16|f16)(?:\+(?:f8|i8))?)\s+(?P<kernel>\S+)\s+[\d.]+\s+(?P<v>[\d.]+)\s*$"),
     lambda m: f"{m['tokens']} {m['dtype']} {m['kernel']}", "TFLOP/s"),
    (re.compile(r"^TTFT, one (?P<n>\d+)-token prompt: (?P<v>[\d.]+) ms"), lambda m: f"TTFT({m['n']})", "ms"),
    (re.compile(r"^\s+paged_attention\s+\d+\s+(?P<v>[\d.]+)\s"), lambda m: "prompt paged_attention", "ms"),
    (re.compile(r"^\s+(?P<ctx>\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+%\s+graph replay: (?P<v>[\d.]+) ms/step"),
     lambda m: f"decode {m['ctx']} graph", "ms"),
]


def figures(text):
    """(case, value, unit) of one run's output, in the order they appear."""
    out = []
    for line in text.splitlines():
        for pattern, case, unit in PATTERNS:
            m = pattern.match(line)
            if m:
                out.append((case(m), float(m["v"]), unit))
                break
    return out


def read_runs(path):
    """{file name: text} of the TAG_V_rN.txt files at path."""
    runs = {}
    if os.path.isfile(path):
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                name = os.path.basename(member.name)
                if member.isfile() and NAME.match(name):
                    runs[name] = tar.extractfile(member).read().decode("utf-8", "replace")
    else:
        for name in sorted(os.listdir(path)):
            if NAME.match(name):
                with open(os.path.join(path, name), encoding="utf-8", errors="replace") as f:
                    runs[name] = f.read()
    return runs


def fmt(x):
    """x with 1 decimal, or 3 below 10 (a decode step's ms)."""
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def table(runs):
    """Markdown lines: | run | case | unit | A | B ... |."""
    rows = {}  # (tag, case, unit) -> {variant: [values]}, in the order first seen
    variants = set()
    for name in sorted(runs, key=lambda n: (int(NAME.match(n)["r"]), n)):
        m = NAME.match(name)
        variants.add(m["v"])
        for case, value, unit in figures(runs[name]):
            rows.setdefault((m["tag"], case, unit), {}).setdefault(m["v"], []).append(value)
    cols = sorted(variants)
    lines = ["| run | case | unit | " + " | ".join(cols) + " |", "| --- | --- | --- |" + " ---: |" * len(cols)]
    for key, per in rows.items():
        base = per.get("A")
        cells = []
        for v in cols:
            xs = per.get(v)
            if not xs:
                cells.append("")
                continue
            lo, hi = fmt(min(xs)), fmt(max(xs))
            cell = lo if lo == hi else f"{lo}-{hi}"
            if v != "A" and base:
                mean_a = sum(base) / len(base)
                change = (sum(xs) / len(xs) / mean_a - 1.0) * 100.0 if mean_a else 0.0
                cell += f" ({change:+.1f}%)"
            cells.append(cell)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    if not os.path.exists(path):
        sys.exit(f"ab_table.py: no {path}")
    try:
        runs = read_runs(path)
    except (tarfile.TarError, OSError) as e:
        sys.exit(f"ab_table.py: cannot read {path}: {e}")
    if not runs:
        sys.exit(f"ab_table.py: no TAG_V_rN.txt outputs in {path}")
    print("\n".join(table(runs)))


if __name__ == "__main__":
    main()
