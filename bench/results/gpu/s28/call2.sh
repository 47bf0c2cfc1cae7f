#!/usr/bin/env bash
# Session 28, call 2: the tree with the four-warp TMA issue and TMA by default
# at window 0 (both head dims); same binary, OSPREY_PREFILL_TMA=0 / 1 / unset.
set -uo pipefail
o=$OUT/r; mkdir -p $o
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
b=build-gpu/tests/gpu
g=$(find build-gpu -name gpu_tests -type f | head -1); m=$(find build-gpu -name model_bench -type f | head -1)
timeout 200 $g --gtest_filter='PrefillAttention.*:AttentionTest.*' > $o/tests.txt 2>&1; echo "tests rc=$? at $SECONDS" | tee -a $o/summary.txt
grep -E "PASSED|FAILED" $o/tests.txt | tee -a $o/summary.txt
pb() { $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*'; }
for r in 1 2; do
  for t in 0 1; do
    OSPREY_PREFILL_TMA=$t OSPREY_BENCH_CASES=2048,4096,8192,16384,4x2048 pb > $o/pb128_t${t}_r$r.txt 2>&1
    OSPREY_PREFILL_TMA=$t OSPREY_BENCH_HEADS=32,8,128,4096 OSPREY_BENCH_CASES=8192,16384 pb > $o/pbwin_t${t}_r$r.txt 2>&1
    OSPREY_PREFILL_TMA=$t OSPREY_BENCH_HEADS=28,4,128 OSPREY_BENCH_CASES=1024,4096,8192 pb > $o/pbqwen_t${t}_r$r.txt 2>&1
  done
  echo "pb r$r at $SECONDS" | tee -a $o/summary.txt
done
for t in 0 1; do
  OSPREY_PREFILL_TMA=$t timeout 60 $m llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192 > $o/mb8b8k_t$t.txt 2>&1
  OSPREY_PREFILL_TMA=$t timeout 60 $m llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 2048 > $o/mb8b2k_t$t.txt 2>&1
  echo "mb t$t at $SECONDS" | tee -a $o/summary.txt
done
timeout 60 $m llama-3.2-1b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192 > $o/mb1b8k.txt 2>&1
grep -H "TTFT\|paged_attention" $o/mb*.txt | tee -a $o/summary.txt
tar -czf $OUT/all.tgz -C $o . && rm -rf $o/*.txt
