#!/usr/bin/env bash
# One device call of a GPU session (issue 8): build, GPU tests and the
# figures docs/PERF.md records, as named steps, each logged with its time
# and exit status; a failed step does not stop the next. From the repo root:
#   OUT=$OUT STEPS="build gputests enginetests ttft decode" timeout 590 bash bench/gpu/session.sh
# Steps:
#   build        osprey, gpu_tests, gpu_engine_tests, model_bench, gpu_op_bench
#                (CUDA, sm_90a, Release) in build-gpu/; where PCRE2 / utf8proc
#                headers are missing, .debs/*.deb are unpacked into /tmp/px
#                (apt-get download libpcre2-dev libpcre2-8-0 libpcre2-16-0
#                libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2)
#   gputests     gpu_tests with GT_FILTER (default: all)
#   enginetests  gpu_engine_tests with ET_FILTER (default: all); needs the
#                SmolLM2 GGUF or .devdata/SmolLM2-135M-Instruct.Q4_1.truncated.gguf
#   ttft         model_bench llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200, once
#                per ";"-separated "tag|extra args" of TTFT_RUNS (default "bf16|")
#   decode       model_bench llama-3-8b bfloat16 --decode-only --ctx 512 --ctx 2048
#                --ctx 8192 (target 1), DECODE_ARGS appended
#   offline      `osprey bench offline` (dummy Llama-3-8B) per ";"-separated
#                "tag|input|output|prompts|seqs|extra args" of OFF_RUNS
#                (default "128_128|128|128|1024|512|")
#   perplexity   `osprey perplexity --device cuda` over PPL_FILE (default
#                /usr/share/common-licenses/GPL-3) with PPL_MODEL (default the
#                truncated SmolLM2 GGUF in .devdata), per ";"-separated
#                "tag|extra args" of PPL_RUNS against the first run
#                (default "bf16|;fp8|--kv-cache-dtype fp8;fp8cal|--kv-cache-dtype
#                fp8 --calculate-kv-scales")
#   opbench      gpu_op_bench per ";"-separated "tag|VAR=value ...|args" of
#                OP_RUNS (e.g. "g7|OSPREY_BENCH_HEADS=28,4|decode-attention");
#                each run's output also goes to $OUT/op_<tag>.txt
#   modelbench   model_bench per ";"-separated "tag|VAR=value ...|args" of
#                MB_RUNS (e.g. "q7|OSPREY_DECODE_ATTENTION=simt|qwen2.5-7b
#                bfloat16 --decode-only"); output also in $OUT/mb_<tag>.txt
#   osprey       the osprey binary per ";"-separated "tag|VAR=value ...|args"
#                of OS_RUNS (e.g. "q7off||bench offline --model qwen2.5-7b
#                --load-format dummy ..."); output also in $OUT/os_<tag>.txt
# Output ($OUT): session.log (steps, times, the lines that matter) and
# session_logs.tgz (every tool's log). Env: END_S (seconds from the start by
# which to stop starting steps, default 570), JOBS (ninja, default nproc),
# BUILD_DIR (where the steps after build look for binaries, default
# build-gpu), PPL_DEVICE (default cuda; cpu to try the step without a GPU).
set -uo pipefail
t0=$(date +%s)
end_s=${END_S:-570}
out=${OUT:-/tmp/session-out}
tmp=/tmp/session-logs
root=$(pwd)
mkdir -p "$out" "$tmp"
log=$out/session.log
bin=$root/${BUILD_DIR:-build-gpu}
el() { echo $(( $(date +%s) - t0 )); }
say() { echo "[$(date +%H:%M:%S) +$(el)s] $*" | tee -a "$log"; }
pack() { tar -czf "$out/session_logs.tgz" -C "$tmp" . 2>/dev/null; }
trap 'pack' EXIT
trap 'say "signal: stopping"; exit 143' TERM INT

say "session: STEPS='${STEPS:-build}' OUT=$out root=$root commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
  echo "cores $(nproc)"; } 2>&1 | sed 's/^/  /' | tee -a "$log"

step_build() {
  if ! pkg-config --exists libpcre2-8 libutf8proc 2>/dev/null && ls .debs/*.deb >/dev/null 2>&1; then
    mkdir -p /tmp/px && for f in .debs/*.deb; do dpkg -x "$f" /tmp/px; done
    export PKG_CONFIG_PATH=/tmp/px/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=/tmp/px
    export LD_LIBRARY_PATH=/tmp/px/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DOSPREY_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a > "$tmp/configure.log" 2>&1 || { tail -20 "$tmp/configure.log" | tee -a "$log"; return 1; }
  ninja -C build-gpu -j"${JOBS:-$(nproc)}" osprey gpu_tests gpu_engine_tests model_bench gpu_op_bench \
    > "$tmp/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$tmp/build.log" | head -40 | tee -a "$log"; return 1; }
}

# The built binary named $1 (its path on stdout), or a logged error and status 1.
find_bin() {
  local b; b=$(find "$bin" -name "$1" -type f -perm -u+x | head -1)
  [[ -n "$b" ]] || { say "no $1 binary under $bin" >&2; return 1; }
  echo "$b"
}

gtest_summary() {  # log file
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]|^\[==========\] .* ran" "$1" | head -30 | tee -a "$log"
}

step_gputests() {
  local b; b=$(find_bin gpu_tests) || return 1
  "$b" ${GT_FILTER:+--gtest_filter="$GT_FILTER"} > "$tmp/gpu_tests.log" 2>&1
  local rc=$?
  gtest_summary "$tmp/gpu_tests.log"
  return $rc
}

step_enginetests() {
  local b; b=$(find_bin gpu_engine_tests) || return 1
  "$b" ${ET_FILTER:+--gtest_filter="$ET_FILTER"} > "$tmp/gpu_engine_tests.log" 2>&1
  local rc=$?
  gtest_summary "$tmp/gpu_engine_tests.log"
  grep -E "NMSE|calibrated" "$tmp/gpu_engine_tests.log" | head -10 | tee -a "$log"
  return $rc
}

step_ttft() {
  local b; b=$(find_bin model_bench) || return 1
  local run tag extra rc=0
  IFS=';' read -ra runs <<< "${TTFT_RUNS:-bf16|}"
  for run in "${runs[@]}"; do
    tag=${run%%|*}; extra=${run#*|}
    # shellcheck disable=SC2086  # extra: words on purpose
    "$b" llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 $extra > "$tmp/ttft_$tag.txt" 2>&1 || rc=1
    say "  ttft $tag ($extra): $(grep -iE 'ttft' "$tmp/ttft_$tag.txt" | head -3 | tr '\n' ' ')"
  done
  return $rc
}

step_decode() {
  local b; b=$(find_bin model_bench) || return 1
  # shellcheck disable=SC2086
  "$b" llama-3-8b bfloat16 --decode-only --ctx 512 --ctx 2048 --ctx 8192 ${DECODE_ARGS:-} > "$tmp/decode.txt" 2>&1
  local rc=$?
  grep -iE "MBU|ms/step|copy" "$tmp/decode.txt" | head -12 | tee -a "$log"
  return $rc
}

step_offline() {
  local b; b=$(find_bin osprey) || return 1
  local run tag il ol np seqs extra rc=0
  IFS=';' read -ra runs <<< "${OFF_RUNS:-128_128|128|128|1024|512|}"
  for run in "${runs[@]}"; do
    IFS='|' read -r tag il ol np seqs extra <<< "$run"
    (( $(el) < end_s - 60 )) || { say "  offline $tag: no time left"; rc=1; continue; }
    # shellcheck disable=SC2086
    timeout $(( end_s - $(el) )) "$b" bench offline --mode throughput --device cuda --load-format dummy \
      --model llama-3-8b --random-prompts --num-sequential 0 --max-num-batched-tokens 8192 \
      --max-num-seqs "$seqs" --num-prompts "$np" --input-len "$il" --output-len "$ol" $extra \
      > "$tmp/offline_$tag.txt" 2>&1 || rc=1
    say "  offline $tag ($il/$ol, $np prompts, $seqs seqs, $extra): $(grep -E 'Output token throughput' "$tmp/offline_$tag.txt" | tail -1)"
  done
  return $rc
}

step_perplexity() {
  local b; b=$(find_bin osprey) || return 1
  local model=${PPL_MODEL:-$root/.devdata/SmolLM2-135M-Instruct.Q4_1.truncated.gguf}
  local file=${PPL_FILE:-/usr/share/common-licenses/GPL-3}
  local run tag extra first="" rc=0
  IFS=';' read -ra runs <<< "${PPL_RUNS:-bf16|;fp8|--kv-cache-dtype fp8;fp8cal|--kv-cache-dtype fp8 --calculate-kv-scales}"
  for run in "${runs[@]}"; do
    tag=${run%%|*}; extra=${run#*|}
    local cmp=()
    [[ -n "$first" ]] && cmp=(--compare "$first")
    # shellcheck disable=SC2086
    "$b" perplexity --device "${PPL_DEVICE:-cuda}" --model "$model" --file "$file" --ctx 512 $extra --save "$tmp/ppl_$tag.json" \
      "${cmp[@]}" > "$tmp/ppl_$tag.txt" 2>&1 || rc=1
    [[ -z "$first" ]] && first=$tmp/ppl_$tag.json
    say "  perplexity $tag ($extra): $(grep -E '^perplexity|^against|calibrated on' "$tmp/ppl_$tag.txt" | tr '\n' ' ')"
  done
  return $rc
}

# Runs binary $1 once per ";"-separated "tag|VAR=value ...|args" of $2,
# output to $OUT/$3_<tag>.txt (and the log's summary lines matching $4).
run_tagged() {
  local b; b=$(find_bin "$1") || return 1
  local run tag vars args rc=0
  IFS=';' read -ra runs <<< "$2"
  for run in "${runs[@]}"; do
    IFS='|' read -r tag vars args <<< "$run"
    (( $(el) < end_s - 20 )) || { say "  $3 $tag: no time left"; rc=1; continue; }
    # shellcheck disable=SC2086  # vars, args: words on purpose
    timeout $(( end_s - $(el) )) env $vars "$b" $args > "$out/$3_$tag.txt" 2>&1 || rc=1
    say "  $3 $tag ($vars $args): $(grep -cE '.' "$out/$3_$tag.txt") lines"
    grep -E "$4" "$out/$3_$tag.txt" | head -8 | tee -a "$log"
  done
  return $rc
}
step_opbench() { run_tagged gpu_op_bench "${OP_RUNS:?OP_RUNS}" op "^decode attention|^copy"; }
step_modelbench() { run_tagged model_bench "${MB_RUNS:?MB_RUNS}" mb "MBU|ms/step|TTFT|^model"; }
step_osprey() { run_tagged osprey "${OS_RUNS:?OS_RUNS}" os "Output token throughput|TTFT|TPOT|decode device time"; }

for s in ${STEPS:-build}; do
  if (( $(el) >= end_s )); then say "== $s: skipped (END_S)"; continue; fi
  say "== $s"
  st=$(date +%s)
  if declare -F "step_$s" >/dev/null; then
    "step_$s"; rc=$?
  else
    say "unknown step $s"; rc=2
  fi
  say "== $s: rc=$rc in $(( $(date +%s) - st ))s"
done
say "end"
