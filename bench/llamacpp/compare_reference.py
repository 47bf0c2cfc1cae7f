#!/usr/bin/env python3
"""Compares llama.cpp with the transformers reference of the default model.

For each prompt of tests/model/default_reference.json: whether llama.cpp tokenizes the
rendered text to the same ids, the max |difference| of the last prompt position's
logits, and how many greedy tokens agree before the first difference. llama.cpp
quantises activations (Q8 blocks) in its quantised matmuls, so its logits differ from
the fp32-activation reference by a fraction of a logit; this shows how much.

Usage: .venv-bench/bin/python bench/llamacpp/compare_reference.py [--threads N]
(after bench/llamacpp/setup_venv.sh).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = Path.home() / ".cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("OSPREY_DEFAULT_MODEL", DEFAULT_MODEL)))
    ap.add_argument("--reference", type=Path, default=ROOT / "tests/model/default_reference.json")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    ref = json.loads(args.reference.read_text())
    llm = llama_cpp.Llama(model_path=str(args.model), n_ctx=1024, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)
    n_vocab = llm.n_vocab()
    ref_logits = np.fromfile(args.reference.parent / ref["reference"]["logits_file"], dtype="<f4")
    ref_logits = ref_logits.reshape(-1, n_vocab)

    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()

    rows = []
    for p in ref["prompts"]:
        ids = llm.tokenize(p["text"].encode(), add_bos=False, special=True)
        llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        llm.eval(p["ids"])  # the reference ids, so the logits are comparable even if ids differ
        logits = last_logits()
        diff = float(np.abs(logits - ref_logits[p["last_logits"]["offset"]]).max())
        out = []
        for _ in range(len(p["greedy"])):
            tok = int(np.argmax(logits))
            out.append(tok)
            llm.eval([tok])
            logits = last_logits()
        common = next((i for i, (a, b) in enumerate(zip(out, p["greedy"])) if a != b), len(out))
        rows.append({"name": p["name"], "same_ids": ids == p["ids"],
                     "last_logits_max_abs_diff": round(diff, 4),
                     "greedy_common_prefix": common, "greedy_len": len(out)})
        print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
