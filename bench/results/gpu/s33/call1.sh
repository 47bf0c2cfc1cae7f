#!/usr/bin/env bash
# Session 33, call 1 (carry [".debs"]; timeout 600): s32/next_call.sh with
# the decode q saturation test added.
# 1. Main's FP8 prefill tests that 139fe10 did not get to run on a GPU
#    (F8PagesWgmmaMatchFloat64, RepeatableBitForBit, F8PagesBf16QBeyondF16Range).
# 2. The decode kernel's q saturation (f32x2_to_half2_bits_satfinite):
#    OneBytePagesDecodeSaturateBf16QBeyondHalf and the one-byte decode sweeps.
# 3. A/B of s32/prefill_kv8_ent_ahead.diff on the prefill bench (FP8 rows).
# 4. B's one-byte prefill tests.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
g=$(find build-gpu -name gpu_tests -type f | head -1)
res() { grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $1 | tee -a $o/summary.txt; }
timeout 150 $g --gtest_filter='PrefillAttention.F8*:PrefillAttention.RepeatableBitForBit' > $o/tests_f8.txt 2>&1
echo "tests f8 rc=$? at $SECONDS" | tee -a $o/summary.txt; res $o/tests_f8.txt; pack
timeout 90 $g --gtest_filter='AttentionTest.OneBytePagesDecode*:AttentionTest.F8PagesDecode*:AttentionTest.I8PagesDecode*' > $o/tests_dec.txt 2>&1
echo "tests dec rc=$? at $SECONDS" | tee -a $o/summary.txt; res $o/tests_dec.txt; pack
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$o AB_PATCH="bench/results/gpu/s32/prefill_kv8_ent_ahead.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=2048,4096,8192|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb" \
  AB_ROUNDS=2 timeout 140 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
left=$((585 - SECONDS)); ((left > 20)) || left=20
timeout $left /tmp/ab/B/gpu_tests --gtest_filter='PrefillAttention.F8*:AttentionTest.*PagesPrefill*' > $o/tests_B.txt 2>&1
echo "tests B rc=$? at $SECONDS" | tee -a $o/summary.txt; res $o/tests_B.txt; pack
