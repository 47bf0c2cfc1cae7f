#!/usr/bin/env bash
# Session 30, call 3: bench/gpu/ab.sh with A = main, B = five ring slots
# (prefill_slots5_experiment.diff, call 2's C again), C = five slots with
# the shared memory of six allocated (prefill_slots5_pad_experiment.diff:
# is it the slot count or the L1 left beside the shared memory?), D = four
# slots (prefill_slots4_experiment.diff, the release rule written for any
# slot count), E = two row tiles a block with four slots
# (prefill_pair4_experiment.diff: 2 Q + 4 slots = the smem of 1 Q + 5).
# Then the tests of B, D and E.
set -uo pipefail
d=bench/results/gpu/s30
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
OUT=$OUT AB_PATCH="$d/prefill_slots5_experiment.diff $d/prefill_slots5_pad_experiment.diff $d/prefill_slots4_experiment.diff $d/prefill_pair4_experiment.diff" \
  AB_RUNS="pb128|OSPREY_BENCH_CASES=1024,4096,8192|$pb;pb64|OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb;pbq|OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb" \
  timeout 465 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
for v in B D E; do
  f='PrefillAttention.WgmmaTma*:PrefillAttention.LongPrompts*:PrefillAttention.WgmmaTile*:PrefillAttention.WgmmaVariantsCoverShapes'
  [[ $v == E ]] && f="PrefillAttention.WgmmaPairedTiles:PrefillAttention.WgmmaTma*"
  timeout 38 /tmp/ab/$v/gpu_tests --gtest_filter="$f" > $OUT/test_$v.txt 2>&1
  echo "tests $v rc=$? at $SECONDS" >> $OUT/ab.log
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $OUT/test_$v.txt >> $OUT/ab.log
done
