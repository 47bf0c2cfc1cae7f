#!/usr/bin/env bash
# Session 36, call 4 (carry [".debs"]; ~4 minutes, timeout 300): main, no
# change. Where a batch-1 decode step's time goes besides the weight reads
# (call 3: one kernel fewer a layer moved it by 0-0.5%): the step under
# environment switches, two rounds each, graph replay, 512 / 2048 keys.
#   base          as shipped
#   nopdl         OSPREY_CUDA_NO_PDL=1 (no programmatic dependent launch)
#   noattnpdl     OSPREY_ATTENTION_PDL=0 (the attention inputs without it)
#   mergek        OSPREY_DECODE_MERGE=kernel (the combine kernel, not the in-kernel merge)
#   mk256/mk1024  OSPREY_DECODE_MIN_KEYS (keys a split takes at least)
set -uo pipefail
o=$OUT/r; mkdir -p $o
OUT=$o STEPS=build bash bench/gpu/session.sh >/dev/null 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
mb=build-gpu/tests/gpu/model_bench
[[ -x $mb ]] || mb=$(find build-gpu -name model_bench -type f | head -1)
run() {  # tag env model
  local tag=$1 env=$2 model=$3
  env $env $mb $model bfloat16 --decode-only --ctx 512 --ctx 2048 > $o/${tag}.txt 2>&1
  echo "$tag rc=$? at $SECONDS: $(grep -E 'graph replay' $o/${tag}.txt | sed -E 's/.*graph replay: ([0-9.]+) ms\/step.*MBU ([0-9.]+%).*/\1 \2/' | tr '\n' ' ')" | tee -a $o/summary.txt
}
for r in 1 2; do
  for m in llama-3-8b llama-3.2-1b; do
    t=${m//[.-]/}
    run ${t}_base_r$r "X=1" $m
    run ${t}_nopdl_r$r "OSPREY_CUDA_NO_PDL=1" $m
    run ${t}_noattnpdl_r$r "OSPREY_ATTENTION_PDL=0" $m
    run ${t}_mergek_r$r "OSPREY_DECODE_MERGE=kernel" $m
    run ${t}_mk256_r$r "OSPREY_DECODE_MIN_KEYS=256" $m
    run ${t}_mk1024_r$r "OSPREY_DECODE_MIN_KEYS=1024" $m
  done
done
tar -czf $OUT/all.tgz -C $o .
