#!/usr/bin/env python3
"""`osprey perplexity` on the default model against transformers
(tests/model/perplexity_reference.json, written by
tests/model/make_perplexity_reference.py): the same windows and scored tokens,
each token's NLL, the model's most likely token, the perplexity. Then --save /
--compare between page dtypes, and bad input. Standard library only.
Usage: perplexity_cli_test.py OSPREY_BINARY
"""
import json
import math
import os
import sys
import tempfile

from checks import check, finish, run_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OSPREY = sys.argv[1]
TEXT = os.path.join(ROOT, "tests/model/perplexity_text.txt")
ref = json.load(open(os.path.join(ROOT, "tests/model/perplexity_reference.json")))


def run(args):
    return run_command([OSPREY, "perplexity"] + args, timeout=300)


def ppl_args(*extra):
    return ["--model", "default", "--file", TEXT, "--ctx", str(ref["ctx"]), "--score-from", str(ref["score_from"]),
            "--threads", "2"] + list(extra)


with tempfile.TemporaryDirectory() as tmp:
    f32_path = os.path.join(tmp, "f32.json")
    rc, out, err = run(ppl_args("--json", "--save", f32_path))
    check(rc == 0, f"perplexity on the default model: rc={rc} {err.strip()[-300:]}")
    if rc == 0:
        got = json.loads(out)
        saved = json.load(open(f32_path))
        check(got["windows"] == ref["windows"] and got["text_tokens"] == ref["text_tokens"] and got["prefix"] == [],
              f"windows {got['windows']} / tokens {got['text_tokens']} / prefix {got['prefix']} vs "
              f"{ref['windows']} / {ref['text_tokens']} / []")
        check(saved["token"] == ref["token"], "the scored tokens are the reference's")
        n = len(ref["nll"])
        check(len(saved["nll"]) == n and got["scored_tokens"] == n, f"{len(saved['nll'])} scored tokens vs {n}")
        if len(saved["nll"]) == n:
            # float32 compute on the same dequantised weights: per-token NLL to ~1e-4.
            worst = max(abs(a - b) for a, b in zip(saved["nll"], ref["nll"]))
            check(worst < 2e-3, f"per-token NLL within 2e-3 of transformers (worst {worst:.2e})")
            # The most likely token agrees except at near ties of the reference.
            differ = [i for i in range(n) if saved["top1"][i] != ref["top1"][i]]
            check(all(ref["margin"][i] < 1e-2 for i in differ),
                  f"top-1 differs only at near ties: {[(i, ref['margin'][i]) for i in differ][:5]}")
        rel = abs(got["ppl"] - ref["ppl"]) / ref["ppl"]
        check(rel < 1e-4, f"perplexity {got['ppl']:.6f} vs transformers {ref['ppl']:.6f} (rel {rel:.2e})")
        hits = sum(a == b for a, b in zip(ref["top1"], ref["token"])) / n
        check(abs(got["top1"] - hits) < 0.02, f"top-1 accuracy {got['top1']:.4f} vs {hits:.4f}")
        check(got["ppl_err"] > 0 and got["stderr_nll"] > 0, "an error estimate is given")

        # The text output and --compare: the same run against itself is identical.
        rc, out, err = run(ppl_args("--compare", f32_path))
        check(rc == 0 and out.startswith("perplexity ") and "perplexity ratio 1.00000" in out
              and "same top-1 token 100.00%" in out and "tokens/s" in err,
              f"text output, self comparison: rc={rc} {out.strip()} {err.strip()[-200:]}")

        # FP8 pages against the float32 run: a measured, small cost; BF16 and INT8 pages smaller still.
        dnll = {}
        for kv, bound in (("fp8", 0.03), ("fp8+calibrated", 0.03), ("bfloat16", 0.01), ("int8", 0.01)):
            extra = ["--kv-cache-dtype", kv.split("+")[0]] + (["--calculate-kv-scales"] if "+" in kv else [])
            rc, out, err = run(ppl_args("--json", "--compare", f32_path, *extra))
            if "+" in kv:
                check(rc != 0 or "FP8 KV scales calibrated on" in err, f"the calibration is logged: {err[-300:]}")
            check(rc == 0, f"--kv-cache-dtype {kv}: rc={rc} {err.strip()[-300:]}")
            if rc == 0:
                c = json.loads(out)["compare"]
                print(f"{kv} pages against float32: ppl ratio {c['ppl_ratio']:.5f}, "
                      f"dNLL {c['mean_dnll']:+.5f} +/- {c['stderr_dnll']:.5f}, same top-1 {c['same_top1']:.4f}")
                check(c["ppl_ratio"] != 1.0 and abs(c["ppl_ratio"] - 1) < bound and c["same_top1"] > 0.9,
                      f"{kv} pages: ratio {c['ppl_ratio']} within {bound} of 1, not identical, top-1 mostly the same")
                dnll[kv] = c["mean_abs_dnll"]
        # INT8 pages (a scale a row) move each token's NLL less than FP8 pages do.
        check("int8" in dnll and "fp8" in dnll and dnll["int8"] * 2 < dnll["fp8"],
              f"INT8 pages closer to float32 than FP8 pages: mean |dNLL| {dnll}")
        rc, out, err = run(ppl_args("--kv-cache-dtype", "int8", "--calculate-kv-scales"))
        check(rc == 1 and "needs FP8 KV pages" in err, f"--calculate-kv-scales with int8 pages: rc={rc} {err[-200:]}")

    # Bad input: a clear message and exit code 1, never a crash.
    missing = os.path.join(tmp, "missing.txt")
    rc, out, err = run(["--model", "default", "--file", missing])
    check(rc == 1 and "cannot open --file" in err, f"missing text: rc={rc} {err.strip()[-200:]}")
    short = os.path.join(tmp, "short.txt")
    open(short, "w").write("A short text.")
    rc, out, err = run(["--model", "default", "--file", short, "--ctx", "64"])
    check(rc == 1 and "fewer than one window" in err, f"short text: rc={rc} {err.strip()[-200:]}")
    rc, out, err = run(["--model", "default", "--file", TEXT, "--ctx", "128", "--score-from", "0"])
    check(rc == 1 and "--score-from must be in" in err, f"bad --score-from: rc={rc} {err.strip()[-200:]}")
    rc, out, err = run(["--model", "default", "--file", TEXT, "--ctx", "100000"])
    check(rc == 1 and "--max-model-len" in err, f"--ctx over the context: rc={rc} {err.strip()[-200:]}")
    bad = os.path.join(tmp, "bad.json")
    for text in ("{", json.dumps({"format": "osprey-perplexity-1", "token": [1], "nll": [0.1], "top1": []})):
        open(bad, "w").write(text)
        rc, out, err = run(ppl_args("--compare", bad))
        check(rc == 1 and "--compare" in err and "CORRUPT" in err.upper(), f"bad --compare file: rc={rc} {err[-200:]}")
    other = os.path.join(tmp, "other.json")
    open(other, "w").write(json.dumps({"format": "osprey-perplexity-1", "token": [1, 2], "nll": [0.1, 0.2],
                                       "top1": [1, 2]}))
    rc, out, err = run(ppl_args("--compare", other))
    check(rc == 1 and "different numbers of tokens" in err, f"--compare of another text: rc={rc} {err[-200:]}")
    rc, out, err = run(ppl_args("--save", os.path.join(tmp, "no", "such", "folder.json")))
    check(rc == 1 and "cannot write --save file" in err, f"unwritable --save, before the run: rc={rc} {err[-200:]}")
    rc, out, err = run(ppl_args("--calculate-kv-scales"))
    check(rc == 1 and "needs FP8 KV pages" in err, f"--calculate-kv-scales without fp8 pages: rc={rc} {err[-200:]}")
    rc, out, err = run(["--model", "default"])
    check(rc != 0 and "--file" in err, f"--file is required: rc={rc}")

finish()
