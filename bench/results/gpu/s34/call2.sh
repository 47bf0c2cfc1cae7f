#!/usr/bin/env bash
# Session 34, call 2: session 33's next_call.sh as prepared (carry [".debs"];
# ~9 minutes, timeout 590).
# 1. Same-machine A/B of 23387d9 (conflict-free widening of one-byte pages,
#    measured in session 33 only across two machines): A = main, B = main
#    without it (widen_other_key_reverted.diff). Prefill bench FP8 rows
#    (hd128 2k/4k/8k, hd64 4k/8k) and Llama-3-8B TTFT(8192) with INT8 and
#    FP8 pages (its attention line), two rounds.
#    C = widen_loads_ahead.diff: the copying threads issue their staging
#    loads four at a time (INT8: two) before widening them; main's SASS
#    waits on each 16-byte staging load right before its eight
#    conversions (call 3's profile: the copying loop's top stalls are
#    short-scoreboard waits on those loads). Static: no spills in the 36
#    kernels, the FP8 copying loop 545 -> 544 instructions. C's one-byte
#    prefill tests after the A/B.
# 2. ncu --set full of main's FP8 kernel at 4k (A's kept binary): what
#    bounds it now.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o --exclude='*.ncu-rep' --exclude='*.csv' . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
mb="model_bench llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192 --kv-cache-dtype"
OUT=$o AB_PATCH="bench/results/gpu/s33/widen_other_key_reverted.diff bench/results/gpu/s33/widen_loads_ahead.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=2048,4096,8192|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb;i8||$mb int8;f8||$mb fp8" \
  AB_ROUNDS=2 timeout 340 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
timeout 80 /tmp/ab/C/gpu_tests --gtest_filter='AttentionTest.*PagesPrefill*:PrefillAttention.F8*:PrefillAttention.RepeatableBitForBit' > $o/tests_C.txt 2>&1
echo "tests C rc=$? at $SECONDS" | tee -a $o/summary.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $o/tests_C.txt | tee -a $o/summary.txt; pack
g=/tmp/ab/A/gpu_tests  # main (ab.sh keeps each variant's binaries)
n=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
OSPREY_BENCH_KERNELS=wgmma3 OSPREY_BENCH_CASES=4096 timeout 80 $n --set full --import-source yes --clock-control none \
  --kernel-name-base mangled -k regex:ws_kernelILb0ELb1ELi1ELi128E --launch-skip 3 --launch-count 1 -o $o/rep_f8 $g \
  --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*' > $o/ncu_f8.log 2>&1
echo "ncu rc=$? at $SECONDS" | tee -a $o/summary.txt
$n --import $o/rep_f8.ncu-rep --page raw --csv > $o/raw_f8.csv 2>&1
$n --import $o/rep_f8.ncu-rep --page source --csv --print-source sass > $o/sass_f8.csv 2>&1
python3 bench/gpu/ncu_sass.py $o/sass_f8.csv --top 25 > $o/ncu_sass_f8.txt 2>&1
python3 bench/gpu/ncu_metrics.py $o/raw_f8.csv > $o/ncu_metrics_f8.txt 2>&1
grep -E "duration|tensor_cycles|conflicts_pipe_lsu_mem_shared_op_(st|ld|ldgsts).sum" $o/ncu_metrics_f8.txt | tee -a $o/summary.txt; pack
