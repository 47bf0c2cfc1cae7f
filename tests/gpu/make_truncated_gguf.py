#!/usr/bin/env python3
"""Writes a copy of a llama-architecture GGUF that keeps only its first N layers.

For the GPU tests on machines that can take only a small working tree: the
default model (SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB) cut to 4 of its 30
layers keeps its real Q4_1/Q8_0 weights, vocabulary and shapes in ~40 MB.
Every metadata key is copied unchanged except <arch>.block_count; tensors of
layers >= N are dropped, the others are copied byte for byte.

usage: make_truncated_gguf.py IN.gguf OUT.gguf [--layers 4]
Requirements: gguf==0.19.0, numpy (tests/fixtures/requirements-ref.txt).
"""

import argparse
import re
import sys

import gguf
from gguf import GGUFValueType as VT


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()

    r = gguf.GGUFReader(args.src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(args.dst, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # written by GGUFWriter itself
        value = field.contents()
        if key == f"{arch}.block_count":
            value = args.layers
        vtype = field.types[0]
        if vtype == VT.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, vtype)
    layer = re.compile(r"^blk\.(\d+)\.")
    kept = 0
    for t in r.tensors:
        m = layer.match(t.name)
        if m and int(m.group(1)) >= args.layers:
            continue
        # t.data is the numpy view (bytes per row for quantised types), from
        # which GGUFWriter derives the element shape again.
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        kept += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{args.dst}: {kept} of {len(r.tensors)} tensors, {args.layers} layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
