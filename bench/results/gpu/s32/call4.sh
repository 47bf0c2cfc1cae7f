#!/usr/bin/env bash
# Session 32, call 4 (in place of call 3, which got no machine; the device
# time left fits one build): main + prefill_f8_f16_compute.diff only. Its
# FP8 prefill tests (the new saturation test among them), then the prefill
# bench at 4k / 8k, head_dim 128 and 64, twice. The within-run signature of
# the change: bf16+f8 rows at the f16+f8 rows' rate (8% apart on main in
# calls 1-2).
set -uo pipefail
o=$OUT; t0=$(date +%s)
git apply bench/results/gpu/s32/prefill_f8_f16_compute.diff || { echo "patch does not apply" > $o/log.txt; exit 1; }
if ! pkg-config --exists libpcre2-8 libutf8proc 2>/dev/null; then
  mkdir -p /tmp/px && for f in .debs/*.deb; do dpkg -x "$f" /tmp/px; done
  export PKG_CONFIG_PATH=/tmp/px/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=/tmp/px
  export LD_LIBRARY_PATH=/tmp/px/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DOSPREY_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a > $o/configure.log 2>&1
ninja -C build-gpu gpu_tests > $o/build.log 2>&1; echo "build rc=$? at $(( $(date +%s) - t0 ))" >> $o/log.txt
g=$(find build-gpu -name gpu_tests -type f | head -1)
timeout 40 $g --gtest_filter='PrefillAttention.F8*:PrefillAttention.RepeatableBitForBit:AttentionTest.F8PagesPrefill*' > $o/tests.txt 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 ))" >> $o/log.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[       OK" $o/tests.txt >> $o/log.txt
for r in 1 2; do
  OSPREY_BENCH_KERNELS=wgmma3 OSPREY_BENCH_CASES=4096,8192 timeout 15 $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*' > $o/pb128_r$r.txt 2>&1
  OSPREY_BENCH_KERNELS=wgmma3 OSPREY_BENCH_HEADS=32,8,64 OSPREY_BENCH_CASES=4096,8192 timeout 15 $g --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*' > $o/pb64_r$r.txt 2>&1
done
echo "bench at $(( $(date +%s) - t0 ))" >> $o/log.txt
grep -h wgmma3 $o/pb*_r*.txt >> $o/log.txt
