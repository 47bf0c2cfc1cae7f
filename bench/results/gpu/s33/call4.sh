#!/usr/bin/env bash
# Session 33, call 4 (carry [".debs"]; timeout 600). The tree = main +
# ws_byte_chunk (head_dim-128 one-byte pages: each quarter-warp widens
# chunks 0..3 or 4..7 of two keys, so its 16-byte stores into the swizzled
# slot hit 8 distinct bank groups; call 3's ncu counted 9.6 M store
# conflicts at a 4k FP8 prompt).
# 1. The tree's one-byte prefill tests.
# 2. ncu: the store conflicts and time of the F8 kernel at 4k.
# 3. A/B: A = the tree, B = without the remap (byte_remap_reverted.diff):
#    prefill bench FP8 rows (hd128 2k/4k/8k, hd64 4k/8k) two rounds;
#    Llama-3-8B TTFT(8192) INT8 and FP8 pages, one round.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o --exclude='*.ncu-rep' --exclude='*.csv' . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
g=$(find build-gpu -name gpu_tests -type f | head -1)
res() { grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $1 | tee -a $o/summary.txt; }
timeout 150 $g --gtest_filter='PrefillAttention.F8*:PrefillAttention.RepeatableBitForBit:AttentionTest.*PagesPrefill*' > $o/tests.txt 2>&1
echo "tests rc=$? at $SECONDS" | tee -a $o/summary.txt; res $o/tests.txt; pack
n=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
OSPREY_BENCH_KERNELS=wgmma3 OSPREY_BENCH_CASES=4096 timeout 60 $n --clock-control none \
  --metrics gpu__time_duration.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum,smsp__pcsamp_warps_issue_stalled_short_scoreboard \
  --kernel-name-base mangled -k regex:ws_kernelILb0ELb1ELi1ELi128E --launch-skip 3 --launch-count 1 $g \
  --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*' > $o/ncu_f8.txt 2>&1
echo "ncu rc=$? at $SECONDS" | tee -a $o/summary.txt; grep -E "duration|conflicts|short" $o/ncu_f8.txt | tee -a $o/summary.txt; pack
pb="gpu_tests --gtest_also_run_disabled_tests --gtest_filter=*PrefillAttentionBench*"
k="OSPREY_BENCH_KERNELS=wgmma3"
mb="model_bench llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192 --kv-cache-dtype"
OUT=$o AB_PATCH="bench/results/gpu/s33/byte_remap_reverted.diff" \
  AB_RUNS="pb128|$k OSPREY_BENCH_CASES=2048,4096,8192|$pb;pb64|$k OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192|$pb;i8||$mb int8;f8||$mb fp8" \
  AB_ROUNDS=2 timeout 250 bash bench/gpu/ab.sh
echo "ab rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
