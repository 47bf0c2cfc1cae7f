#!/usr/bin/env bash
# Session 29, call 3: bench/gpu/ab.sh with A = main, B = the output store
# with stepped row offsets and its loads ahead of its stores
# (prefill_store.diff), C = B plus the per-block timeline. B's tests
# (PrefillAttention.*, the attention op's page-dtype prefill tests), the
# prefill bench (hd 128: 1k, 4k, 8k; hd 64: 4k, 8k; 28 / 4 heads at 4k),
# C's timeline at 1k and 4k.
set -uo pipefail
d=bench/results/gpu/s29
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
OUT=$OUT AB_PATCH="$d/prefill_store.diff $d/prefill_store_trace.diff" \
  AB_RUNS="pb128|OSPREY_BENCH_CASES=1024,4096,8192|$pb;pb64|OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb;pbq|OSPREY_BENCH_HEADS=28,4 OSPREY_BENCH_CASES=4096|$pb" \
  timeout 400 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
timeout 130 /tmp/ab/B/gpu_tests --gtest_filter='PrefillAttention.*:AttentionTest.*PagesPrefill*' > $OUT/test_B.txt 2>&1
echo "tests B rc=$? at $SECONDS" >> $OUT/ab.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_B.txt >> $OUT/ab.log
o=$OUT/tr; mkdir -p $o
for c in 1024 4096; do
  OSPREY_PREFILL_TRACE=10 OSPREY_PREFILL_TRACE_FILE=$o/tr128_$c.txt OSPREY_BENCH_CASES=$c timeout 30 /tmp/ab/C/$pb > $o/pb_tr128_$c.txt 2>&1
done
python3 bench/gpu/prefill_trace.py $o/tr128_*.txt > $OUT/trace_report.txt 2>&1
tar -czf $OUT/tr.tgz -C $o . && rm -rf $o
echo "done at $SECONDS" >> $OUT/ab.log
