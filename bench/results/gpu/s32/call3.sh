#!/usr/bin/env bash
# Session 32, call 3 (replaces the earlier call-3 plan of a main-only run,
# which got no machine): A = main (eae9220), B = FP8 pages computing in F16
# under BF16 q too (prefill_f8_f16_compute.diff: codes widened to F16 in one
# conversion a pair, q rounded to F16 with saturation, output BF16; the
# copying warpgroup's loop 517 -> 325 static instructions). Two rounds at
# 4k / 8k, head_dim 128 and 64; then B's FP8 prefill tests. Sized to the
# session's device time left (~270 s of command).
set -uo pipefail
d=bench/results/gpu/s32
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$OUT AB_PATCH="$d/prefill_f8_f16_compute.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=4096,8192|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb" \
  AB_ROUNDS=2 timeout 210 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
timeout 45 /tmp/ab/B/gpu_tests --gtest_filter='PrefillAttention.F8*:AttentionTest.F8PagesPrefill*' > $OUT/test_B.txt 2>&1
echo "tests B rc=$? at $SECONDS" >> $OUT/ab.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $OUT/test_B.txt >> $OUT/ab.log
