#!/usr/bin/env bash
# Prepared in session 34 for the next session (not run; carry [".debs"];
# ~7 minutes, timeout 590).
# A = main, B = i8_f16_widen.diff: the wgmma prefill kernel computes in F16
# over INT8 pages too (as over FP8 pages; the decode kernel already does),
# and its copier widens I8 codes with a byte permute, a packed subtraction
# and two packed multiplies a pair (the row scale rounded to F16, clamped
# to 515 so 127 x scale stays finite; scales below F16's normal range go
# through 2^16 and back) instead of a permute, an add and a multiply a code
# in fp32 and a pack a pair. Static: INT8 copying loop 788 -> 637 SASS
# instructions (pow2 pages; 913 -> 762 otherwise), no spills. New GPU test
# AttentionTest.I8PagesPrefillVBeyondHalfSaturates.
# 1. B's I8 and one-byte prefill tests first (the numerics change).
# 2. A/B, two rounds: Llama-3-8B and Llama-3.2-1B TTFT(8192) with INT8
#    pages (the prompt-attention line), FP8 pages and the prefill bench's
#    FP8 rows as controls (unchanged kernels).
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o --exclude='*.ncu-rep' --exclude='*.csv' . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
mb="model_bench llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192"
m1="model_bench llama-3.2-1b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192"
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
OUT=$o AB_PATCH="bench/results/gpu/s34/i8_f16_widen.diff" \
  AB_TEST='AttentionTest.I8*:AttentionTest.*PagesPrefill*:PrefillAttention.RepeatableBitForBit' \
  AB_RUNS="i8||$mb --kv-cache-dtype int8;i8s||$m1 --kv-cache-dtype int8;f8||$mb --kv-cache-dtype fp8;pb128|OSPREY_BENCH_KERNELS=wgmma3 OSPREY_BENCH_CASES=4096,8192|$pb" \
  AB_ROUNDS=2 timeout 420 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; grep -E "PASSED|FAILED" $o/ab.log | tee -a $o/summary.txt; pack
