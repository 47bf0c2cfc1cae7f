#!/usr/bin/env python3
"""bench/gpu/ab_table.py on hand-made ab.sh outputs (a folder and the same
files packed as ab.tgz): prefill-bench rows and model_bench's TTFT, prompt
attention and graph-replay decode lines become one row per (run, case)
with a column per variant, each cell the range over the rounds and, after
A, the change of the mean against A's; unknown lines are left out; no
outputs, a missing path and a broken ab.tgz are errors. Needs no GPU;
standard library only.
Usage: ab_table_test.py REPO_ROOT
"""
import os
import sys
import tarfile
import tempfile

from checks import check, finish, run_command

TOOL = os.path.join(sys.argv[1], "bench", "gpu", "ab_table.py")

BENCH = """Running main() from gtest_main.cc
prefill attention bench on NVIDIA H200: causal, hq 32, hk 8, hd 128, window 0, pages of 16
tokens     dtype   kernel             ms    TFLOP/s
4096       bf16    wgmma3          0.253      {a:.1f}
4096       bf16+f8 wgmma3          0.310      {b:.1f}
4096       f16+i8  wgmma3          0.410      {c:.1f}
[       OK ] PrefillAttention.DISABLED_PrefillAttentionBench (5000 ms)
"""

MODEL = """model: llama-3-8b dummy, BF16 activations, BF16 KV
TTFT, one 8192-token prompt: {ttft:.2f} ms (658 TFLOP/s on 2 x params x tokens), each after 200 ms idle
prefill breakdown (8192 tokens):
  op                            calls         ms   share GB/s (weights or KV read, % of copy)
  matmul 28672x4096                32     87.274   41.6%       86 ( 2%)
  paged_attention                  32     {attn:.3f}   16.8%
  total                                  209.653 (sum of op times)
batch-1 decode (bytes/step = weights without the embedding table + KV read):
   context    ms/step    tok/s    GB/step     MBU
       512      4.223    236.8      15.08   85.4%   graph replay: {dec:.3f} ms/step, 242.5 tok/s, MBU 87.5%
"""


def write_runs(folder):
    files = {
        "pb_A_r1.txt": BENCH.format(a=540.0, b=440.0, c=330.0),
        "pb_A_r2.txt": BENCH.format(a=544.0, b=440.0, c=330.0),
        "pb_B_r1.txt": BENCH.format(a=567.0, b=462.0, c=363.0),
        "pb_B_r2.txt": BENCH.format(a=567.0, b=462.0, c=363.0),
        "m_A_r1.txt": MODEL.format(ttft=200.0, attn=35.0, dec=4.124),
        "m_B_r1.txt": MODEL.format(ttft=190.0, attn=31.5, dec=4.124),
        "build_B.log": "4096       bf16    wgmma3          0.253      999.0\n",  # not a run output
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return files


def rows(out):
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.splitlines()]


with tempfile.TemporaryDirectory() as tmp:
    folder = os.path.join(tmp, "ab")
    os.mkdir(folder)
    files = write_runs(folder)
    tgz = os.path.join(tmp, "ab.tgz")
    with tarfile.open(tgz, "w:gz") as tar:
        for name in files:
            tar.add(os.path.join(folder, name), arcname=os.path.join(".", name))

    outs = []
    for path in (folder, tgz):
        rc, out, err = run_command([sys.executable, TOOL, path])
        check(rc == 0, f"{path}: exit 0 (got {rc}: {err})")
        outs.append(out)
    check(outs[0] == outs[1], "the folder and its ab.tgz give the same table")
    t = rows(outs[0])
    check(t[0] == ["run", "case", "unit", "A", "B"], f"header: {t[0]}")
    by = {(r[0], r[1]): r for r in t[2:]}
    check(("pb", "4096 bf16 wgmma3") in by and by[("pb", "4096 bf16 wgmma3")][2:] ==
          ["TFLOP/s", "540.0-544.0", "567.0 (+4.6%)"], f"bench row: {by.get(('pb', '4096 bf16 wgmma3'))}")
    check(by.get(("pb", "4096 bf16+f8 wgmma3"), [])[2:] == ["TFLOP/s", "440.0", "462.0 (+5.0%)"],
          f"one-byte pages' row: {by.get(('pb', '4096 bf16+f8 wgmma3'))}")
    check(by.get(("pb", "4096 f16+i8 wgmma3"), [])[2:] == ["TFLOP/s", "330.0", "363.0 (+10.0%)"],
          f"I8 pages' row: {by.get(('pb', '4096 f16+i8 wgmma3'))}")
    check(by.get(("m", "TTFT(8192)"), [])[2:] == ["ms", "200.0", "190.0 (-5.0%)"],
          f"TTFT row: {by.get(('m', 'TTFT(8192)'))}")
    check(by.get(("m", "prompt paged_attention"), [])[2:] == ["ms", "35.0", "31.5 (-10.0%)"],
          f"attention row: {by.get(('m', 'prompt paged_attention'))}")
    check(by.get(("m", "decode 512 graph"), [])[2:] == ["ms", "4.124", "4.124 (+0.0%)"],
          f"decode row: {by.get(('m', 'decode 512 graph'))}")
    check(len(t) == 2 + 6, f"six rows: the matmul, total and build log lines left out ({len(t) - 2})")
    check("999" not in outs[0], "files other than TAG_V_rN.txt are not read")

    empty = os.path.join(tmp, "empty")
    os.mkdir(empty)
    rc, out, err = run_command([sys.executable, TOOL, empty])
    check(rc != 0 and "no TAG_V_rN.txt" in err, f"no outputs: an error (rc {rc}, {err.strip()})")
    bad = os.path.join(tmp, "bad.tgz")
    with open(bad, "wb") as f:
        f.write(b"not a tar file")
    rc, out, err = run_command([sys.executable, TOOL, bad])
    check(rc != 0 and "cannot read" in err and "Traceback" not in err, f"a broken ab.tgz: an error (rc {rc}, {err.strip()})")
    rc, out, err = run_command([sys.executable, TOOL, os.path.join(tmp, "missing")])
    check(rc != 0 and "no " in err, f"a missing path: an error (rc {rc})")

finish()
