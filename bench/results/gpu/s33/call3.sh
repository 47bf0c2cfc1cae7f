#!/usr/bin/env bash
# Session 33, call 3 (carry [".debs"]; timeout 600). Main = 587035c (page-
# table entries ahead for one-byte pages) + ab.sh's object cleanup.
# 1. ncu --set full of the wgmma prefill kernel at 4k over F8 pages (bf16 q)
#    and over BF16 pages (TMA), one steady launch each: where FP8 prompt
#    attention's time goes against BF16's (the copying warpgroup?).
# 2. Llama-3-8B TTFT(8192) with INT8 and FP8 pages, main (A) against main
#    without 587035c (B = ent_ahead_reverted.diff), two rounds: the INT8
#    figure the prefill bench cannot give.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o --exclude='*.ncu-rep' --exclude='*.csv' . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
g=$(find build-gpu -name gpu_tests -type f | head -1)
n=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
metrics() {  # raw csv -> the metric lines session 28 kept
  python3 - "$1" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], newline="")) if r]
h = next(i for i, r in enumerate(rows) if "gpu__time_duration.sum" in r)
head, units, val = rows[h], rows[h + 1], rows[h + 2]
keep = ("gpu__time_duration.sum", "launch__registers_per_thread", "lts__t_sectors.avg.pct", "sm__inst_executed_pipe_",
        "sm__pipe_tensor_cycles_active.avg.pct", "smsp__inst_executed.sum", "smsp__issue_active.avg.pct",
        "smsp__pcsamp_warps_issue_stalled_", "dram__bytes_read.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared")
for i, name in enumerate(head):
    if name.startswith(keep) and not name.endswith("_not_issued"):
        print(f"  {name:75s} {val[i]} {units[i]}")
PY
}
for tag in f8:ws_kernelILb0ELb1ELi1ELi128E bf16:ws_kernelILb0ELb1ELi0ELi128ELb1E; do
  t=${tag%%:*}; k=${tag#*:}
  OSPREY_BENCH_KERNELS=wgmma3 OSPREY_BENCH_CASES=4096 timeout 100 $n --set full --import-source yes --clock-control none \
    --kernel-name-base mangled -k regex:$k --launch-skip 3 --launch-count 1 -o $o/rep_$t $g --gtest_also_run_disabled_tests \
    --gtest_filter='*PrefillAttentionBench*' > $o/ncu_$t.log 2>&1
  echo "ncu $t rc=$? at $SECONDS" | tee -a $o/summary.txt
  $n --import $o/rep_$t.ncu-rep --page raw --csv > $o/raw_$t.csv 2>&1
  metrics $o/raw_$t.csv > $o/ncu_metrics_$t.txt 2>&1
  $n --import $o/rep_$t.ncu-rep --page source --csv --print-source sass > $o/sass_$t.csv 2>&1
  python3 bench/gpu/ncu_sass.py $o/sass_$t.csv --top 25 > $o/ncu_sass_$t.txt 2>&1
  head -3 $o/ncu_metrics_$t.txt | tee -a $o/summary.txt; pack
done
mb="model_bench llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192 --kv-cache-dtype"
OUT=$o AB_PATCH="bench/results/gpu/s33/ent_ahead_reverted.diff" \
  AB_RUNS="i8||$mb int8;f8||$mb fp8" AB_ROUNDS=2 timeout 200 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
