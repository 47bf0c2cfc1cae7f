#!/usr/bin/env python3
"""Static SASS of a kernel, loop by loop, without a GPU.

usage: sass_loops.py SASS_FILE [--kernel REGEX] [--top N] [--all]

SASS_FILE is what `cuobjdump -sass FILE.cubin` prints (bench/gpu/cuobjdump.sh
fetches cuobjdump from PyPI; compile the .cu with `nvcc -cubin -arch=sm_90a`).
For every function whose (mangled) name matches REGEX, prints its instruction
count and, for each innermost loop (a branch back to an earlier address whose
span holds no other such branch's span; --all: every one, the self-branch
after EXIT excepted), the instructions one pass through it issues, split by
opcode (the N most frequent, default 12). Two builds of a kernel compared this way show
what a source change does to its hot loop (docs/bench.md; docs/PERF.md,
session 24, counted the INT8 decode loop this way). Standard library only.
"""
import argparse
import re
import sys

FUNC_RE = re.compile(r"^\s*Function\s*:\s*(\S+)")
INSTR_RE = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+(.*?)\s*;")
LABEL_RE = re.compile(r"^\s*(\.L_x_\d+):")
# The target after any operands before it (BRA.U !UP0, 0x...; BRA.DIV UR4, `(.L_x_9)).
BRANCH_RE = re.compile(r"\bBRA\b[^`]*?(?:`\((\.L_x_\d+)\)|\b(0x[0-9a-fA-F]+))")


def parse(text):
    """[(name, [(address, text)], {label: address})] in file order."""
    funcs = []
    pending_labels = []
    for line in text.splitlines():
        m = FUNC_RE.match(line)
        if m:
            funcs.append((m.group(1), [], {}))
            pending_labels = []
            continue
        if not funcs:
            continue
        m = LABEL_RE.match(line)
        if m:
            pending_labels.append(m.group(1))
            continue
        m = INSTR_RE.match(line)
        if m:
            addr = int(m.group(1), 16)
            funcs[-1][1].append((addr, m.group(2)))
            for label in pending_labels:
                funcs[-1][2][label] = addr
            pending_labels = []
    return funcs


def opcode(instr):
    words = instr.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def loops(instrs, labels):
    """(first index, last index) of every backward branch's body, innermost first."""
    index = {addr: i for i, (addr, _) in enumerate(instrs)}
    found = []
    for i, (addr, text) in enumerate(instrs):
        m = BRANCH_RE.search(text)
        if not m:
            continue
        target = labels.get(m.group(1)) if m.group(1) else int(m.group(2), 16)
        if target is None or target > addr or target not in index:
            continue
        if index[target] < i:  # not the self-branch that pads the end of a function
            found.append((index[target], i))
    return sorted(set(found), key=lambda r: (r[1] - r[0], r[0]))


def innermost(spans):
    return [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]


def mix(instrs):
    counts = {}
    for _, text in instrs:
        op = opcode(text)
        counts[op] = counts.get(op, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass")
    ap.add_argument("--kernel", default=".", help="regex on the mangled function name")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--all", action="store_true", help="every loop, not only the innermost ones")
    args = ap.parse_args()
    try:
        with open(args.sass, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        print(f"sass_loops: {e}", file=sys.stderr)
        return 1
    try:
        pattern = re.compile(args.kernel)
    except re.error as e:
        print(f"sass_loops: bad --kernel: {e}", file=sys.stderr)
        return 1
    funcs = parse(text)
    if not funcs:
        print(f"sass_loops: {args.sass}: no 'Function :' sections (not cuobjdump -sass output?)", file=sys.stderr)
        return 1
    shown = 0
    for name, instrs, labels in funcs:
        if not pattern.search(name):
            continue
        shown += 1
        print(f"{name}: {len(instrs)} instructions")
        spans = loops(instrs, labels)
        for first, last in spans if args.all else innermost(spans):
            body = instrs[first:last + 1]
            top = ", ".join(f"{op} {n}" for op, n in mix(body)[:args.top])
            print(f"  loop /*{instrs[first][0]:04x}*/../*{instrs[last][0]:04x}*/: {len(body)} instructions a pass: {top}")
    if shown == 0:
        print(f"sass_loops: no function matches {args.kernel!r} ({len(funcs)} in the file)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
