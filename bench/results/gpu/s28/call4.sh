#!/usr/bin/env bash
# Session 28, call 4 (in place of call 3, which got no machine): ce420ae plus
# one-byte pages' staging copies by TMA (uncommitted at the call). Tests; the
# prefill bench with OSPREY_PREFILL_TMA=0 / default alternating (bf16 rows:
# cp.async / TMA tiles; f8 rows: cp.async / TMA staging), Llama-3-8B
# TTFT(8192) per page dtype, PyTorch SDPA on the same card, an ncu profile at
# 4k. Packs $OUT/all.tgz after every stage (a call cut short keeps the rest).
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o --exclude='*.ncu-rep' . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
g=$(find build-gpu -name gpu_tests -type f | head -1); m=$(find build-gpu -name model_bench -type f | head -1)
timeout 150 $g --gtest_filter='PrefillAttention.WgmmaTma*:PrefillAttention.F8Pages*:AttentionTest.*PagesPrefill*' > $o/tests.txt 2>&1; echo "tests rc=$? at $SECONDS" | tee -a $o/summary.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $o/tests.txt | tee -a $o/summary.txt
grep -E "Failure" -A6 $o/tests.txt | head -30; pack
pb() { $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*'; }
for r in 1 2; do for t in 0 1; do
  OSPREY_PREFILL_TMA=$t OSPREY_BENCH_CASES=1024,4096,8192 pb > $o/pb128_t${t}_r$r.txt 2>&1
done; done
for t in 0 1; do OSPREY_PREFILL_TMA=$t OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192 pb > $o/pb64_t${t}.txt 2>&1; done
echo "pb at $SECONDS" | tee -a $o/summary.txt; pack
for t in 0 1; do for kv in int8 auto; do
  OSPREY_PREFILL_TMA=$t timeout 60 $m llama-3-8b bfloat16 --ctx 512 --ttft-gap-ms 200 --prompt 8192 --kv-cache-dtype $kv > $o/mb8b8k_${kv}_t$t.txt 2>&1
done; done
grep -H "TTFT\|paged_attention" $o/mb*.txt | tee -a $o/summary.txt
echo "mb at $SECONDS" | tee -a $o/summary.txt; pack
timeout 60 python3 tests/gpu/bench/sdpa_peer.py > $o/sdpa.txt 2>&1; echo "sdpa rc=$? at $SECONDS" | tee -a $o/summary.txt; pack
n=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
OSPREY_BENCH_CASES=4096 timeout 90 $n --set full --import-source yes --clock-control none -k regex:prefill_wgmma_ws \
  --launch-skip 3 --launch-count 1 -o $o/rep $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*' > $o/ncu.log 2>&1
echo "ncu rc=$? at $SECONDS" | tee -a $o/summary.txt
$n --import $o/rep.ncu-rep --page raw --csv > $o/ncu_raw.csv 2>&1
$n --import $o/rep.ncu-rep --page source --csv --print-source sass > $o/ncu_sass.csv 2>&1
python3 bench/gpu/ncu_sass.py $o/ncu_sass.csv --top 20 > $o/ncu_sass.txt 2>&1
pack; rm -rf $o/*.txt $o/*.csv $o/*.ncu-rep
