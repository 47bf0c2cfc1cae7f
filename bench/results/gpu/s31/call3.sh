#!/usr/bin/env bash
# Session 31, call 3: bench/gpu/ab.sh with A = main (four ring slots,
# landed), B = the S descriptors as the tile's first plus an offset
# (prefill_desc_plus.diff: -14 instructions a key tile, static count),
# C = B + the softmax's partial maxima and sums started from the scores
# (prefill_desc_plus_init.diff: -30). Then main's prefill and paged-prefill
# tests, and C's prefill tests.
set -uo pipefail
d=bench/results/gpu/s31
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$OUT AB_PATCH="$d/prefill_desc_plus.diff $d/prefill_desc_plus_init.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=2048,4096,8192|$pb;pbq|$k OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096|$pb" \
  timeout 270 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
timeout 100 /tmp/ab/A/gpu_tests --gtest_filter='PrefillAttention.*:AttentionTest.*PagesPrefill*' > $OUT/test_A.txt 2>&1
echo "tests A rc=$? at $SECONDS" >> $OUT/ab.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_A.txt >> $OUT/ab.log
f='PrefillAttention.LongPrompts*:PrefillAttention.WgmmaTile*:PrefillAttention.WgmmaTma*:PrefillAttention.EveryBlockShape*:PrefillAttention.MixedStep*'
timeout 40 /tmp/ab/C/gpu_tests --gtest_filter="$f" > $OUT/test_C.txt 2>&1
echo "tests C rc=$? at $SECONDS" >> $OUT/ab.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_C.txt >> $OUT/ab.log
