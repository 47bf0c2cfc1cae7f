#!/usr/bin/env python3
"""`osprey plan` through the built binary: text, JSON, --compare, --gpu-file,
and bad input (clear message, non-zero exit). Standard library only; needs no
model file (bundled configurations). Usage: plan_cli_test.py OSPREY_BINARY
"""
import json
import os
import sys
import tempfile

from checks import check, finish, run_command

OSPREY = sys.argv[1]


def run(args):
    return run_command([OSPREY, "plan"] + args)


# Text report.
rc, out, err = run(["--model", "llama-3-8b", "--gpu", "h100-sxm", "--price-per-hour", "2.5"])
check(rc == 0, f"text report: rc={rc} {err}")
for needle in ["KV per token", "128.0 KiB", "TTFT", "crossover", "$/M tok"]:
    check(needle in out, f"text report mentions {needle!r}")

# JSON: hand-computed Llama-3-8B figures.
rc, out, err = run(["--model", "llama-3-8b", "--gpu", "h100-sxm", "--json", "--batch", "1,8"])
check(rc == 0, f"json: rc={rc} {err}")
j = json.loads(out) if rc == 0 else {}
mem = j.get("memory", {})
check(mem.get("weight_bytes_total") == 2 * 8030261248, "json weight bytes = 2 x 8,030,261,248")
check(mem.get("kv_bytes_per_token_total") == 32 * 2 * 8 * 128 * 2, "json KV bytes per token = 131072")
check([d["batch"] for d in j.get("decode", [])][:2] == [1, 8], "json decode batches start 1, 8")
check(j.get("decode", [{}])[0].get("tpot_sol", {}).get("bound") == "memory", "batch 1 decode is memory-bound")
check(j.get("prefill", {}).get("ttft_sol", {}).get("bound") == "compute", "1024-token prefill is compute-bound")

# TP divides weights and KV.
rc, out, err = run(["--model", "llama-3-70b", "--gpu", "h100-sxm", "--tp", "4", "--json"])
j = json.loads(out) if rc == 0 else {}
check(rc == 0 and j["memory"]["weight_bytes_per_gpu"] == 2 * 70553706496 / 4, f"tp 4 weights per GPU: rc={rc} {err}")
check(rc == 0 and j["memory"]["kv_bytes_per_token_per_gpu"] == 80 * 2 * 2 * 128 * 2, "tp 4 KV per GPU")

# --compare: side by side; an unsupported column is reported, not fatal.
rc, out, err = run(["--model", "llama-3-8b", "--compare", "gpu=h100-sxm,a100-80gb,l40s"])
check(rc == 0 and "h100-sxm" in out and "l40s" in out and "a100-80gb" in out, f"compare gpu: rc={rc} {err}")
rc, out, err = run(["--model", "llama-3-8b", "--gpu", "a100-80gb", "--compare", "dtype=bf16,fp8,int4", "--json"])
j = json.loads(out) if rc == 0 else {}
check(rc == 0 and len(j["plans"]) == 3 and "error" in j["plans"][1] and "error" not in j["plans"][0],
      f"compare dtype on A100: fp8 column is an error: rc={rc} {err}")

# serve's spelling of the KV dtype: --kv-cache-dtype fp8 / fp8_e4m3 plans one byte a value, as --kv-dtype fp8.
for flag, val in (("--kv-dtype", "fp8"), ("--kv-cache-dtype", "fp8"), ("--kv-cache-dtype", "fp8_e4m3")):
    rc, out, err = run(["--model", "llama-3-8b", "--gpu", "h100-sxm", flag, val, "--json"])
    j = json.loads(out) if rc == 0 else {}
    check(rc == 0 and j["memory"]["kv_bytes_per_token_per_gpu"] == 32 * 2 * 8 * 128 * 1
          and j["options"]["kv_dtype"] == "fp8", f"{flag} {val}: rc={rc} {err}")

# --gpu-file adds an entry; custom GPUs need their figures.
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump([{"key": "toy-gpu", "memory_gb": 48, "bandwidth_gbs": 1000, "tflops_bf16": 200}], f)
rc, out, err = run(["--model", "qwen2.5-7b", "--gpu", "toy-gpu", "--gpu-file", f.name, "--json"])
os.unlink(f.name)
check(rc == 0 and json.loads(out)["gpu"]["bandwidth_gbs"] == 1000, f"--gpu-file entry: rc={rc} {err}")
rc, out, err = run(["--model", "smollm2-135m", "--gpu", "custom", "--mem-gb", "24", "--bw-gbs", "38",
                    "--tflops-bf16", "0.19", "--dtype", "q4_1", "--kv-dtype", "fp32"])
check(rc == 0, f"custom GPU with overrides: rc={rc} {err}")

# Bad input: a clear message and a non-zero exit.
bad = [
    (["--model", "llama-3-8b", "--gpu", "h900"], "unknown GPU"),
    (["--model", "llama-3-8b", "--gpu", "t4", "--dtype", "fp8"], "no FP8"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--tp", "-1"], "--tp"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--tp", "3"], "--tp 3"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--batch", "1,-4"], "--batch"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--context", "-5"], "--context"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--price-per-hour", "-2"], "--price-per-hour"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["--model", "llama-3-8b", "--gpu", "custom", "--mem-gb", "24"], "bandwidth"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--bw-gbs", "-1"], "bandwidth"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--compare", "colour=red"], "--compare"),
    (["--model", "no-such-model", "--gpu", "h100-sxm"], "no-such-model"),
    (["--model", "llama-3-8b"], "--gpu"),
]
for args, needle in bad:
    rc, out, err = run(args)
    check(rc != 0 and needle in err, f"bad input {args[2:]}: rc={rc} stderr={err.strip()!r} (expected {needle!r})")

finish()
