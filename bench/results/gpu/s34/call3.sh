#!/usr/bin/env bash
# Session 34, call 3 (carry [".debs"]; the session's last ~360 s of device
# time). A = main (cb4ddee: one-byte staging loads ahead at head_dim 128
# only), B = hd64_ahead2.diff (two at a time at head_dim 64; four lost
# 2-4% there in call 2). Prefill bench head_dim 64, FP8 rows, two rounds.
set -uo pipefail
o=$OUT/r; mkdir -p $o
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
OUT=$o AB_PATCH="bench/results/gpu/s34/hd64_ahead2.diff" \
  AB_RUNS="pb64|OSPREY_BENCH_KERNELS=wgmma3 OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=2048,4096,8192|$pb" \
  AB_ROUNDS=2 timeout 150 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt
