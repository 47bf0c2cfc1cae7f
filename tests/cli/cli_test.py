#!/usr/bin/env python3
"""CLI conformance: `osprey tokenize`, `detokenize`, `template` and `info` on the
default model and on the shared tokenizer files, against the committed
reference outputs (tests/model/default_reference.json from transformers,
tests/templates/expected.json from transformers' apply_chat_template).
Standard library only. Usage: cli_test.py OSPREY_BINARY
"""
import json
import os
import sys
import tempfile

from checks import check, finish, run_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OSPREY = sys.argv[1]


def run(args, stdin=None):
    return run_command([OSPREY] + args, stdin=stdin, timeout=120, out_errors="surrogateescape")


ref = json.load(open(os.path.join(ROOT, "tests/model/default_reference.json")))
for p in ref["prompts"]:
    # tokenize --text, and from standard input
    rc, out, err = run(["tokenize", "--tokenizer", "default", "--no-special", "--text", p["text"]])
    check(rc == 0 and json.loads(out) == p["ids"], f"tokenize {p['name']}: rc={rc} {err.strip()}")
    rc, out, err = run(["tokenize", "--tokenizer", "default"], stdin=p["text"].encode())
    check(rc == 0 and json.loads(out) == p["ids"], f"tokenize stdin {p['name']}: rc={rc}")
    # detokenize round trip (the CLI ends the text with one newline)
    rc, out, err = run(["detokenize", "--tokenizer", "default", "--ids", json.dumps(p["ids"])])
    check(rc == 0 and out == p["text"] + "\n", f"detokenize {p['name']}: rc={rc}")
    if p["kind"] == "chat":
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(p["messages"], f)
        rc, out, err = run(["template", "--tokenizer", "default", "--messages", f.name, "--add-generation-prompt"])
        os.unlink(f.name)
        check(rc == 0 and out == p["text"], f"template {p['name']}: rc={rc} {err.strip()}")

# A tokenizer.json path (Qwen3) with a tool-calling case from the template conformance set.
qwen = os.path.join(ROOT, "..", "shared", "tokenizers", "qwen3", "tokenizer.json")
records = json.load(open(os.path.join(ROOT, "tests/templates/expected.json")))
STANDARD = {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token", "pad_token",
            "unk_token"}
picked = [r for r in records if r["template"] == "qwen3" and "output" in r and r["context"].get("tools")][:2]
picked += [r for r in records if r["template"] == "qwen3" and "output" in r and "enable_thinking" in r["context"]][:1]
check(len(picked) == 3, "found qwen3 tool and thinking cases in tests/templates/expected.json")
for r in picked:
    ctx = r["context"]
    with tempfile.TemporaryDirectory() as d:
        mpath = os.path.join(d, "m.json")
        json.dump(ctx["messages"], open(mpath, "w"))
        args = ["template", "--tokenizer", qwen, "--messages", mpath]
        if ctx.get("tools"):
            tpath = os.path.join(d, "t.json")
            json.dump(ctx["tools"], open(tpath, "w"))
            args += ["--tools", tpath]
        if ctx.get("add_generation_prompt"):
            args.append("--add-generation-prompt")
        for k, v in ctx.items():
            if k not in STANDARD:
                args += ["--var", f"{k}={json.dumps(v)}"]
        rc, out, err = run(args)
        check(rc == 0 and out == r["output"], f"template qwen3 {r['case']}: rc={rc} {err.strip()}")

# Bad input gives a clear error and a non-zero exit, never a crash.
rc, out, err = run(["detokenize", "--tokenizer", "default", "--ids", "[1, \"x\"]"])
check(rc == 2 and "JSON array of integers" in err, "detokenize rejects non-integer ids")
rc, out, err = run(["tokenize", "--tokenizer", "/nonexistent/tokenizer.json", "--text", "x"])
check(rc == 1 and err.startswith("osprey:"), "tokenize reports a missing tokenizer")
# --quantization: fp8 needs FP8 tensor cores (refused on the CPU before any
# weight is made); an unknown kind is refused too.
rc, out, err = run(["generate", "--model", "default", "--prompt", "hi", "--max-tokens", "1", "--quantization", "fp8"])
check(rc == 1 and "quantization fp8 needs FP8 tensor cores" in err and "compute capability 8.9" in err,
      f"generate refuses --quantization fp8 on the CPU: rc={rc} {err.strip()[-200:]}")
rc, out, err = run(["generate", "--model", "default", "--prompt", "hi", "--max-tokens", "1", "--quantization", "int3"])
check(rc == 1 and "none or fp8" in err, f"generate refuses an unknown --quantization: rc={rc} {err.strip()[-200:]}")
rc, out, err = run(["info", "--model", "default"])
check(rc == 0 and "architecture:    llama" in out and "134515008" in out, "info on the default model")

finish()
