#!/usr/bin/env bash
# Session 32, call 2: A = main, B = Q in registers as the A operand of S
# (prefill_q_regs.diff: wgmma RS for Q K^T, no Q descriptors; key loop 919
# -> 901 static instructions, no spills), C = B + the lazy O rescale of
# s31 (measured in call 1). Three rounds at 4k / 8k; then C's prefill and
# paged-prefill tests (FP8 and INT8 pages included) with time to finish.
set -uo pipefail
d=bench/results/gpu/s32
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$OUT AB_PATCH="$d/prefill_q_regs.diff $d/prefill_q_regs_lazy_rescale.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=4096,8192|$pb;pbq|$k OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb" \
  AB_ROUNDS=3 timeout 360 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
timeout 170 /tmp/ab/C/gpu_tests --gtest_filter='PrefillAttention.*:AttentionTest.*PagesPrefill*' > $OUT/test_C.txt 2>&1
echo "tests C rc=$? at $SECONDS" >> $OUT/ab.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_C.txt >> $OUT/ab.log
