#!/usr/bin/env bash
# Session 36, call 5 (carry [".debs"]; the budget's last ~4 minutes): the
# new model_bench --trace (CUPTI kernel activity in graph replay) on main:
# batch-1 decode of Llama-3.2-1B and Llama-3-8B at 2048 keys.
set -uo pipefail
o=$OUT/r; mkdir -p $o
if ! pkg-config --exists libpcre2-8 libutf8proc 2>/dev/null; then
  mkdir -p /tmp/px && for f in .debs/*.deb; do dpkg -x "$f" /tmp/px; done
  export PKG_CONFIG_PATH=/tmp/px/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=/tmp/px
  export LD_LIBRARY_PATH=/tmp/px/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DOSPREY_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a > $o/configure.log 2>&1
grep -n "cupti\|CUPTI" build-gpu/build.ninja | head -2 > $o/cupti.txt
ninja -C build-gpu model_bench > $o/build.log 2>&1; echo "build rc=$? at $SECONDS" | tee -a $o/summary.txt
mb=$(find build-gpu -name model_bench -type f | head -1)
$mb llama-3.2-1b bfloat16 --decode-only --ctx 2048 --trace > $o/l1.txt 2>&1; echo "l1 rc=$? at $SECONDS" | tee -a $o/summary.txt
$mb llama-3-8b bfloat16 --decode-only --ctx 2048 --trace > $o/l8.txt 2>&1; echo "l8 rc=$? at $SECONDS" | tee -a $o/summary.txt
tar -czf $OUT/all.tgz -C $o .
