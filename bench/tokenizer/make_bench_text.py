#!/usr/bin/env python3
"""Builds a few MB of mixed text for the tokenizer benchmark, deterministically,
from files present on any machine with the reference venv: Python standard
library sources (code), license texts (English prose), and the multilingual
conformance corpus (tests/tokenizer/corpus.py), interleaved in ~4 KB documents.

Usage: python bench/tokenizer/make_bench_text.py OUT.txt [MEGABYTES=4]
"""
import glob
import os
import random
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "tokenizer"))
from corpus import CORPUS  # noqa: E402


def main():
    out = sys.argv[1]
    target = int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 4_000_000
    stdlib = sysconfig.get_paths()["stdlib"]
    code = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    prose = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob(os.path.join(stdlib, "*.txt")))
    rng = random.Random(7)
    docs = []
    for p in code + prose:
        try:
            with open(p, encoding="utf-8") as f:
                docs.append(f.read())
        except (UnicodeDecodeError, IsADirectoryError, PermissionError):
            pass
    multi = "\n".join(t for t in CORPUS if t.strip())
    parts, size = [], 0
    while size < target:
        d = rng.choice(docs)
        start = rng.randrange(max(1, len(d) - 4000))
        chunk = d[start:start + 4000]
        if rng.random() < 0.25:
            chunk += "\n" + multi
        parts.append(chunk)
        size += len(chunk.encode("utf-8"))
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write("\n\x00DOC\x00\n".join(parts))
    print(f"{out}: {size} bytes in {len(parts)} documents")


if __name__ == "__main__":
    main()
