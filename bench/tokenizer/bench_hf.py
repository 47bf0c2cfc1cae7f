#!/usr/bin/env python3
"""Single-thread encode throughput of Hugging Face `tokenizers` on the
benchmark text (documents separated by "\\n\\0DOC\\0\\n"), for comparison with
bench_tokenizer (same documents, same tokenizer.json files).

Usage: TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 \
       python bench/tokenizer/bench_hf.py TEXT.txt NAME=path/to/tokenizer.json ...
Prints, per tokenizer: MB/s (best of 3 passes), token count and an FNV-1a
hash of all ids, which bench_tokenizer prints too (equal hash = equal ids).
"""
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
from tokenizers import Tokenizer  # noqa: E402


def fnv(ids):
    h = 1469598103934665603
    for i in ids:
        h ^= i & 0xFFFFFFFF
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    text = open(sys.argv[1], encoding="utf-8", newline="").read()
    docs = text.split("\n\x00DOC\x00\n")
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    for spec in sys.argv[2:]:
        name, path = spec.split("=", 1)
        tok = Tokenizer.from_file(path)
        best = float("inf")
        all_ids = []
        for _ in range(3):
            t0 = time.perf_counter()
            all_ids = [tok.encode(d, add_special_tokens=False).ids for d in docs]
            best = min(best, time.perf_counter() - t0)
        flat = [i for ids in all_ids for i in ids]
        print(f"hf_tokenizers {name}: {nbytes / best / 1e6:.2f} MB/s, {len(flat)} tokens, hash {fnv(flat):016x}")


if __name__ == "__main__":
    main()
