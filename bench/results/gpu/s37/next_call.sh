#!/usr/bin/env bash
# Prepared in session 37 for the next session (not run; carry [".debs"];
# ~5 minutes, timeout 480). Session 37's trace (PERF.md "Where a batch-1
# layer's time goes now"): a Llama-3-8B batch-1 layer takes ~122 us against
# ~98 us of weight reads; the qkv, o and down GEMVs each wait on their
# predecessor with only the first 4 KB of a row loaded (in registers), then
# start their DRAM reads. The L2 is 50 MB but every GEMV streams its
# weights through it with the default policy.
#   A = main
#   B = gemv_l2_next.diff: before its wait, each warp also asks L2
#       (prefetch.global.L2::evict_last) for the next 4 KB of its first row
# (Session 37's call 5 ran B together with an L2 evict-first policy on
# every weight load, gemv_evict_first_l2_next.diff: +8% on the 8B step,
# every GEMV 4-16% slower alone, lm_head included, so the policy is the
# likely cost; B alone has not run.)
#   C = gemv_norm_next_smem.diff: the folded-norm GEMVs at one row (qkv,
#       gate/up) also copy a lane's next 8 chunks of its first row into
#       shared memory before the wait (cp.async, 64 KB a block, no registers
#       held), so a warp's first 8 KB (the whole row at k = 4096) are on chip
#       when the norm staging ends; the sums keep their order (bit for bit
#       the two ops, which NormMatmulTest checks). Aims at the qkv GEMV's
#       ~5 us a layer after its wait.
# Both compile for sm_90a without new spills.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
d=bench/results/gpu/s37
OUT=$o AB_PATCH="$d/gemv_l2_next.diff $d/gemv_norm_next_smem.diff" \
  AB_TEST='MatmulTest.AllDtypesAcrossPathThresholds:MatmulTest.DenseOddKAndUnalignedActivations:MatmulTest.LongRows:MatmulTest.DecodeChain*:MatmulAddTest.MatchesFloat64*:MatmulAddTest.DecodeChain*:NormMatmulTest.*:FusedDecodeTest.*:Fp8MatmulTest.*' \
  AB_RUNS="l8||model_bench llama-3-8b bfloat16 --decode-only --ctx 512 --ctx 2048 --trace;l1||model_bench llama-3.2-1b bfloat16 --decode-only --ctx 512 --ctx 2048 --trace;sm||model_bench smollm2-135m bfloat16 --decode-only --ctx 2048;f8||model_bench llama-3-8b bfloat16 --decode-only --ctx 2048 --fp8;b8||model_bench llama-3-8b bfloat16 --decode-only --ctx 2048 --batch 8" \
  AB_ROUNDS=2 timeout 470 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; grep -E "PASSED|FAILED|rc=[1-9]" $o/ab.log | tee -a $o/summary.txt
python3 bench/gpu/ab_table.py $o/ab.tgz | tee $o/ab_table.md; pack
# If a variant wins: land it, then run the whole gpu_tests
# (STEPS="build gputests", ~5 minutes with the build) before the session ends.
