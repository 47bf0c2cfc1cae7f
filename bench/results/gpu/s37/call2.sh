#!/usr/bin/env bash
# Session 37, call 2 (carry [".debs"]; ~7 minutes, timeout 560). A = main
# (959d427: the decode attention's trigger at its start) plus model_bench
# detaching CUPTI after each --trace. The batch-1 GEMV (gemv_kernel, one
# warp a row, the activation read from global memory) over long rows:
# session 37's call 1 trace puts the o + down GEMVs' gating at ~80% of the
# copy rate while the folded-norm GEMVs (activation staged in shared
# memory) run at or above it.
#   B = gemv_unroll8_long.diff: 8 raw chunks a lane in the main loop at
#       k >= 8192 (the down projection)
#   C = gemv_weights_l1_noalloc.diff: weight chunks loaded with
#       ld.global.nc.L1::no_allocate (the streamed rows no longer evict the
#       activation from L1)
#   D = B + C
# nt: the 8B at 2048 keys without --trace (the untraced figure to compare
# with l8's, whose 2048 follows a trace of 512).
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
d=bench/results/gpu/s37
OUT=$o AB_PATCH="$d/gemv_unroll8_long.diff $d/gemv_weights_l1_noalloc.diff $d/gemv_unroll8_long_noalloc.diff" \
  AB_TEST='MatmulTest.AllDtypesAcrossPathThresholds:MatmulTest.DenseOddKAndUnalignedActivations:MatmulTest.LongRows:MatmulTest.DecodeChain*:MatmulAddTest.MatchesFloat64*:MatmulAddTest.DecodeChain*:NormMatmulTest.DecodeChain*:NormMatmulTest.MatchesFloat64*:FusedDecodeTest.*' \
  AB_RUNS="l8||model_bench llama-3-8b bfloat16 --decode-only --ctx 512 --ctx 2048 --trace;nt||model_bench llama-3-8b bfloat16 --decode-only --ctx 2048;l1||model_bench llama-3.2-1b bfloat16 --decode-only --ctx 512 --ctx 2048 --trace;sm||model_bench smollm2-135m bfloat16 --decode-only --ctx 2048;b8||model_bench llama-3-8b bfloat16 --decode-only --ctx 2048 --batch 8" \
  AB_ROUNDS=2 timeout 470 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; grep -E "PASSED|FAILED|rc=[1-9]" $o/ab.log | tee -a $o/summary.txt
python3 bench/gpu/ab_table.py $o/ab.tgz | tee $o/ab_table.md; pack
