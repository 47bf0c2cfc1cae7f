#!/usr/bin/env bash
# Session 31, call 2: bench/gpu/ab.sh with A = main, B = four ring slots
# (prefill_slots4.diff), C = four slots + S_t issued as two 64-key halves
# (prefill_slots4_split_s.diff: the first half's softmax runs while the
# tensor cores compute the second). Only the default kernel (wgmma3).
# Then C's prefill and paged-prefill tests.
set -uo pipefail
d=bench/results/gpu/s31
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$OUT AB_PATCH="$d/prefill_slots4.diff $d/prefill_slots4_split_s.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=1024,2048,4096,8192|$pb;pbq|$k OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb" \
  timeout 330 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
timeout 170 /tmp/ab/C/gpu_tests --gtest_filter='PrefillAttention.*:AttentionTest.*PagesPrefill*' > $OUT/test_C.txt 2>&1
echo "tests C rc=$? at $SECONDS" >> $OUT/ab.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $OUT/test_C.txt >> $OUT/ab.log
