#!/usr/bin/env bash
# Prepared in session 29, not run (no device time left): the block start's
# patches against main with bench/gpu/ab.sh. B = q copied with the rows'
# tokens and heads stepped (prefill_q_walk.diff: one division a thread in
# load_q, the store through the same RowWalk), C = the TMA copier's first
# page-table entries read before the block barrier (prefill_pt_prefetch.diff),
# D = two row tiles a block (prefill_pair_tiles_experiment.diff, B included:
# variant 3 with TMA where the one-tile grid is >= 4x the SMs, so 4k and 8k
# in the bench, not 1k or 2k). D's tests (WgmmaPairedTiles is new) and C's.
# ~9 minutes of device time.
set -uo pipefail
d=bench/results/gpu/s29
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
OUT=$OUT AB_PATCH="$d/prefill_q_walk.diff $d/prefill_pt_prefetch.diff $d/prefill_pair_tiles_experiment.diff" \
  AB_RUNS="pb128|OSPREY_BENCH_CASES=1024,4096,8192|$pb;pb64|OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb;pbq|OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb" \
  timeout 430 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
for v in D C; do
  f='PrefillAttention.WgmmaTma*:PrefillAttention.LongPrompts*:PrefillAttention.WgmmaTile*'
  [[ $v == D ]] && f="PrefillAttention.WgmmaPairedTiles:$f"
  timeout 80 /tmp/ab/$v/gpu_tests --gtest_filter="$f" > $OUT/test_$v.txt 2>&1
  echo "tests $v rc=$? at $SECONDS" >> $OUT/ab.log
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_$v.txt >> $OUT/ab.log
done
