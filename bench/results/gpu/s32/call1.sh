#!/usr/bin/env bash
# Session 32, call 1: session 31's prepared next_call.sh (A = main, B = lazy
# O rescale, C = P V descriptors via desc_plus, D = B + C; then D's tests),
# plus main's own FP8/INT8 paged-prefill tests, which session 31 did not run
# on fb810ec.
set -uo pipefail
d=bench/results/gpu/s31
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$OUT AB_PATCH="$d/prefill_lazy_rescale.diff $d/prefill_pv_desc_plus.diff $d/prefill_pv_desc_plus_lazy_rescale.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=1024,2048,4096,8192|$pb;pbq|$k OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb" \
  AB_ROUNDS=2 timeout 420 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
for v in A D; do
  timeout 60 /tmp/ab/$v/gpu_tests --gtest_filter='PrefillAttention.*:AttentionTest.*PagesPrefill*' > $OUT/test_$v.txt 2>&1
  echo "tests $v rc=$? at $SECONDS" >> $OUT/ab.log
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_$v.txt >> $OUT/ab.log
done
