#!/usr/bin/env bash
# Session 29, call 1: bench/gpu/ab.sh with A = main, B = the per-block
# timeline patch (prefill_trace.diff), C = the TMA copier's page-table loads
# by the issuing warp only (prefill_tma_pt_dedup.diff); then B's gpu_tests
# writes the timeline of one launch at 1k, 4k and 8k tokens (hd 128) and 4k
# (hd 64), read by bench/gpu/prefill_trace.py. (This call ran the first
# version of prefill_trace.diff: 12 fields, q in place at the block barrier;
# the file now holds the 16-field version of calls 2 and 3.)
set -uo pipefail
d=bench/results/gpu/s29
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
OUT=$OUT AB_PATCH="$d/prefill_trace.diff $d/prefill_tma_pt_dedup.diff" AB_TEST='PrefillAttention.WgmmaTma*' \
  AB_RUNS="pb128|OSPREY_BENCH_CASES=1024,4096,8192|$pb" timeout 420 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
o=$OUT/tr; mkdir -p $o
for c in 1024 4096 8192; do
  OSPREY_PREFILL_TRACE=10 OSPREY_PREFILL_TRACE_FILE=$o/tr128_$c.txt OSPREY_BENCH_CASES=$c timeout 60 /tmp/ab/B/$pb > $o/pb_tr128_$c.txt 2>&1
done
OSPREY_PREFILL_TRACE=10 OSPREY_PREFILL_TRACE_FILE=$o/tr64_4096.txt OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096 timeout 60 /tmp/ab/B/$pb > $o/pb_tr64_4096.txt 2>&1
python3 bench/gpu/prefill_trace.py $o/tr128_*.txt $o/tr64_4096.txt > $OUT/trace_report.txt 2>&1
tar -czf $OUT/tr.tgz -C $o . && rm -rf $o
echo "done at $SECONDS" >> $OUT/ab.log
