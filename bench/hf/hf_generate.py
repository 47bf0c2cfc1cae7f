#!/usr/bin/env python3
"""Hugging Face transformers `generate` on a GPU, the peer for issue 7/8.

Builds a model of a bundled osprey shape with random bf16 weights (no weight
files; transformers' own initialisation), then times greedy generation of a
batch of random-token prompts with a fixed output length (min_new_tokens =
max_new_tokens, so EOS cannot end it early). Prints one JSON line.

Usage: hf_generate.py --model llama-3-8b --batch 128 --input-len 512 --output-len 256
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CONFIGS = {
    # Shapes as in src/model/builtin_configs.cpp.
    "llama-3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                       rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3-8b", choices=sorted(CONFIGS))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager)")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    cfg = LlamaConfig(**CONFIGS[a.model], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    t0 = time.time()
    with torch.device("cuda"):
        model = LlamaForCausalLM._from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation=a.attn)
    model.eval()
    load_s = time.time() - t0
    ids = torch.randint(3, cfg.vocab_size, (a.batch, a.input_len), device="cuda")
    mask = torch.ones_like(ids)
    gen = dict(max_new_tokens=a.output_len, min_new_tokens=a.output_len, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(input_ids=ids[:, :16], attention_mask=mask[:, :16], max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)  # warm-up
        torch.cuda.synchronize()
        t0 = time.time()
        out = model.generate(input_ids=ids, attention_mask=mask, **gen)
        torch.cuda.synchronize()
        dt = time.time() - t0
    new_tokens = (out.shape[1] - a.input_len) * a.batch
    print(json.dumps({
        "engine": "transformers", "transformers": __import__("transformers").__version__, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(), "model": a.model, "dtype": "bfloat16", "attn": a.attn,
        "batch": a.batch, "input_len": a.input_len, "output_len": a.output_len, "load_s": round(load_s, 2),
        "seconds": round(dt, 3), "output_tokens": new_tokens, "output_tok_s": round(new_tokens / dt, 1),
        "total_tok_s": round((new_tokens + a.batch * a.input_len) / dt, 1),
    }))


if __name__ == "__main__":
    main()
