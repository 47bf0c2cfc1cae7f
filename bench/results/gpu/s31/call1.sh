#!/usr/bin/env bash
# Session 31, call 1: bench/gpu/ab.sh with A = main, B = four ring slots
# (s30's prefill_slots4_experiment.diff, to confirm), C..F = four slots
# plus 1, 2, 3 or 4 of every 8 exp2s of the softmax on the FMA pipe
# (poly_exp2: floor by a rounding-down add, degree-3 polynomial, 2^j from
# the bits). Only the default kernel (wgmma3) runs, BF16 / F16 / FP8 pages.
# Then the prefill tests of D and F.
set -uo pipefail
d=bench/results/gpu/s31
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$OUT AB_PATCH="$d/prefill_slots4.diff $d/prefill_slots4_poly1.diff $d/prefill_slots4_poly2.diff $d/prefill_slots4_poly3.diff $d/prefill_slots4_poly4.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=4096,8192|$pb;pbq|$k OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096|$pb" \
  timeout 470 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
for v in D F; do
  f='PrefillAttention.LongPrompts*:PrefillAttention.WgmmaTile*:PrefillAttention.WgmmaTma*:PrefillAttention.EveryBlockShape*'
  timeout 40 /tmp/ab/$v/gpu_tests --gtest_filter="$f" > $OUT/test_$v.txt 2>&1
  echo "tests $v rc=$? at $SECONDS" >> $OUT/ab.log
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $OUT/test_$v.txt >> $OUT/ab.log
done
