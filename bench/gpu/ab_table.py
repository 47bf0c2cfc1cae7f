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
BENCH = re.compile(r"^(?P<tokens>\S+)\s+(?P<dtype>(?:bf16|f16)(?:\+f8)?)\s+(?P<kernel>\S+)\s+"
                   r"(?P<ms>[\d.]+)\s+(?P<tflops>[\d.]+)\s*$")
TTFT = re.compile(r"^TTFT, one (?P<n>\d+)-token prompt: (?P<ms>[\d.]+) ms")
ATTN = re.compile(r"^\s+paged_attention\s+\d+\s+(?P<ms>[\d.]+)\s")
DECODE = re.compile(r"^\s+(?P<ctx>\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+%\s+graph replay: (?P<ms>[\d.]+) ms/step")


def figures(text):
    """(case, value, unit) of one run's output, in the order they appear."""
    out = []
    for line in text.splitlines():
        m = BENCH.match(line)
        if m:
            out.append((f"{m['tokens']} {m['dtype']} {m['kernel']}", float(m["tflops"]), "TFLOP/s"))
            continue
        m = TTFT.match(line)
        if m:
            out.append((f"TTFT({m['n']})", float(m["ms"]), "ms"))
            continue
        m = ATTN.match(line)
        if m:
            out.append(("prompt paged_attention", float(m["ms"]), "ms"))
            continue
        m = DECODE.match(line)
        if m:
            out.append((f"decode {m['ctx']} graph", float(m["ms"]), "ms"))
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
    values = {}  # (tag, case) -> {variant: [values]}
    units = {}
    order = []
    variants = set()
    for name in sorted(runs, key=lambda n: (int(NAME.match(n)["r"]), n)):
        m = NAME.match(name)
        tag, v = m["tag"], m["v"]
        variants.add(v)
        for case, value, unit in figures(runs[name]):
            key = (tag, case)
            if key not in values:
                values[key] = {}
                units[key] = unit
                order.append(key)
            values[key].setdefault(v, []).append(value)
    cols = sorted(variants)
    lines = ["| run | case | unit | " + " | ".join(cols) + " |", "| --- | --- | --- |" + " ---: |" * len(cols)]
    for key in order:
        per = values[key]
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
        lines.append(f"| {key[0]} | {key[1]} | {units[key]} | " + " | ".join(cells) + " |")
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    if not os.path.exists(path):
        sys.exit(f"ab_table.py: no {path}")
    runs = read_runs(path)
    if not runs:
        sys.exit(f"ab_table.py: no TAG_V_rN.txt outputs in {path}")
    print("\n".join(table(runs)))


if __name__ == "__main__":
    main()
