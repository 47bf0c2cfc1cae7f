#!/usr/bin/env bash
# Session 35 call 1 (session 34's next_call.sh; carry [".debs"];
# ~9 minutes, timeout 595).
# A = main; B = i8_f16_widen.diff; C = prefill_tma_q.diff.
# B: the wgmma prefill kernel computes in F16 over INT8 pages too (as over
#    FP8 pages; the decode kernel already does), and its copier widens I8
#    codes with a byte permute, a packed subtraction and two packed
#    multiplies a pair (the row scale rounded to F16, clamped to 515 so
#    127 x scale stays finite; scales below F16's normal range go through
#    2^16 and back) instead of a permute, an add and a multiply a code in
#    fp32 and a pack a pair. Static: INT8 copying loop 788 -> 637 SASS
#    instructions (pow2 pages; 913 -> 762 otherwise), no spills. New test
#    AttentionTest.I8PagesPrefillVBeyondHalfSaturates.
# C: the Q tile by TMA (thread 0, one box a 64-element panel, its own
#    mbarrier that only the computing warpgroups wait for) where G divides
#    128: the block barrier no longer waits for q, so the first K/V tile's
#    copies start once the key bounds are known (session 29's timeline:
#    entry to q in place 5,353 cycles, then 1,700 more to the first K
#    tile). OSPREY_PREFILL_TMA_Q=0 for A/B. New test
#    PrefillAttention.WgmmaTmaQMatchesCpAsyncQ (bit for bit against
#    cp.async q, and float64). Key loop SASS the same but for a few
#    uniform moves; no spills.
# AB_TEST runs the variants' new and nearby tests; then two rounds of:
# Llama-3-8B / Llama-3.2-1B TTFT(8192) with INT8 pages, Llama-3-8B with FP8
# and BF16 pages, the prefill bench (hd128 4k/8k all dtypes; hd64 4k/8k).
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o --exclude='*.ncu-rep' --exclude='*.csv' . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
mb="model_bench llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192"
m1="model_bench llama-3.2-1b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192"
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$o AB_PATCH="bench/results/gpu/s34/i8_f16_widen.diff bench/results/gpu/s34/prefill_tma_q.diff" \
  AB_TEST='AttentionTest.I8Pages*:PrefillAttention.WgmmaTmaQ*:PrefillAttention.WgmmaTileBoundaries:PrefillAttention.RepeatableBitForBit' \
  AB_RUNS="i8||$mb --kv-cache-dtype int8;i8s||$m1 --kv-cache-dtype int8;f8||$mb --kv-cache-dtype fp8;bf||$mb;pb128|$k OSPREY_BENCH_CASES=4096,8192|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb" \
  AB_ROUNDS=2 timeout 470 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; grep -E "PASSED|FAILED|rc=[1-9]" $o/ab.log | tee -a $o/summary.txt
python3 bench/gpu/ab_table.py $o/ab.tgz | tee $o/ab_table.md; pack
