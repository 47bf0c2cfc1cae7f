#!/usr/bin/env bash
# Peer benchmark: llama.cpp (llama-cpp-python, built from source) on the default model.
# Usage: bench/llamacpp/run.sh [--threads N] [--prompt-tokens N] [--gen-tokens N]
#                              [--reps N] [--model PATH] [--batch N]
# Prints one JSON object: {prompt_tps, decode_tps, ...}. The first call builds
# <repo>/.venv-bench (compiles llama.cpp: several minutes on 2 cores).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${OSPREY_BENCH_VENV:-$root/.venv-bench}"
"$here/setup_venv.sh" >&2
exec "$venv/bin/python" "$here/bench.py" "$@"
