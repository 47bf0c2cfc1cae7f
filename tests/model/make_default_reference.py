#!/usr/bin/env python3
"""Reference outputs of the default model (SmolLM2-135M-Instruct Q4_1 GGUF) for parity tests.

Loads the GGUF with transformers (AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)
dequantises every tensor to float32), float32 compute, eager attention, CPU; the
tokenizer comes from the same GGUF (AutoTokenizer ..., gguf_file=...).

Writes
  tests/model/default_reference.json
    {"model": {...file, size, sha256...}, "reference": {...how...},
     "prompts": [
       {"name", "kind": "text"|"chat", "messages" (chat only), "text": the rendered text,
        "ids": prompt ids (no BOS: the GGUF says add_bos_token = false),
        "greedy": 64 new ids (plain greedy, eos does not stop),
        "first_eos_index": index into greedy of the first eos (<|im_end|>) or null,
        "greedy_text": decoded greedy up to (excluding) the first eos,
        "greedy_margins": top1 - top2 logit at each step,
        "greedy_top1_logits": the winning logit at each step,
        "last_logits": {"offset": row index in the .f32 file, "top10": [[id, logit], ...],
                        "max": ..., "min": ..., "mean": ..., "std": ...}}]}
  tests/model/default_reference_logits.f32
    raw little-endian float32, shape [n_prompts, vocab]: the full logits of each
    prompt's last position (row i = prompts[i].last_logits.offset).

Requirements: tests/fixtures/requirements-ref.txt (scripts/setup_ref_venv.sh).
Usage: .venv-ref/bin/python tests/model/make_default_reference.py [--model PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = Path.home() / ".cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf"
N_NEW = 64

LONG_PARAGRAPH = (
    "The osprey is a large bird of prey that lives on every continent except Antarctica. "
    "It feeds almost entirely on fish, which it catches by hovering above the water, "
    "folding its wings and plunging feet first into the surface. Its outer toe is "
    "reversible, so it can grip a slippery fish with two toes in front and two behind, "
    "and backward-facing scales on its feet help it hold on. After a successful dive the "
    "bird shakes off the water in mid-air and turns the fish head first to reduce drag on "
    "the flight back to its perch. Ospreys build large nests of sticks on dead trees, "
    "cliffs, channel markers and power poles, and pairs often return to the same nest for "
    "many years, adding new material each spring until the structure weighs hundreds of "
    "kilograms. Populations declined sharply in the middle of the twentieth century because "
    "pesticides thinned their eggshells, but after those chemicals were banned the species "
    "recovered, and today it is a common sight along coasts, lakes and rivers. In the "
    "autumn most northern ospreys migrate thousands of kilometres to spend the winter in"
)

PROMPTS = [
    {"name": "capital", "kind": "text", "text": "The capital of France is"},
    {
        "name": "code",
        "kind": "text",
        "text": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n',
    },
    {"name": "paragraph", "kind": "text", "text": LONG_PARAGRAPH},
    {
        "name": "chat_system_user",
        "kind": "chat",
        "messages": [
            {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
            {"role": "user", "content": "What is the boiling point of water at sea level?"},
        ],
    },
    {
        "name": "chat_user",
        "kind": "chat",
        "messages": [{"role": "user", "content": "Write a haiku about the sea."}],
    },
    {
        "name": "chat_two_turns",
        "kind": "chat",
        "messages": [
            {"role": "user", "content": "My name is Ada. What is 2 + 3?"},
            {"role": "assistant", "content": "2 + 3 = 5."},
            {"role": "user", "content": "Thanks! And what is my name?"},
        ],
    },
]


def dumps(doc) -> str:
    """Indented JSON with lists of numbers kept on one line."""
    text = json.dumps(doc, ensure_ascii=False, indent=1)
    return re.sub(r"\[[-0-9.eE,\s]*\]", lambda m: re.sub(r"\s+", "", m.group(0)).replace(",", ", "), text)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def r7(x: float) -> float:
    return float(f"{x:.7g}")


@torch.no_grad()
def greedy(model, ids: list[int], n: int):
    """Plain greedy with a KV cache; returns (last prompt logits, tokens, margins, top1)."""
    cache = DynamicCache(config=model.config)
    out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    logits = out.logits[0, -1].float()
    prompt_logits = logits.clone()
    tokens, margins, top1 = [], [], []
    for step in range(n):
        top = torch.topk(logits, 2)
        tok = int(top.indices[0])
        tokens.append(tok)
        margins.append(r7(float(top.values[0] - top.values[1])))
        top1.append(r7(float(top.values[0])))
        if step + 1 == n:
            break
        out = model(torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
        logits = out.logits[0, -1].float()
    return prompt_logits, tokens, margins, top1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("OSPREY_DEFAULT_MODEL", DEFAULT_MODEL)))
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check-generate", action="store_true",
                    help="also run model.generate() and assert it equals the cached greedy loop "
                    "(doubles the run time)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()

    model_dir, model_file = args.model.parent, args.model.name
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=model_file, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    t_loaded = time.time()
    print(f"loaded in {t_loaded - t_start:.1f} s; config: vocab {model.config.vocab_size}, "
          f"tie {model.config.tie_word_embeddings}, rope {model.config.rope_parameters}")
    gc = model.generation_config
    print("generation_config defaults (overridden to plain greedy, no eos stop):",
          {k: getattr(gc, k, None) for k in ("do_sample", "temperature", "top_p", "top_k",
                                             "repetition_penalty", "bos_token_id", "eos_token_id",
                                             "pad_token_id", "max_length")})
    eos_id = tok.eos_token_id
    vocab = model.config.vocab_size

    rows, entries = [], []
    for i, p in enumerate(PROMPTS):
        t0 = time.time()
        entry = {"name": p["name"], "kind": p["kind"]}
        if p["kind"] == "chat":
            entry["messages"] = p["messages"]
            text = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=False)
        else:
            text = p["text"]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        # The GGUF says add_bos_token = false: the default encoding must agree.
        assert tok(text)["input_ids"] == ids, "tokenizer adds special tokens by default"
        logits, new, margins, top1 = greedy(model, ids, N_NEW)

        if args.check_generate:
            # The cached loop must equal transformers' own generate with plain greedy.
            gen = model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, temperature=None,
                top_p=None, top_k=None, repetition_penalty=1.0, eos_token_id=None,
                pad_token_id=eos_id,
            )[0, len(ids):].tolist()
            assert gen == new, f"{p['name']}: generate() {gen} != cached greedy loop {new}"

        first_eos = new.index(eos_id) if eos_id in new else None
        top10 = torch.topk(logits, 10)
        entry.update(
            {
                "text": text,
                "ids": ids,
                "greedy": new,
                "first_eos_index": first_eos,
                "greedy_text": tok.decode(new[:first_eos] if first_eos is not None else new),
                "greedy_margins": margins,
                "greedy_top1_logits": top1,
                "last_logits": {
                    "offset": i,
                    "top10": [[int(a), r7(float(b))] for a, b in zip(top10.indices, top10.values)],
                    "max": r7(float(logits.max())),
                    "min": r7(float(logits.min())),
                    "mean": r7(float(logits.mean())),
                    "std": r7(float(logits.std())),
                },
            }
        )
        rows.append(logits.numpy().astype("<f4"))
        entries.append(entry)
        print(f"[{p['name']}] {len(ids)} prompt tokens, {time.time() - t0:.1f} s, min margin "
              f"{min(margins):.4f}, eos at {first_eos}: {entry['greedy_text'][:70]!r}")

    assert all(r.shape == (vocab,) for r in rows)
    bin_path = args.out / "default_reference_logits.f32"
    np.stack(rows).astype("<f4").tofile(bin_path)
    doc = {
        "model": {
            "file": model_file,
            "bytes": args.model.stat().st_size,
            "sha256": sha256(args.model),
        },
        "reference": {
            "library": f"transformers {transformers.__version__}, torch {torch.__version__}",
            "loader": "AutoModelForCausalLM / AutoTokenizer .from_pretrained(dir, gguf_file=...)",
            "device": "cpu",
            "compute_dtype": "float32 (weights dequantised from Q4_1 / Q8_0 by gguf-py)",
            "attn_implementation": "eager",
            "decoding": f"plain greedy (argmax), {N_NEW} new tokens, eos does not stop, no "
            "repetition penalty; prefill then one token per forward with a DynamicCache",
            "checked_against_generate": args.check_generate,
            "chat_rendering": "tokenizer.apply_chat_template(messages, add_generation_prompt=True) "
            "with the GGUF's tokenizer.chat_template",
            "ids": "tokenizer(text, add_special_tokens=False); no BOS (GGUF add_bos_token = false)",
            "logits_file": bin_path.name,
            "logits_layout": f"little-endian float32 [{len(rows)}, {vocab}], last prompt position",
            "eos_token_id": eos_id,
            "seconds": None,
        },
        "prompts": entries,
    }
    doc["reference"]["seconds"] = round(time.time() - t_start, 1)
    json_path = args.out / "default_reference.json"
    json_path.write_text(dumps(doc) + "\n")
    assert json.loads(json_path.read_text()) == doc
    print(f"wrote {json_path} ({json_path.stat().st_size / 1024:.0f} KiB) and {bin_path} "
          f"({bin_path.stat().st_size / 1024:.0f} KiB); load {t_loaded - t_start:.1f} s, "
          f"total {time.time() - t_start:.1f} s")


if __name__ == "__main__":
    main()
