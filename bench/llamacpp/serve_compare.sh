#!/usr/bin/env bash
# osprey serve against llama.cpp's OpenAI server (llama-cpp-python[server]):
# same model file, same workload, same run, both driven by `osprey bench serve`.
#
# Usage: bench/llamacpp/serve_compare.sh [--threads N] [--num-prompts N] [--input-len N]
#            [--output-len N] [--max-concurrency LIST] [--model PATH] [--out-dir DIR]
# Env: OSPREY_BIN (default build/tools/osprey), OSPREY_BENCH_VENV (default .venv-bench).
# Writes <out-dir>/bench_serve_{osprey,llamacpp}.json (default bench/results) and
# prints both summaries. llama-cpp-python's server runs one request at a time
# (it holds a lock around the model; --interrupt_requests False, or a new
# request cuts the stream in progress short), and supports neither usage in
# streams nor ignore_eos:
# the script bans the end-of-sequence tokens with logit_bias so that outputs
# have the asked length, and the bench counts the streamed chunks.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${OSPREY_BENCH_VENV:-$root/.venv-bench}"
bin="${OSPREY_BIN:-$root/build/tools/osprey}"
threads=2 num_prompts=16 input_len=128 output_len=64 conc=1,4 model=default out_dir="$root/bench/results"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --num-prompts) num_prompts="$2"; shift 2 ;;
    --input-len) input_len="$2"; shift 2 ;;
    --output-len) output_len="$2"; shift 2 ;;
    --max-concurrency) conc="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --out-dir) out_dir="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ "$model" == default ]]; then
  "$root/scripts/fetch_model.sh"
  model="${OSPREY_MODELS_DIR:-$HOME/.cache/osprey/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
[[ -f "$model" ]] || { echo "no model file $model" >&2; exit 1; }
"$here/setup_venv.sh" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements-serve.txt"
mkdir -p "$out_dir"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() {  # url path
  for _ in $(seq 600); do
    if python3 - "$1$2" <<'PY' 2>/dev/null; then return 0; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=1)
PY
    sleep 0.5
  done
  return 1
}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

common=(--model "$model" --served-model-name bench --num-prompts "$num_prompts" --input-len "$input_len"
        --output-len "$output_len" --request-rate inf --max-concurrency "$conc" --num-warmups 1 --seed 0
        --no-progress)
echo "load before: $(uptime)"

# osprey
port=$(free_port)
"$bin" serve --model "$model" --served-model-name bench --host 127.0.0.1 --port "$port" --threads "$threads" \
    --max-num-seqs 64 > "${TMPDIR:-/tmp}/serve_compare_osprey.log" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$port" /ready
"$bin" bench serve --base-url "http://127.0.0.1:$port" "${common[@]}" \
    --output-json "$out_dir/bench_serve_osprey.json"
kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
echo "load between: $(uptime)"

# llama.cpp: EOS ids from the model's tokenizer, banned through logit_bias.
eos_bias=$("$venv/bin/python" - "$model" <<'PY'
import json, sys
from llama_cpp import Llama
m = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
ids = {m.token_eos()}
for t in ("<|im_end|>", "<|endoftext|>"):
    toks = m.tokenize(t.encode(), add_bos=False, special=True)
    if len(toks) == 1:
        ids.add(toks[0])
print(json.dumps({"logit_bias": {str(i): -100.0 for i in sorted(ids) if i >= 0}}))
PY
)
port=$(free_port)
"$venv/bin/python" -m llama_cpp.server --model "$model" --model_alias bench --host 127.0.0.1 --port "$port" \
    --n_threads "$threads" --n_ctx 4096 --interrupt_requests False > "${TMPDIR:-/tmp}/serve_compare_llamacpp.log" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$port" /v1/models
"$bin" bench serve --base-url "http://127.0.0.1:$port" "${common[@]}" --no-ignore-eos --extra-body "$eos_bias" \
    --output-json "$out_dir/bench_serve_llamacpp.json"
echo "load after: $(uptime)"
