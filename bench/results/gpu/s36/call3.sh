#!/usr/bin/env bash
# Session 36, call 3 (carry [".debs"]; ~8 minutes, timeout 560).
# The batch-1 attention input in one kernel (gemv_norm_rope_kernel: the
# folded norm, the QKV GEMV, RoPE and the K/V page writes; one kernel of
# six a layer fewer). One build; A = OSPREY_FUSED_QKV_ROPE=0 (the two
# kernels), B = the default (one), alternating, same binary.
# Tests first: NormMatmulTest.QkvRopeFoldIsTheTwoOps (bit for bit the two
# ops), the norm-fold and decode-chain tests, the model fold test (the
# engine GPU tests' SmolLM2 GGUF is Q4_1, which the fused kernel does not
# take, and does not fit the 64 MiB carry with the tree).
set -uo pipefail
o=$OUT/r; mkdir -p $o
pack() { tar -czf $OUT/all.tgz -C $o . 2>/dev/null; }
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
b=build-gpu/tests/gpu
timeout 150 $b/gpu_tests --gtest_filter='NormMatmul*:NormFold*:PrefillAttention.QkvRope*:*DecodeChain*:FusedDecode*' > $o/tests.txt 2>&1
echo "gpu_tests rc=$? at $SECONDS" | tee -a $o/summary.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" $o/tests.txt | tee -a $o/summary.txt; pack
mb=$b/model_bench
[[ -x $mb ]] || mb=$(find build-gpu -name model_bench -type f | head -1)
run() {  # tag env args...
  local tag=$1 env=$2; shift 2
  env $env $mb "$@" > $o/${tag}.txt 2>&1
  echo "$tag rc=$? at $SECONDS: $(grep -E 'graph replay' $o/${tag}.txt | sed -E 's/.*graph replay: ([0-9.]+) ms\/step.*MBU ([0-9.]+%).*/\1 \2/' | tr '\n' ' ')" | tee -a $o/summary.txt
}
for r in 1 2 3; do
  run l8_A_r$r OSPREY_FUSED_QKV_ROPE=0 llama-3-8b bfloat16 --decode-only --ctx 512 --ctx 2048 --ctx 8192
  run l8_B_r$r OSPREY_FUSED_QKV_ROPE=1 llama-3-8b bfloat16 --decode-only --ctx 512 --ctx 2048 --ctx 8192
  run l1_A_r$r OSPREY_FUSED_QKV_ROPE=0 llama-3.2-1b bfloat16 --decode-only --ctx 512 --ctx 2048
  run l1_B_r$r OSPREY_FUSED_QKV_ROPE=1 llama-3.2-1b bfloat16 --decode-only --ctx 512 --ctx 2048
  run sm_A_r$r OSPREY_FUSED_QKV_ROPE=0 smollm2-135m bfloat16 --decode-only --ctx 512 --ctx 2048
  run sm_B_r$r OSPREY_FUSED_QKV_ROPE=1 smollm2-135m bfloat16 --decode-only --ctx 512 --ctx 2048
  pack
done
for r in 1 2; do
  run l8f8kv_A_r$r OSPREY_FUSED_QKV_ROPE=0 llama-3-8b bfloat16 --decode-only --ctx 2048 --kv-cache-dtype fp8
  run l8f8kv_B_r$r OSPREY_FUSED_QKV_ROPE=1 llama-3-8b bfloat16 --decode-only --ctx 2048 --kv-cache-dtype fp8
  run q7_A_r$r OSPREY_FUSED_QKV_ROPE=0 qwen2.5-7b bfloat16 --decode-only --ctx 2048
  run q7_B_r$r OSPREY_FUSED_QKV_ROPE=1 qwen2.5-7b bfloat16 --decode-only --ctx 2048
  pack
done
