#!/usr/bin/env bash
# Session 29, call 2: bench/gpu/ab.sh with A = main, B = the warp-specialised
# kernel's prologue without the block-wide wait for q (prefill_prologue.diff),
# C = B plus the per-block timeline, D = one-byte pages' staging by TMA, v2
# (prefill_byte_tma_v2_experiment.diff). Tests of B and D; the prefill bench
# (hd 128: 1k, 4k, 8k; hd 64: 4k, 8k; bf16 and f8 rows); C's timeline at 4k.
set -uo pipefail
d=bench/results/gpu/s29
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
OUT=$OUT AB_PATCH="$d/prefill_prologue.diff $d/prefill_prologue_trace.diff $d/prefill_byte_tma_v2_experiment.diff" \
  AB_RUNS="pb128|OSPREY_BENCH_CASES=1024,4096,8192|$pb;pb64|OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb" \
  timeout 470 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
t='PrefillAttention.*:AttentionTest.*PagesPrefill*'
for v in B D; do
  timeout 75 /tmp/ab/$v/gpu_tests --gtest_filter="$t" > $OUT/test_$v.txt 2>&1
  echo "tests $v rc=$? at $SECONDS" >> $OUT/ab.log
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_$v.txt >> $OUT/ab.log
done
o=$OUT/tr; mkdir -p $o
for c in 1024 4096; do
  OSPREY_PREFILL_TRACE=10 OSPREY_PREFILL_TRACE_FILE=$o/tr128_$c.txt OSPREY_BENCH_CASES=$c timeout 30 /tmp/ab/C/$pb > $o/pb_tr128_$c.txt 2>&1
done
python3 bench/gpu/prefill_trace.py $o/tr128_*.txt > $OUT/trace_report.txt 2>&1
tar -czf $OUT/tr.tgz -C $o . && rm -rf $o
echo "done at $SECONDS" >> $OUT/ab.log
