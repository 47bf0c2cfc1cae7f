#!/usr/bin/env bash
# Prepared in session 35 for the next session (not run; carry [".debs"];
# ~8 minutes, timeout 560).
# A = main; B = s35/onebyte_tma.diff: one-byte pages' codes (F8_E4M3, and
# I8 with their row scales) into the staging area by the bulk tensor copy
# engine, for pages of a power-of-two size >= 8 (copy_kv_items_8_tma):
# copying warp w owns keys 32 w .. 32 w + 31 of each tile, its lanes
# u < 32 / box issue one box a page (or 32 rows of one: box = min(bs, 32))
# on the staging half's mbarrier (four arrivals, one a warp, with the
# boxes' bytes); the box holding the range's end by zero-filling cp.async
# (cp.async.mbarrier.arrive, no .noinc); a warp widens only its own keys,
# so a staging half is free again without waiting for the other warps;
# page-table entries a tile ahead in registers. Every staging and slot
# address is a base plus a constant. Static, hot path (the partial-box
# branch compiled out to count): FP8 copying loop 312 -> 246 SASS
# instructions, INT8 577 -> 454; no spills in the 52 kernels (16 new).
# Tests first: WgmmaTmaPageSizes now also over F8 and I8 pages (bit for bit
# against OSPREY_PREFILL_TMA=0, NaN past every sequence's end, pages of 4 ..
# 256), the float64 one-byte tests (pages of 16 take TMA, of 24 cp.async).
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o --exclude='*.ncu-rep' --exclude='*.csv' . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
mb="model_bench llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192"
m1="model_bench llama-3.2-1b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192"
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$o AB_PATCH="bench/results/gpu/s35/onebyte_tma.diff" \
  AB_TEST='PrefillAttention.WgmmaTmaPageSizes:PrefillAttention.*PagesWgmmaMatchFloat64:PrefillAttention.RepeatableBitForBit:AttentionTest.*PagesPrefill*' \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=4096,8192|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb;f8||$mb --kv-cache-dtype fp8;i8||$mb --kv-cache-dtype int8;i8s||$m1 --kv-cache-dtype int8" \
  AB_ROUNDS=2 timeout 430 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; grep -E "PASSED|FAILED|rc=[1-9]" $o/ab.log | tee -a $o/summary.txt
python3 bench/gpu/ab_table.py $o/ab.tgz | tee $o/ab_table.md; pack
