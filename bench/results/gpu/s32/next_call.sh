#!/usr/bin/env bash
# Prepared in session 32 for the next session's first call (not run yet;
# carry [".debs"]; ~8 minutes, timeout 590).
# 1. Main's FP8 tests, which 139fe10 (FP8 pages computing in F16 under BF16
#    q) did not get to run on a GPU: PrefillAttention.F8PagesWgmmaMatchFloat64,
#    RepeatableBitForBit, F8PagesBf16QBeyondF16Range. If one fails, 139fe10
#    is reverted or fixed before anything else.
# 2. A/B (bench/gpu/ab.sh; A = the tree, already built by step 1) of
#    prefill_kv8_ent_ahead.diff: one-byte pages' copying threads take each
#    tile's page-table entries from shared memory, copied there (cp.async,
#    one a lane) with the previous tile's K item, instead of a dependent
#    global load right before each K item's copies (copying loop, static:
#    F8 325 -> 309, I8 801 -> 784 instructions; no spills in any of the 36
#    kernels; only the one-byte kernels' SASS changes). The prefill bench
#    has FP8 rows only; next_call2.sh measures INT8 through the model.
# 3. B's one-byte prefill tests.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
g=$(find build-gpu -name gpu_tests -type f | head -1)
timeout 150 $g --gtest_filter='PrefillAttention.F8*:PrefillAttention.RepeatableBitForBit' > $o/tests_f8.txt 2>&1
echo "tests f8 rc=$? at $SECONDS" | tee -a $o/summary.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $o/tests_f8.txt | tee -a $o/summary.txt; pack
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$o AB_PATCH="bench/results/gpu/s32/prefill_kv8_ent_ahead.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=2048,4096,8192|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb" \
  AB_ROUNDS=2 timeout 150 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
timeout 170 /tmp/ab/B/gpu_tests --gtest_filter='PrefillAttention.F8*:PrefillAttention.RepeatableBitForBit:AttentionTest.*PagesPrefill*' > $o/tests_B.txt 2>&1
echo "tests B rc=$? at $SECONDS" | tee -a $o/summary.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $o/tests_B.txt | tee -a $o/summary.txt; pack
