#!/usr/bin/env bash
# Prepared in session 29, not run (no device time left): the block start's
# two patches, measured alone and together against main with
# bench/gpu/ab.sh. B = q copied with the rows' tokens and heads stepped
# (prefill_q_walk.diff: one division a thread in load_q, the store through
# the same RowWalk), C = the TMA copier's first page-table entries read
# before the block barrier (prefill_pt_prefetch.diff), D = both. D's tests,
# then D + the timeline at 4k (apply prefill_trace.diff over D by hand if
# it conflicts). ~8 minutes of device time.
set -uo pipefail
d=bench/results/gpu/s29
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
OUT=$OUT AB_PATCH="$d/prefill_q_walk.diff $d/prefill_pt_prefetch.diff $d/prefill_q_walk_pt_prefetch.diff" \
  AB_RUNS="pb128|OSPREY_BENCH_CASES=1024,4096,8192|$pb;pb64|OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb;pbq|OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb" \
  timeout 430 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
timeout 130 /tmp/ab/D/gpu_tests --gtest_filter='PrefillAttention.*:AttentionTest.*PagesPrefill*' > $OUT/test_D.txt 2>&1
echo "tests D rc=$? at $SECONDS" >> $OUT/ab.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_D.txt >> $OUT/ab.log
