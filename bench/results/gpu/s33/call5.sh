#!/usr/bin/env bash
# Session 33, call 5 (carry [".debs"]; the session's last ~330 s of device
# time): the tree = main + ws_widen_thread (head_dim-128 one-byte pages:
# lanes with c >= 4 widen the other key of their pair's staged codes, so the
# widened 16-byte stores hit 8 distinct bank groups a quarter-warp while the
# copies stay one key's 128 bytes a quarter-warp). No A/B in the call
# (no time): the bf16 rows (unchanged kernel) place this machine against
# call 4's. Prefill bench 4k/8k, ncu store conflicts, one-byte prefill tests.
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
g=$(find build-gpu -name gpu_tests -type f | head -1)
pb() { OSPREY_BENCH_KERNELS=wgmma3 OSPREY_BENCH_CASES=2048,4096,8192 timeout 30 $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*'; }
pb > $o/pb128_r1.txt 2>&1; grep wgmma3 $o/pb128_r1.txt | tee -a $o/summary.txt; pack
n=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
OSPREY_BENCH_KERNELS=wgmma3 OSPREY_BENCH_CASES=4096 timeout 40 $n --clock-control none \
  --metrics gpu__time_duration.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum \
  --kernel-name-base mangled -k regex:ws_kernelILb0ELb1ELi1ELi128E --launch-skip 3 --launch-count 1 $g \
  --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*' > $o/ncu_f8.txt 2>&1
grep -E "duration|conflicts" $o/ncu_f8.txt | tee -a $o/summary.txt; pack
timeout 100 $g --gtest_filter='AttentionTest.*PagesPrefill*:PrefillAttention.F8*:PrefillAttention.RepeatableBitForBit' > $o/tests.txt 2>&1
echo "tests rc=$? at $SECONDS" | tee -a $o/summary.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $o/tests.txt | tee -a $o/summary.txt; pack
pb > $o/pb128_r2.txt 2>&1; grep wgmma3 $o/pb128_r2.txt | tee -a $o/summary.txt; pack
