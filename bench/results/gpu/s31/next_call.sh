#!/usr/bin/env bash
# Prepared in session 31 for the next session's first call (not run yet):
# bench/gpu/ab.sh with A = main, B = a lazy O rescale
# (prefill_lazy_rescale.diff: the running max moves only when a tile's row
# max exceeds it by more than 8 in the log2 domain, so P <= 2^8, and the
# 64 FMUL of the O rescale are skipped when no row of the warp moved it;
# compile-checked, no spills, no serialised wgmma in SASS), C = the P V
# descriptors as the tile's first plus an offset (prefill_pv_desc_plus.diff:
# as fb810ec did for S; key loop 919 -> 904 instructions, static count),
# D = B + C. Then D's prefill and paged-prefill tests (FP8 and INT8 pages
# included).
set -uo pipefail
d=bench/results/gpu/s31
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
OUT=$OUT AB_PATCH="$d/prefill_lazy_rescale.diff $d/prefill_pv_desc_plus.diff $d/prefill_pv_desc_plus_lazy_rescale.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=1024,2048,4096,8192|$pb;pbq|$k OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb" \
  AB_ROUNDS=2 timeout 330 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
timeout 120 /tmp/ab/D/gpu_tests --gtest_filter='PrefillAttention.*:AttentionTest.*PagesPrefill*' > $OUT/test_D.txt 2>&1
echo "tests D rc=$? at $SECONDS" >> $OUT/ab.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_D.txt >> $OUT/ab.log
