#!/usr/bin/env python3
"""Builds a ~1B-parameter random Llama (llama-3.2-1b shapes) and its transformers reference.

The model is too large to commit (2.5 GB), so tests/gpu/run.sh runs this script on the
GPU machine before the tests (OSPREY_GPU_PARITY_1B=generate) and ModelParity1B.Fp32AndBf16
in tests/gpu/model_parity_test.cpp reads the folder it writes:

  --out DIR/config.json, DIR/model.safetensors   (save_pretrained; bfloat16 weights)
  --out DIR/expected.json                        (the tests/fixtures expected.json schema)

Shapes: the bundled llama-3.2-1b config (src/model/builtin_configs.cpp): hidden 2048,
16 layers, 32 q / 8 kv heads x 64, intermediate 8192, vocab 128256, rope theta 5e5 with
llama3 scaling (factor 32, low 1, high 4, original context 8192), rms eps 1e-5, tied
embeddings (no lm_head.weight in the file) -- 1.24e9 parameters.

Weights are stored in bfloat16, as the real checkpoint: the file is half the size (2.5 GB
instead of 4.9 GB, so half the disk, write and load time on the device), osprey's bf16
compute reads the weights it would read from a real checkpoint, and osprey's fp32 mode
(exact_fp32_matmul) upcasts them exactly. The reference is transformers in float32 on the
upcast weights (like tests/fixtures/llama_bf16), on the GPU with eager attention and TF32
off, so it is a float32 computation like osprey's fp32 mode.

Weight init (seeded, on the CPU, so the weights do not depend on the device): linear
weights N(0, (0.9/sqrt(hidden))^2) (0.02 at hidden 2048, transformers' default
initializer_range), norm weights N(1, 0.1^2), embeddings N(0, (2.7/sqrt(hidden))^2): the
final hidden state has rms ~1 after the norm, so logits have a standard deviation of ~2.7
and a largest value ~4.5 standard deviations above it, far from flat; the script prints
the spread and the greedy top-2 margins it got.

Prompts: random ids in 4..127999 of lengths 1, 7, 40 and 300 (--lengths); logits given at the first,
middle and last prompt position (full vocabulary rows; "logits_positions" says which);
32 greedy tokens with a KV cache (and by full recompute: greedy_nocache_agrees) with
their top-2 margins.

--small: the same code path with tiny shapes (hidden 64, 2 layers, 4 q / 2 kv heads x 16,
intermediate 160, vocab 1024) for checking the script and the test on a machine without
a GPU (runs in seconds on the CPU).

Deterministic: fixed seeds; the same torch version gives the same weights on any machine
(generated on the CPU), and the reference is computed with deterministic algorithms.
Usage (device: torch with CUDA and transformers >= 5):
  python3 tests/gpu/make_1b_fixture.py --out /tmp/osprey_parity_1b
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch
import transformers
import sys
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_fixtures import greedy_with_cache, r7  # noqa: E402  (the same greedy loop as the CPU fixtures)

N_GREEDY = 32
PROMPT_LENGTHS = (1, 7, 40, 300)
WEIGHT_SEED = 20261126
PROMPT_SEED = 4321
# Standard deviations, relative to 1/sqrt(hidden) (see the module docstring).
LINEAR_GAIN = 0.9
EMBED_GAIN = 2.7
STD_NORM = 0.1


def llama_32_1b_config(small: bool) -> LlamaConfig:
    shapes = dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
    )
    if small:
        shapes = dict(
            vocab_size=1024,
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        )
    return LlamaConfig(
        **shapes,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=True,
        hidden_act="silu",
        bos_token_id=128000 if not small else 1,
        eos_token_id=[128001, 128008, 128009] if not small else 2,
    )


@torch.no_grad()
def init_weights(model: torch.nn.Module, hidden: int, seed: int) -> None:
    """Seeded CPU draws, rounded to bfloat16 (the stored dtype), copied into the model."""
    gen = torch.Generator().manual_seed(seed)
    std_linear = LINEAR_GAIN / hidden**0.5
    std_embed = EMBED_GAIN / hidden**0.5
    for name, p in sorted(model.named_parameters()):  # tied lm_head is not listed separately
        if name.endswith("norm.weight"):
            vals = torch.randn(p.shape, generator=gen).mul_(STD_NORM).add_(1.0)
        elif "embed_tokens" in name:
            vals = torch.randn(p.shape, generator=gen).mul_(std_embed)
        else:
            vals = torch.randn(p.shape, generator=gen).mul_(std_linear)
        p.copy_(vals.to(torch.bfloat16).to(p.dtype))


def make_prompts(vocab: int, lengths: list[int]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(PROMPT_SEED)
    hi = min(vocab, 128000)  # the real vocabulary's special tokens start at 128000
    return [torch.randint(4, hi, (n,), generator=gen).tolist() for n in lengths]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def greedy_no_cache(model, ids: list[int], n: int, device: torch.device) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([seq], device=device), use_cache=False).logits[0, -1]
        seq.append(int(torch.argmax(logits)))
    return seq[len(ids):]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder to write (replaced if it exists)")
    ap.add_argument("--small", action="store_true", help="tiny shapes, same code path (CPU check)")
    ap.add_argument("--device", default=None, help="reference device (default: cuda if available, else cpu)")
    ap.add_argument(
        "--lengths",
        default=",".join(map(str, PROMPT_LENGTHS)),
        help="prompt lengths (default %(default)s; fewer for a slow full-size run on a CPU)",
    )
    args = ap.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    # A float32 reference: no TF32 anywhere, deterministic kernels (cuBLAS needs a fixed
    # workspace for that; read when its first handle is made).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cpu":
        torch.set_num_threads(1)

    t_start = time.time()
    config = llama_32_1b_config(args.small)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    sync(device)
    t = time.time()
    print(f"built {n_params / 1e9:.3f} B parameters on {device} in {t - t_start:.1f} s", flush=True)
    init_weights(model, config.hidden_size, WEIGHT_SEED)
    sync(device)
    print(f"seeded weights (bf16-rounded) in {time.time() - t:.1f} s", flush=True)

    out_dir = args.out
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    t = time.time()
    # Saved in bfloat16 (the weights are bf16 values already, so the round trip back to
    # float32 is exact); casting the model casts its float buffers too, so they are kept.
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    model.to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="64GB")
    model.to(torch.float32)
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(buffers[k])
    for k, v in model.named_buffers():
        assert v.dtype == buffers[k].dtype and torch.equal(v, buffers[k]), k
    assert next(model.parameters()).dtype == torch.float32
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "bfloat16"  # what the file holds
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    files = sorted(p.name for p in out_dir.iterdir())
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    print(f"saved {files} ({size / 1e9:.2f} GB) in {time.time() - t:.1f} s", flush=True)
    assert "model.safetensors" in files, files

    # The saved config must give the rope the model was built with (both computed on the
    # CPU: a GPU's pow may differ in the last bit).
    reloaded = AutoConfig.from_pretrained(out_dir)
    rope_type = type(model.model.rotary_emb)
    assert torch.equal(rope_type(reloaded).inv_freq, rope_type(config).inv_freq), "rope from the saved config differs"
    inv_freq = model.model.rotary_emb.inv_freq
    assert reloaded.tie_word_embeddings and reloaded.head_dim == config.head_dim

    prompts = []
    spread = []
    lengths = [int(x) for x in args.lengths.split(",")]
    assert lengths and all(n > 0 for n in lengths), args.lengths
    for ids in make_prompts(config.vocab_size, lengths):
        t = time.time()
        n = len(ids)
        positions = sorted({0, n // 2, n - 1})
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=device), use_cache=False).logits[0].float()
        rows = logits[positions].cpu()
        spread.append((float(rows.std(dim=-1).mean()), float(rows.abs().max())))
        greedy, margins, max_abs = greedy_with_cache(model, ids, N_GREEDY, device)
        nocache = greedy_no_cache(model, ids, N_GREEDY, device)
        sync(device)
        prompts.append(
            {
                "ids": ids,
                "logits_positions": positions,
                "logits": [[r7(v) for v in row] for row in rows.tolist()],
                "greedy": greedy,
                "greedy_margins": margins,
                "greedy_logits_max_abs": r7(max_abs),
                "greedy_nocache_agrees": greedy == nocache,
            }
        )
        small_margins = sum(1 for m in margins if m < 1e-2 * max_abs)
        print(
            f"prompt of {n}: {time.time() - t:.1f} s; logits std {spread[-1][0]:.2f}, max |logit| "
            f"{spread[-1][1]:.2f}; greedy distinct {len(set(greedy))}/{N_GREEDY}, min margin {min(margins):.4g} "
            f"({min(margins) / max_abs:.3g} of max |logit| {max_abs:.2f}), {small_margins} margins under 1% of it; "
            f"nocache agrees {greedy == nocache}",
            flush=True,
        )

    reference = {
        "library": f"transformers {transformers.__version__}, torch {torch.__version__}",
        "device": str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu",
        "compute_dtype": "float32",
        "tf32": False,
        "attn_implementation": "eager",
        "greedy": "argmax of the last position's logits; prefill the prompt, then one token "
        "per forward with a DynamicCache; no eos stop",
        "logits_rounding": "7 significant digits",
        "rope_inv_freq": [r7(v) for v in inv_freq.tolist()],
        "init": {
            "seed": WEIGHT_SEED,
            "std_linear": LINEAR_GAIN / config.hidden_size**0.5,
            "std_embed": EMBED_GAIN / config.hidden_size**0.5,
            "norm": f"N(1, {STD_NORM}^2)",
            "rounded_to": "bfloat16",
        },
    }
    expected = {
        "case": "llama_3_2_1b_random_small" if args.small else "llama_3_2_1b_random",
        "description": "random Llama with llama-3.2-1b shapes"
        + (" (--small: tiny shapes)" if args.small else "")
        + "; bfloat16 weights, reference in float32 from the upcast weights",
        "weights_dtype": "bfloat16",
        "files": files,
        "reference": reference,
        "prompts": prompts,
        "config_used": model.config.to_dict(),
    }
    with open(out_dir / "expected.json", "w") as f:
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    print(f"wrote {out_dir} ({size / 1e9:.2f} GB) in {time.time() - t_start:.1f} s total", flush=True)


if __name__ == "__main__":
    main()
