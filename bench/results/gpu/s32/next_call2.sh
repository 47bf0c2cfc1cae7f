#!/usr/bin/env bash
# Prepared in session 32 (not run yet; carry [".debs"]; ~8 minutes).
# 1. Main: the prefill bench at 1k-8k (two rounds) and PyTorch SDPA (cuDNN,
#    FlashAttention-2) on the same card (target 6's same-run peers; last in
#    session 28).
# 2. Llama-3-8B TTFT(8192) with INT8 and FP8 pages, main against
#    prefill_kv8_ent_ahead.diff (ab.sh, one round each), and with BF16 pages
#    on main (in A's runs).
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
g=$(find build-gpu -name gpu_tests -type f | head -1)
for r in 1 2; do
  OSPREY_BENCH_KERNELS=wgmma3 timeout 30 $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*' > $o/pb128_r$r.txt 2>&1
done
echo "pb at $SECONDS" | tee -a $o/summary.txt; pack
timeout 60 python3 tests/gpu/bench/sdpa_peer.py > $o/sdpa.txt 2>&1; echo "sdpa rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
mb="model_bench llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192 --kv-cache-dtype"
OUT=$o AB_PATCH="bench/results/gpu/s32/prefill_kv8_ent_ahead.diff" \
  AB_RUNS="i8||$mb int8;f8||$mb fp8;bf16||$mb auto" AB_ROUNDS=1 timeout 300 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
