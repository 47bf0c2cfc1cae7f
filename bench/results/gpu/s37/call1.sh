#!/usr/bin/env bash
# Session 37 call 1 = session 36 next_call.sh, run unchanged.
# Prepared in session 36 for the next session (not run; carry [".debs"];
# ~8 minutes, timeout 540).
# Session 36's trace (model_bench --trace, c5/l8.txt): in a batch-1 step
# the o projection's GEMV starts only as the decode attention grid exits
# (gap -0.26 us), and takes 14 us for 33.5 MB (Llama-3-8B; floor 7.9 us at
# the copy rate): ~0.19 ms a step, with attention's own 7.6 us a layer of
# gating. The attention kernel never triggers its dependents.
# A = main; B = s36/decode_trigger_start.diff (pdl_launch_dependents at the
# attention kernel's start: the GEMV's blocks become resident at once and
# load their first 4 KB a row while attention runs); C =
# s36/decode_trigger_after_loop.diff (the trigger after the key loop, as
# measured 0.02-0.03 ms slower on an H100 in session 12); D =
# s36/decode_trigger_l2pre.diff (B, and the batch-1 GEMV over a matrix of
# up to 40 MB asks L2 for the rest of each row, one bulk prefetch a warp,
# before its wait: where it became resident under the attention, its reads
# after the wait hit L2). Compiled for sm_90a and sm_80 here, not run.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
OUT=$o AB_PATCH="bench/results/gpu/s36/decode_trigger_start.diff bench/results/gpu/s36/decode_trigger_after_loop.diff bench/results/gpu/s36/decode_trigger_l2pre.diff" \
  AB_TEST='AttentionTest.Decode16OneSequenceEveryUsedSplitCount:AttentionTest.Decode16SplitMergeRepeatsAndGraphReplays:FusedDecodeTest.AttentionChain*:MatmulAddTest.DecodeChain*:MatmulTest.DecodeChain*:NormMatmulTest.DecodeChain*' \
  AB_RUNS="l8||model_bench llama-3-8b bfloat16 --decode-only --ctx 512 --ctx 2048 --ctx 8192 --trace;l1||model_bench llama-3.2-1b bfloat16 --decode-only --ctx 512 --ctx 2048 --trace;sm||model_bench smollm2-135m bfloat16 --decode-only --ctx 2048;b8||model_bench llama-3-8b bfloat16 --decode-only --ctx 2048 --batch 8" \
  AB_ROUNDS=2 timeout 450 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; grep -E "PASSED|FAILED|rc=[1-9]" $o/ab.log | tee -a $o/summary.txt
python3 bench/gpu/ab_table.py $o/ab.tgz | tee $o/ab_table.md; pack
