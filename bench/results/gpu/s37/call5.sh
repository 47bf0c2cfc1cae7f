#!/usr/bin/env bash
# Session 37, call 5 (carry [".debs"]; the session's last ~350 s of device
# time): next_call.sh's variant D alone (gemv_evict_first_l2_next.diff)
# against main, fewer runs.
set -uo pipefail
o=$OUT/r; mkdir -p $o
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
d=bench/results/gpu/s37
OUT=$o AB_PATCH="$d/gemv_evict_first_l2_next.diff" \
  AB_TEST='MatmulTest.DecodeChain*:MatmulAddTest.DecodeChain*:NormMatmulTest.DecodeChain*:NormMatmulTest.MatchesFloat64*:FusedDecodeTest.*' \
  AB_RUNS="l8||model_bench llama-3-8b bfloat16 --decode-only --ctx 512 --ctx 2048;l1||model_bench llama-3.2-1b bfloat16 --decode-only --ctx 512 --ctx 2048;sm||model_bench smollm2-135m bfloat16 --decode-only --ctx 2048" \
  AB_ROUNDS=2 timeout $((300 - SECONDS)) bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; grep -E "PASSED|FAILED|rc=[1-9]" $o/ab.log | tee -a $o/summary.txt
python3 bench/gpu/ab_table.py $o/ab.tgz | tee $o/ab_table.md; tar -czf $OUT/all.tgz -C $o . 2>/dev/null
