#!/usr/bin/env python3
"""Writes tests/data/loader/smollm2_reference.json from the default model.

The reference is what Hugging Face transformers' GGUF loader produces
(AutoModelForCausalLM.from_pretrained(..., gguf_file=...): dequantises with
the gguf package and undoes llama.cpp's Q/K row permutation): the name and
shape of every parameter, whether lm_head is tied, and a few full rows of
selected weights. osprey's loader must match it.

Requirements (pinned): see requirements.txt next to this script.
Usage: python tests/unit/loader/make_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_MODEL = os.path.expanduser("~/.cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf")

# (tensor, rows): rows chosen to cross head and half-head boundaries
# (head_dim 64: rows 31/32 straddle the half, 63/64 the head).
ROWS = {
    "model.layers.0.self_attn.q_proj.weight": [0, 1, 2, 31, 32, 33, 63, 64, 100, 575],
    "model.layers.0.self_attn.k_proj.weight": [0, 1, 31, 32, 63, 64, 130, 191],
    "model.layers.29.self_attn.k_proj.weight": [0, 1, 32, 191],
    "model.layers.0.self_attn.v_proj.weight": [0, 1, 191],
    "model.layers.0.mlp.down_proj.weight": [0, 575],
    "model.embed_tokens.weight": [0, 1, 49151],
}


def config_summary(cfg):
    """The ModelConfig fields transformers derives from the GGUF metadata."""
    rope = cfg.rope_parameters or {}
    eos = cfg.eos_token_id
    return {
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": rope.get("rope_theta"),
        "rope_type": rope.get("rope_type", "default"),
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": getattr(cfg, "attention_bias", False),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_ids": eos if isinstance(eos, list) else [eos],
    }


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path), dtype=torch.float32)
    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    out = {
        "model": os.path.basename(path),
        "generator": "tests/unit/loader/make_reference.py (transformers from_pretrained gguf_file)",
        "tie_word_embeddings": bool(tied),
        "config": config_summary(model.config),
        "shapes": {name: list(t.shape) for name, t in sorted(tensors.items())},
        "rows": {},
        "vectors": {},
    }
    for name, rows in ROWS.items():
        w = np.asarray(tensors[name], dtype=np.float32)
        out["rows"][name] = {str(r): [float(x) for x in w[r]] for r in rows}
    for name in ["model.layers.0.input_layernorm.weight", "model.norm.weight"]:
        out["vectors"][name] = [float(x) for x in np.asarray(tensors[name], dtype=np.float32)]
    dst = os.path.join(REPO, "tests", "data", "loader", "smollm2_reference.json")
    with open(dst, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", dst, os.path.getsize(dst), "bytes")


if __name__ == "__main__":
    main()
