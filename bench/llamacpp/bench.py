#!/usr/bin/env python3
"""Peer benchmark: llama.cpp (through llama-cpp-python) on the default model.

Measures prompt processing (one batched eval of the whole prompt) and decode (one
token per eval, greedy argmax of the last logits) and prints one JSON object:
  {"prompt_tps", "decode_tps", "prompt_tokens", "gen_tokens", "threads", ...}
Timings are medians over --reps repetitions after one warm-up; each repetition starts
from an empty KV cache. llama.cpp's own counters (llama_perf_context) are reported
alongside the wall-clock ones.

Run through bench/llamacpp/run.sh, which creates the venv (requirements-bench.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import llama_cpp
import numpy as np

DEFAULT_MODEL = Path.home() / ".cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf"

# Fixed English text; the prompt is its first --prompt-tokens tokens.
TEXT = (
    "The osprey is a large bird of prey that lives on every continent except Antarctica. "
    "It feeds almost entirely on fish, which it catches by hovering above the water, "
    "folding its wings and plunging feet first into the surface. Its outer toe is "
    "reversible, so it can grip a slippery fish with two toes in front and two behind. "
    "Ospreys build large nests of sticks on dead trees, cliffs and power poles, and pairs "
    "often return to the same nest for many years, adding new material each spring. "
    "Populations declined sharply in the middle of the twentieth century because "
    "pesticides thinned their eggshells, but after those chemicals were banned the species "
    "recovered, and today it is a common sight along coasts, lakes and rivers. "
)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("OSPREY_DEFAULT_MODEL", DEFAULT_MODEL)))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=512, help="llama.cpp n_batch / n_ubatch")
    args = ap.parse_args()

    n_ctx = args.prompt_tokens + args.gen_tokens + 8
    llm = llama_cpp.Llama(
        model_path=str(args.model),
        n_ctx=n_ctx,
        n_batch=args.batch,
        n_ubatch=args.batch,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        seed=0,
        verbose=False,
    )
    text = TEXT
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    while len(ids) < args.prompt_tokens:
        text += TEXT
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    prompt = ids[: args.prompt_tokens]

    n_vocab = llm.n_vocab()

    def run_once():
        llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        llama_cpp.llama_perf_context_reset(llm.ctx)
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        out = []
        for _ in range(args.gen_tokens):
            # Logits of the last evaluated token (llama-cpp-python keeps no copy of
            # them unless logits_all; read llama.cpp's buffer directly).
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
            tok = int(np.argmax(logits))
            out.append(tok)
            llm.eval([tok])  # every generated token goes through one decode step
        t2 = time.perf_counter()
        llama_cpp.llama_synchronize(llm.ctx)  # llama.cpp books its timings at sync points
        perf = llama_cpp.llama_perf_context(llm.ctx)
        return t1 - t0, t2 - t1, out, perf

    load_before = os.getloadavg()
    run_once()  # warm-up: page in weights, size buffers
    prompt_s, decode_s, internal_p, internal_d = [], [], [], []
    tokens = None
    for _ in range(args.reps):
        p, d, out, perf = run_once()
        prompt_s.append(p)
        decode_s.append(d)
        if perf.n_p_eval and perf.t_p_eval_ms > 0:
            internal_p.append(perf.n_p_eval / (perf.t_p_eval_ms / 1e3))
        if perf.n_eval and perf.t_eval_ms > 0:
            internal_d.append(perf.n_eval / (perf.t_eval_ms / 1e3))
        if tokens is None:
            tokens = out
        assert out == tokens, "greedy output changed between repetitions"

    med_p, med_d = statistics.median(prompt_s), statistics.median(decode_s)
    result = {
        "engine": "llama.cpp via llama-cpp-python",
        "llama_cpp_python": llama_cpp.__version__,
        "model": args.model.name,
        "threads": args.threads,
        "prompt_tokens": len(prompt),
        "gen_tokens": args.gen_tokens,
        "reps": args.reps,
        "prompt_tps": round(len(prompt) / med_p, 1),
        "decode_tps": round(args.gen_tokens / med_d, 1),
        "prompt_ms": round(med_p * 1e3, 2),
        "decode_ms_per_token": round(med_d * 1e3 / args.gen_tokens, 3),
        "llama_perf_prompt_tps": round(statistics.median(internal_p), 1) if internal_p else None,
        "llama_perf_decode_tps": round(statistics.median(internal_d), 1) if internal_d else None,
        "all_prompt_s": [round(x, 4) for x in prompt_s],
        "all_decode_s": [round(x, 4) for x in decode_s],
        "greedy_first16": tokens[:16],
        "greedy_text_first16": llm.detokenize(tokens[:16]).decode(errors="replace"),
        "cpu": cpu_name(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "n_cpus": os.cpu_count(),
        # llama.cpp's threads are OpenMP threads: on a busy machine the default (spinning)
        # wait policy collapses with 2+ threads; OMP_WAIT_POLICY=passive avoids that.
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
