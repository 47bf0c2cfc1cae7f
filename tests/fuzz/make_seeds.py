#!/usr/bin/env python3
"""Writes the seed corpora tests/fuzz/corpus/{gguf,safetensors}/ (stdlib only)."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors, alignment=32, version=3):
    """kvs: list of (key, type, payload bytes); tensors: (name, ne, ggml type, data)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, payload in kvs:
        out += gguf_string(key) + struct.pack("<I", t) + payload
    offset, offsets = 0, []
    for name, ne, t, data in tensors:
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", t, offset)
        offsets.append(offset)
        offset += (len(data) + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    start = len(out)
    for off, (_, _, _, data) in zip(offsets, tensors):
        out += b"\0" * (start + off - len(out)) + data
    return out + b"\0" * (-len(out) % alignment)


def u32(x):
    return struct.pack("<I", x)


def str_array(items):
    return u32(8) + struct.pack("<Q", len(items)) + b"".join(gguf_string(s) for s in items)


def write(sub, name, data):
    d = os.path.join(HERE, "corpus", sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    kvs = [
        ("general.architecture", 8, gguf_string("llama")),
        ("llama.block_count", 4, u32(1)),
        ("llama.attention.head_count", 4, u32(2)),
        ("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
        ("tokenizer.ggml.tokens", 9, str_array(["<s>", "a", "\u0120b"])),
        ("tokenizer.ggml.token_type", 9, u32(5) + struct.pack("<Q", 3) + struct.pack("<3i", 3, 1, 1)),
        ("tokenizer.ggml.add_bos_token", 7, b"\x01"),
        ("general.alignment", 4, u32(32)),
    ]
    tensors = [
        ("token_embd.weight", [32, 3], 8, bytes(range(102))),
        ("blk.0.attn_norm.weight", [4], 0, struct.pack("<4f", 1, 2, 3, 4)),
        ("blk.0.attn_q.weight", [32, 4], 3, bytes(range(80))),
        ("blk.0.attn_k.weight", [32, 2], 2, bytes(36)),
        ("blk.0.ffn_up.weight", [8, 2], 1, bytes(32)),
        ("blk.0.ffn_down.weight", [8, 2], 30, bytes(32)),
    ]
    write("gguf", "llama_tiny.gguf", gguf(kvs, tensors))
    write("gguf", "metadata_only.gguf", gguf(kvs[:3], []))
    write("gguf", "v2_align64.gguf", gguf([("general.alignment", 4, u32(64))], tensors[1:3], alignment=64, version=2))
    many = [("k%d" % i, t, p) for i, (t, p) in enumerate(
        [(0, b"\x01"), (1, b"\xff"), (2, b"\x01\x02"), (3, b"\xfe\xff"), (5, u32(7)), (10, struct.pack("<Q", 9)),
         (11, struct.pack("<q", -9)), (12, struct.pack("<d", 0.5)),
         (9, u32(6) + struct.pack("<Q", 2) + struct.pack("<2f", 1, 2))])]
    write("gguf", "all_types.gguf", gguf(many, []))

    def st(tensors, metadata=None):
        header, data = {}, b""
        if metadata:
            header["__metadata__"] = metadata
        for name, dtype, shape, payload in tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
            data += payload
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        return struct.pack("<Q", len(h)) + h + data

    write("safetensors", "mixed.safetensors", st([
        ("model.norm.weight", "F32", [4], struct.pack("<4f", 1, 2, 3, 4)),
        ("lm_head.weight", "BF16", [2, 2], bytes(8)),
        ("x", "F16", [1], bytes(2)),
        ("ids", "I64", [1], bytes(8)),
        ("mask", "U8", [3], bytes(3)),
        ("pos", "I32", [], bytes(4)),
    ], {"format": "pt"}))
    write("safetensors", "empty.safetensors", st([]))
    write("safetensors", "unsupported.safetensors", st([("a", "F64", [1], bytes(8))]))
    # An FP8 checkpoint's projection: E4M3 codes and their one scale.
    write("safetensors", "fp8.safetensors", st([
        ("model.layers.0.self_attn.q_proj.weight", "F8_E4M3", [4, 4], bytes(range(0x30, 0x40))),
        ("model.layers.0.self_attn.q_proj.weight_scale", "F32", [], struct.pack("<f", 0.5)),
    ]))


if __name__ == "__main__":
    main()
