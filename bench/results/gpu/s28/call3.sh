#!/usr/bin/env bash
# Session 28, call 3: main at ce420ae (four-warp TMA issue, TMA by default):
# tests, the prefill bench and PyTorch SDPA on the same card, TTFT A/B
# (OSPREY_PREFILL_TMA=0 / default, alternating), an ncu profile at 4k.
set -uo pipefail
o=$OUT/r; mkdir -p $o
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
g=$(find build-gpu -name gpu_tests -type f | head -1); m=$(find build-gpu -name model_bench -type f | head -1)
timeout 120 $g --gtest_filter='PrefillAttention.*' > $o/tests.txt 2>&1; echo "tests rc=$? at $SECONDS" | tee -a $o/summary.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $o/tests.txt | tee -a $o/summary.txt
pb() { $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*'; }
for r in 1 2; do
  OSPREY_BENCH_CASES=1024,2048,4096,8192 pb > $o/pb128_r$r.txt 2>&1
  OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=1024,2048,4096,8192 pb > $o/pb64_r$r.txt 2>&1
done
echo "pb at $SECONDS" | tee -a $o/summary.txt
timeout 90 python3 tests/gpu/bench/sdpa_peer.py > $o/sdpa.txt 2>&1; echo "sdpa rc=$? at $SECONDS" | tee -a $o/summary.txt
for r in 1 2; do for t in 0 1; do
  OSPREY_PREFILL_TMA=$t timeout 60 $m llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192 > $o/mb8b8k_t${t}_r$r.txt 2>&1
done; done
echo "mb at $SECONDS" | tee -a $o/summary.txt
n=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
OSPREY_BENCH_CASES=4096 timeout 150 $n --set full --import-source yes --clock-control none -k regex:prefill_wgmma_ws \
  --launch-skip 3 --launch-count 1 -o $o/rep $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*' > $o/ncu.log 2>&1
echo "ncu rc=$? at $SECONDS" | tee -a $o/summary.txt
$n --import $o/rep.ncu-rep --page raw --csv > $o/ncu_raw.csv 2>&1
$n --import $o/rep.ncu-rep --page source --csv --print-source sass > $o/ncu_sass.csv 2>&1
python3 bench/gpu/ncu_sass.py $o/ncu_sass.csv --top 20 > $o/ncu_sass.txt 2>&1
grep -H "TTFT\|paged_attention" $o/mb*.txt | tee -a $o/summary.txt
rm -f $o/rep.ncu-rep
tar -czf $OUT/all.tgz -C $o . && rm -rf $o/*.txt $o/*.csv
