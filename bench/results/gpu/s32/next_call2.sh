#!/usr/bin/env bash
# Prepared in session 32 (not run yet; carry [".debs"]; ~5 minutes): main
# alone. The prefill bench at 1k-8k (two rounds), PyTorch SDPA (cuDNN,
# FlashAttention-2) on the same card (target 6's same-run peers; last in
# session 28), Llama-3-8B TTFT(8192) with BF16 and FP8 pages.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
g=$(find build-gpu -name gpu_tests -type f | head -1); m=$(find build-gpu -name model_bench -type f | head -1)
for r in 1 2; do
  OSPREY_BENCH_KERNELS=wgmma3 timeout 30 $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*' > $o/pb128_r$r.txt 2>&1
done
echo "pb at $SECONDS" | tee -a $o/summary.txt; pack
timeout 60 python3 tests/gpu/bench/sdpa_peer.py > $o/sdpa.txt 2>&1; echo "sdpa rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
for kv in auto fp8; do
  timeout 45 $m llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192 --kv-cache-dtype $kv > $o/mb8b8k_${kv}.txt 2>&1
  echo "mb $kv rc=$? at $SECONDS" | tee -a $o/summary.txt
done
grep -H "TTFT\|paged_attention" $o/mb*.txt | tee -a $o/summary.txt; pack
