#!/usr/bin/env bash
# Leave-one-out cost of each op group of one step inside a CUDA-graph replay.
#
# model_bench's per-op breakdown times every op between CUDA events, one at
# a time: it counts each op's launch ramp and drain, and misses what
# programmatic dependent launch overlaps and the gaps between graph nodes
# (its sum is ~20% above a graph replay's step). This script instead runs
# model_bench once per breakdown label with OSPREY_BENCH_SKIP=<label> (the
# op left out of the captured step; outputs wrong, times meaningful) and
# prints, per label, the graph-replay step time without it and the
# difference to the full step: what the op costs the step as it runs in
# the graph, gaps included. The differences need not add up to the step
# (leaving one op out can also remove a gap another op would hide).
#
# usage: bench/gpu/leave_one_out.sh BUILD_DIR OUT_DIR MODEL_BENCH_ARGS...
#   MODEL_BENCH_ARGS: one --batch x --ctx pair, e.g.
#     --decode-only --ctx 2048                       (batch 1)
#     --decode-only --ctx 300 --ctx-spread 0.8 --batch 100 --mixed 128
# The full step runs first and last (the spread between the two is the
# noise to read the differences against).
set -euo pipefail
build=$1 out=$2
shift 2
mb="$build/tests/gpu/model_bench"
[ -x "$mb" ] || { echo "no $mb (build the model_bench target)" >&2; exit 1; }
mkdir -p "$out"

graph_ms() { sed -nE 's/.*graph replay: ([0-9.]+) ms\/step.*/\1/p' "$1" | head -1; }

# run_step LOG SKIP: model_bench with SKIP left out (empty: the full step);
# prints the graph-replay ms, nothing if the run gave none (its log says why).
run_step() {
  OSPREY_BENCH_SKIP="$2" "$mb" llama-3-8b bfloat16 "${args[@]}" > "$1" 2>&1 || true
  graph_ms "$1"
}

args=("$@")
base1=$(run_step "$out/loo_full_1.log" "")
[ -n "$base1" ] || { echo "no graph replay time in $out/loo_full_1.log" >&2; exit 1; }

# Breakdown labels: the lines between the "breakdown" header and "total",
# label = everything before the calls / ms / share columns.
mapfile -t labels < <(awk '/breakdown at context/ {on = 1; next} on && /^  total/ {exit} on' "$out/loo_full_1.log" |
  sed -nE 's/^  (.*[^ ]) +[0-9]+ +[0-9.]+ +[0-9.]+%.*$/\1/p')
[ "${#labels[@]}" -gt 0 ] || { echo "no breakdown labels in $out/loo_full_1.log" >&2; exit 1; }

without=()
for i in "${!labels[@]}"; do
  without[i]=$(run_step "$out/loo_skip_$((i + 1)).log" "${labels[i]}")
done
base2=$(run_step "$out/loo_full_2.log" "")
last=$base2
[ -n "$base2" ] || { base2=$base1; last="no time"; }

{
  echo "model_bench $* (graph replay ms/step)"
  echo "full step: $base1 (first run), $last (last run)"
  printf '%-40s %12s %12s %8s\n' "left out" "step ms" "op costs ms" "share"
  for i in "${!labels[@]}"; do
    if [ -z "${without[i]}" ]; then
      printf '%-40s %12s (see %s)\n' "${labels[i]}" "no time" "$out/loo_skip_$((i + 1)).log"
      continue
    fi
    awk -v l="${labels[i]}" -v w="${without[i]}" -v a="$base1" -v b="$base2" 'BEGIN {
      base = (a + b) / 2; d = base - w;
      printf "%-40s %12.3f %12.3f %7.1f%%\n", l, w, d, 100 * d / base }'
  done
} | tee "$out/loo_table.txt"
