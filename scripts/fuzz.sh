#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (build-fuzz/) and runs each one for
# $1 seconds (default 20) from its seed corpus. Exits non-zero on a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-20}"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DOSPREY_FUZZ=ON -DOSPREY_TESTS=ON -DOSPREY_CUDA=OFF >/dev/null
targets=$(sed -n "s/^osprey_fuzzer(\(fuzz_[a-z_0-9]*\).*/\1/p" tests/fuzz/CMakeLists.txt)
cmake --build build-fuzz -j"$(nproc)" --target $targets
for t in $targets; do
  corpus="tests/fuzz/corpus/${t#fuzz_}"
  work="build-fuzz/corpus-${t}"
  mkdir -p "$work"
  echo "fuzz: $t for ${SECONDS_EACH}s"
  "build-fuzz/tests/fuzz/$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=0 "$work" "$corpus" 2>&1 | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
done
