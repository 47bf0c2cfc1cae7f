#!/usr/bin/env bash
# Session 30, call 2: bench/gpu/ab.sh with A = main (q rows stepped, landed),
# B = the step timeline (prefill_step_trace.diff: session 29's per-block
# timeline plus clocks at the phases of the middle key tile of each
# computing warpgroup), C = a five-slot ring with one row tile a block
# (prefill_slots5_experiment.diff: what the paired kernel's ring costs on
# its own), D = two row tiles a block with a timeline
# (prefill_pair_trace.diff). Then the traces of B (4k, 8k) and D (4k
# paired and not, 8k paired), and main's PrefillAttention tests.
set -uo pipefail
d=bench/results/gpu/s30
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
OUT=$OUT AB_PATCH="$d/prefill_step_trace.diff $d/prefill_slots5_experiment.diff $d/prefill_pair_trace.diff" \
  AB_RUNS="pb128|OSPREY_BENCH_CASES=4096,8192|$pb" timeout 330 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" >> $OUT/ab.log
o=$OUT/tr; mkdir -p $o
for c in 4096 8192; do
  OSPREY_PREFILL_TRACE=10 OSPREY_PREFILL_TRACE_FILE=$o/step_$c.txt OSPREY_BENCH_CASES=$c timeout 40 /tmp/ab/B/$pb > $o/pb_step_$c.txt 2>&1
  OSPREY_PREFILL_TRACE=10 OSPREY_PREFILL_TRACE_FILE=$o/pair_$c.txt OSPREY_BENCH_CASES=$c timeout 40 /tmp/ab/D/$pb > $o/pb_pair_$c.txt 2>&1
done
OSPREY_PREFILL_PAIR=0 OSPREY_PREFILL_TRACE=10 OSPREY_PREFILL_TRACE_FILE=$o/nopair_4096.txt OSPREY_BENCH_CASES=4096 timeout 40 /tmp/ab/D/$pb > $o/pb_nopair_4096.txt 2>&1
python3 bench/gpu/prefill_trace.py $o/step_*.txt > $OUT/trace_report.txt 2>&1
tar -czf $OUT/tr.tgz -C $o . && rm -rf $o
echo "traces done at $SECONDS" >> $OUT/ab.log
timeout 150 /tmp/ab/A/gpu_tests --gtest_filter='PrefillAttention.*:AttentionTest.*PagesPrefill*' > $OUT/test_A.txt 2>&1
echo "tests A rc=$? at $SECONDS" >> $OUT/ab.log
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test_A.txt >> $OUT/ab.log
