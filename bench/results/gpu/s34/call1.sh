#!/usr/bin/env bash
# Session 34, call 1 (carry [".debs"]; timeout 600).
# A/B on one machine: A = main, B = mma_rowsum.diff (the softmax's row sums
# on the tensor cores: eight m64n8k16 against an all-ones B a key tile, no
# FADD in the softmax; key loop 915 -> 872 SASS instructions, no spills),
# C = mma_rowsum_pvdesc.diff: B + the P V descriptors as the tile's first
# plus each k-step's offset (wgmma::desc_plus; loop 872 -> 844). Prefill bench hd128 (bf16, f16, FP8 rows) 2k/4k/8k, hd64
# 4k/8k, 28/4 heads 4k; Llama-3-8B TTFT(8192) with BF16, INT8 and FP8
# pages; two rounds. Then C's prefill tests.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o --exclude='*.ncu-rep' --exclude='*.csv' . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
mb="model_bench llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192"
OUT=$o AB_PATCH="bench/results/gpu/s34/mma_rowsum.diff bench/results/gpu/s34/mma_rowsum_pvdesc.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=2048,4096,8192|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb;pb28|$k OSPREY_BENCH_HEADS=28,4,128 OSPREY_BENCH_CASES=4096|$pb;bf||$mb;i8||$mb --kv-cache-dtype int8;f8||$mb --kv-cache-dtype fp8" \
  AB_TEST='PrefillAttention.WgmmaTileBoundaries' AB_ROUNDS=2 timeout 360 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
timeout 130 /tmp/ab/C/gpu_tests --gtest_filter='PrefillAttention.*:AttentionTest.*PagesPrefill*' > $o/tests_C.txt 2>&1
echo "tests C rc=$? at $SECONDS" | tee -a $o/summary.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $o/tests_C.txt | tee -a $o/summary.txt; pack
