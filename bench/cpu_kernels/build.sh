#!/usr/bin/env bash
# Builds cpu_kernels_bench against an existing build folder's libraries
# (until bench/cpu_kernels is added to the top-level CMakeLists.txt).
#   bench/cpu_kernels/build.sh [build-dir]   -> <build-dir>/cpu_kernels_bench
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
ninja -C "$build" -j2 osprey_backend_cpu
g++ -std=c++20 -O2 -I"$root/src" -I"$root/include" "$root/bench/cpu_kernels/cpu_kernels_bench.cpp" \
  "$build/src/libosprey_backend_cpu.a" "$build/src/libosprey_ops.a" "$build/src/libosprey_core.a" \
  -lopenblas -lpthread -o "$build/cpu_kernels_bench"
echo "built $build/cpu_kernels_bench"
