#!/usr/bin/env bash
# Per-kernel time and DRAM traffic of one eager decode step under Nsight
# Compute (ncu), without the CUDA-event overhead of model_bench's breakdown.
# Runs model_bench --profile-step for each "BATCHxCTX" pair given, then
# prints each kernel's calls, microseconds, DRAM MB read / written and the
# achieved GB/s against the copy ceiling model_bench measured.
#
# usage: bench/gpu/ncu_step.sh BUILD_DIR OUT_DIR PAIR... (e.g. 96x320 1x2048)
# Needs ncu on PATH or under /opt/nvidia/nsight-compute. The clocks are left
# alone (--clock-control none), and caches are not flushed between kernels
# (--cache-control none), so a kernel that reads what the one before it
# wrote is timed as in a real step; ncu still serialises the kernels (no
# overlap from programmatic dependent launch).
set -euo pipefail
build=$1 out=$2
shift 2
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -n "$ncu_bin" ] || { echo "ncu not found" >&2; exit 1; }
mkdir -p "$out"
for pair in "$@"; do
  b=${pair%x*} c=${pair#*x}
  "$ncu_bin" --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --print-kernel-base function --csv --page raw --log-file "$out/ncu_${pair}.csv" \
    "$build/tests/gpu/model_bench" llama-3-8b bfloat16 --decode-only --ctx "$c" --batch "$b" --profile-step \
    > "$out/model_bench_${pair}.log" 2>&1
  python3 "$(dirname "$0")/ncu_table.py" "$out/ncu_${pair}.csv" "$out/model_bench_${pair}.log" | tee "$out/table_${pair}.txt"
done
