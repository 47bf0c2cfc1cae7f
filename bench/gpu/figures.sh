#!/usr/bin/env bash
# Issue 7/8 figures on one CUDA GPU: Llama-3-8B shapes with dummy bf16
# weights through `osprey bench offline`, and Hugging Face transformers on the
# same card. Needs a build with the CUDA backend (OSPREY_BIN, default
# build-gpu/tools/osprey). Results: one JSON per run under $OUT (default
# bench/results/gpu), a summary on stdout.
#
#   bench/gpu/figures.sh [quick|all|long]  (long: only 2048/2048; SKIP_HF=1: leave out the transformers run)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${OSPREY_BIN:-$root/build-gpu/tools/osprey}
out=${OUT:-$root/bench/results/gpu}
model=${MODEL:-llama-3-8b}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
common=(bench offline --mode throughput --device cuda --load-format dummy --model "$model" --random-prompts
        --num-sequential 0 --max-num-batched-tokens 8192)

run() {  # name, timeout seconds, args...
  local name=$1 t=$2; shift 2
  echo "== $name: $*"
  timeout "$t" "$bin" "${common[@]}" "$@" --output-json "$out/$name.json" > "$out/$name.txt" 2>&1
  local rc=$?
  grep -E "output tok/s|TTFT|TPOT|tok/s" "$out/$name.txt" | head -8
  [[ $rc == 0 ]] || { echo "   rc=$rc"; tail -5 "$out/$name.txt"; }
}

mode=${1:-quick}
if [[ "$mode" != long ]]; then
  run decode_b1    120 --num-prompts 1 --input-len 128 --output-len 512
  run ttft_2048    120 --num-prompts 1 --input-len 2048 --output-len 2
  run tput_128_128 240 --num-prompts 1024 --max-num-seqs 512 --input-len 128 --output-len 128
  run tput_2048_128 240 --num-prompts 256 --max-num-seqs 256 --input-len 2048 --output-len 128
  run peer_512_256 240 --num-prompts 128 --max-num-seqs 128 --input-len 512 --output-len 256
fi
if [[ "$mode" == all ]]; then
  run tput_1000_1000 400 --num-prompts 256 --max-num-seqs 256 --input-len 1000 --output-len 1000
fi
if [[ "$mode" == all || "$mode" == long ]]; then
  run tput_2048_2048 400 --num-prompts 256 --max-num-seqs 256 --input-len 2048 --output-len 2048
fi
if [[ -z "${SKIP_HF:-}" ]] && python3 -c "import torch, transformers" 2>/dev/null; then
  echo "== transformers generate, batch 128, 512 in / 256 out"
  timeout 400 python3 "$root/bench/hf/hf_generate.py" --model "$model" --batch 128 --input-len 512 --output-len 256 \
    > "$out/hf_512_256.json" 2> "$out/hf_512_256.log"
  cat "$out/hf_512_256.json"; tail -3 "$out/hf_512_256.log"
fi
