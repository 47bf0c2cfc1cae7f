#!/usr/bin/env bash
# Session 36, call 2 (carry [".debs"]; ~5 minutes, timeout 400).
# A = main with DISABLED_PrefillLaunchHostCost (the host's time to enqueue
# one wgmma prefill launch: tensor maps encoded for K/V and q, for K/V
# only, none).
# B = s36/tmap_cache.diff: launches take their tensor maps from the
# thread's last eight encodes where the arguments are the same (new test
# PrefillAttention.WgmmaTensorMapsReused).
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o --exclude='*.ncu-rep' --exclude='*.csv' . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
hc="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillLaunchHostCost*"
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$o AB_PATCH="bench/results/gpu/s36/tmap_cache.diff" \
  AB_TEST='PrefillAttention.WgmmaTensorMapsReused:PrefillAttention.WgmmaTma*:PrefillAttention.RepeatableBitForBit:PrefillAttention.*PagesWgmmaMatchFloat64' \
  AB_RUNS="hc||$hc;pb128|$k OSPREY_BENCH_CASES=1024,4096|$pb" \
  AB_ROUNDS=3 timeout 330 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; grep -E "PASSED|FAILED|rc=[1-9]" $o/ab.log | tee -a $o/summary.txt
python3 bench/gpu/ab_table.py $o/ab.tgz | tee $o/ab_table.md
mkdir -p $o/x && tar -xzf $o/ab.tgz -C $o/x && for f in $o/x/hc_*; do echo "== $(basename $f)"; grep -E "^(bf16|f8|i8) " $f; done | tee $o/hc.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $o/x/test_*.txt | tee -a $o/summary.txt; rm -rf $o/x; pack
