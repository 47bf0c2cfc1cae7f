#!/usr/bin/env python3
"""Reference perplexity of the default model (SmolLM2-135M-Instruct Q4_1 GGUF) over
tests/model/perplexity_text.txt, for `osprey perplexity` (tests/cli/perplexity_cli_test.py).

transformers loads the GGUF (weights dequantised to float32 by gguf-py), float32
compute, eager attention, CPU. The text is tokenized without special tokens (the GGUF
says add_bos_token = false, so windows have no prefix) and cut into windows of CTX
tokens that do not overlap; only whole windows count. In each window the tokens at
positions SCORE_FROM .. CTX - 1 are scored: nll = -log softmax(logits[p - 1])[token p],
with the window alone as context (one forward per window), which is what the tool does.

Writes tests/model/perplexity_reference.json:
  {"model": {...}, "reference": {...}, "ctx", "score_from", "windows", "text_tokens",
   "token": [scored ids], "nll": [per scored token], "top1": [argmax at each],
   "margin": [top1 - top2 logit at each, to judge near ties], "ppl", "mean_nll"}

Requirements: tests/fixtures/requirements-ref.txt (scripts/setup_ref_venv.sh).
Usage: .venv-ref/bin/python tests/model/make_perplexity_reference.py [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from make_default_reference import DEFAULT_MODEL, sha256  # the same model file and checksum

HERE = Path(__file__).resolve().parent
CTX = 128
SCORE_FROM = 64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("OSPREY_DEFAULT_MODEL", DEFAULT_MODEL)))
    ap.add_argument("--text", type=Path, default=HERE / "perplexity_text.txt")
    ap.add_argument("--out", type=Path, default=HERE / "perplexity_reference.json")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()

    model_dir, model_file = args.model.parent, args.model.name
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=model_file, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    text = args.text.read_text(encoding="utf-8")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok("x")["input_ids"] == tok("x", add_special_tokens=False)["input_ids"], "tokenizer adds a prefix"
    windows = len(ids) // CTX
    assert windows >= 2, f"{len(ids)} tokens: too few for two windows of {CTX}"

    token, nll, top1, margin = [], [], [], []
    with torch.no_grad():
        for w in range(windows):
            win = ids[w * CTX:(w + 1) * CTX]
            logits = model(torch.tensor([win])).logits[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            for p in range(SCORE_FROM, CTX):
                row = logits[p - 1]
                top = torch.topk(row, 2)
                token.append(win[p])
                nll.append(-float(logp[p - 1, win[p]]))
                top1.append(int(top.indices[0]))
                margin.append(float(top.values[0] - top.values[1]))
    mean_nll = sum(nll) / len(nll)
    doc = {
        "model": {"file": model_file, "bytes": args.model.stat().st_size, "sha256": sha256(args.model)},
        "reference": {
            "library": f"transformers {transformers.__version__}, torch {torch.__version__}",
            "loader": "AutoModelForCausalLM / AutoTokenizer .from_pretrained(dir, gguf_file=...)",
            "device": "cpu",
            "compute_dtype": "float32 (log-softmax in float64)",
            "attn_implementation": "eager",
            "text": args.text.name,
            "windows": "tokenizer(text, add_special_tokens=False) cut into whole windows of ctx tokens, "
            "no prefix; one forward per window",
            "seconds": round(time.time() - t_start, 1),
        },
        "ctx": CTX,
        "score_from": SCORE_FROM,
        "windows": windows,
        "text_tokens": len(ids),
        "ppl": math.exp(mean_nll),
        "mean_nll": mean_nll,
        "token": token,
        "nll": [float(f"{x:.9g}") for x in nll],
        "top1": top1,
        "margin": [float(f"{x:.6g}") for x in margin],
    }
    args.out.write_text(json.dumps(doc) + "\n")
    print(f"{len(ids)} tokens, {windows} windows of {CTX}, {len(nll)} scored: ppl {doc['ppl']:.6f}, "
          f"top-1 {sum(a == b for a, b in zip(top1, token)) / len(token):.4f}, min margin {min(margin):.5f}; "
          f"wrote {args.out} in {time.time() - t_start:.1f} s")


if __name__ == "__main__":
    main()
