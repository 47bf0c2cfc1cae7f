#!/usr/bin/env python3
"""Writes a GGUF with Llama-architecture shapes and random weights, for timing llama.cpp.

The weights are random numbers, not a model: the file exists so that llama.cpp's
llama-bench / llama-batched-bench run the same matrix shapes as osprey's
`llama-3-8b` builtin config (src/model/builtin_configs.cpp) without a 16 GB
download. Timing does not depend on the values; the values are kept small
(normal, std 0.02) so that activations stay finite, as in a trained model.

Fast by construction: one random 16 MiB block is generated once and written
over and over for every matrix (gguf-py's GGUFWriter writes the header,
key/values and tensor infos; the data is streamed after them, aligned as the
writer would align it), so memory stays small and the disk sets the pace.
The vocabulary is llama.cpp's "no_vocab" tokenizer with `llama.vocab_size` set:
the benches feed random token ids, so no tokenizer is needed, and the embedding
and output matrices keep the real shape [vocab, hidden].

Usage: make_dummy_gguf.py OUT.gguf [--dtype bf16|f16] [--preset llama-3-8b|tiny]
       [--layers N --hidden N --ffn N --heads N --kv-heads N --vocab N]
gguf-py is imported from $GGUF_PY (a gguf-py folder, e.g. the one inside
llama.cpp's sources) when set, else from the installed `gguf` package.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

PRESETS = {
    # Shapes of Meta-Llama-3-8B (config.json), as in osprey's builtin_configs.cpp.
    "llama-3-8b": dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256,
                       ctx=8192, rope_theta=500000.0, rms_eps=1e-5),
    # A few-MB model for checking the pipeline on a CPU (same vocab size, so the
    # embedding/output path is the real one).
    "tiny": dict(layers=2, hidden=256, ffn=768, heads=4, kv_heads=2, vocab=128256,
                 ctx=8192, rope_theta=500000.0, rms_eps=1e-5),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    p.add_argument("--preset", choices=sorted(PRESETS), default="llama-3-8b")
    for key in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "ctx"):
        p.add_argument("--" + key.replace("_", "-"), type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    gguf_py = os.environ.get("GGUF_PY")
    if gguf_py:
        sys.path.insert(0, gguf_py)
    import numpy as np
    import gguf

    cfg = dict(PRESETS[args.preset])
    for key in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "ctx"):
        val = getattr(args, key)
        if val is not None:
            cfg[key] = val
    if cfg["hidden"] % cfg["heads"] or cfg["heads"] % cfg["kv_heads"]:
        print("hidden must divide by heads, heads by kv-heads", file=sys.stderr)
        return 2
    head_dim = cfg["hidden"] // cfg["heads"]
    kv_dim = head_dim * cfg["kv_heads"]
    h, f, v = cfg["hidden"], cfg["ffn"], cfg["vocab"]

    t0 = time.time()
    if args.dtype == "bf16":
        qtype, ftype = gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16
    else:
        qtype, ftype = gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16

    # (name, numpy shape [rows=out, cols=in]; GGUF stores it reversed as ggml ne).
    mats: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (v, h))]
    norms: list[str] = []
    for i in range(cfg["layers"]):
        b = f"blk.{i}."
        norms += [b + "attn_norm.weight", b + "ffn_norm.weight"]
        mats += [(b + "attn_q.weight", (h, h)), (b + "attn_k.weight", (kv_dim, h)),
                 (b + "attn_v.weight", (kv_dim, h)), (b + "attn_output.weight", (h, h)),
                 (b + "ffn_gate.weight", (f, h)), (b + "ffn_up.weight", (f, h)),
                 (b + "ffn_down.weight", (h, f))]
    norms.append("output_norm.weight")
    mats.append(("output.weight", (v, h)))

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name(f"osprey-dummy-{args.preset}-{args.dtype}")
    w.add_vocab_size(v)
    w.add_context_length(cfg["ctx"])
    w.add_embedding_length(h)
    w.add_block_count(cfg["layers"])
    w.add_feed_forward_length(f)
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv_heads"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_eps"])
    w.add_file_type(ftype)
    w.add_tokenizer_model("no_vocab")

    # Tensor order in the file: embedding, per layer (norms then matrices), output.
    order: list[tuple[str, tuple[int, ...], bool]] = [(mats[0][0], mats[0][1], False)]
    mi = 1
    for i in range(cfg["layers"]):
        order.append((f"blk.{i}.attn_norm.weight", (h,), True))
        order.append((f"blk.{i}.ffn_norm.weight", (h,), True))
        for _ in range(7):
            order.append((mats[mi][0], mats[mi][1], False))
            mi += 1
    order.append(("output_norm.weight", (h,), True))
    order.append((mats[mi][0], mats[mi][1], False))
    assert mi == len(mats) - 1 and len(norms) == 2 * cfg["layers"] + 1

    for name, shape, is_norm in order:
        n = int(np.prod(shape))
        if is_norm:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * n)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.uint16), 2 * n, raw_dtype=qtype)

    # One random 16 MiB block of 16-bit values, written over and over (the values
    # repeat; timing does not see them): no tensor-sized buffer is ever built.
    rng = np.random.default_rng(args.seed)
    block = rng.standard_normal(1 << 23, dtype=np.float32) * np.float32(0.02)
    if args.dtype == "bf16":
        # round-to-nearest-even of the top 16 bits
        bits = block.view(np.uint32)
        bits16 = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    else:
        bits16 = block.astype(np.float16).view(np.uint16)
    ones = np.ones(h, dtype=np.float32)
    t1 = time.time()

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # Tensor data by hand, in the order of the infos, each at the writer's
    # alignment (what GGUFWriter.write_tensor_data does, without needing the
    # whole tensor in memory).
    fout = w.fout[0]
    align = w.data_alignment
    total = 0

    def pad() -> None:
        fout.write(b"\0" * (-fout.tell() % align))

    for name, shape, is_norm in order:
        pad()
        if is_norm:
            ones.tofile(fout)
            total += ones.nbytes
            continue
        left = int(np.prod(shape))
        total += 2 * left
        while left > 0:
            k = min(left, bits16.size)
            bits16[:k].tofile(fout)
            left -= k
    pad()
    w.close()
    t2 = time.time()
    print(f'{{"gguf": "{args.out}", "preset": "{args.preset}", "dtype": "{args.dtype}", '
          f'"tensors": {len(order)}, "bytes": {total}, "prep_s": {t1 - t0:.2f}, "write_s": {t2 - t1:.2f}}}')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
