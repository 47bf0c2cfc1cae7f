// OSPREY_BENCH_HEADS=hq,hk[,hd[,window]]: the head shape of the attention
// benchmarks (gpu_op_bench's decode sweep, gpu_tests' prefill attention
// bench), parsed in one place. No GoogleTest here, so gpu_op_bench can use
// it too.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>

namespace osprey::gpu_test {

struct BenchHeads {
  int hq = 32, hk = 8, hd = 128;  // default: Llama-3-8B
  int window = 0;                 // sliding window (0: none)
};

// The shape OSPREY_BENCH_HEADS names (what it leaves out at its default;
// all defaults when unset), or nullopt with a message on stderr when it is
// malformed: hk dividing hq, hd 64 or 128, and a window (>= 0) only where
// allow_window.
inline std::optional<BenchHeads> bench_heads_from_env(bool allow_window) {
  BenchHeads h;
  const char* v = std::getenv("OSPREY_BENCH_HEADS");
  if (v == nullptr) return h;
  char rest = 0;
  const int n = std::sscanf(v, "%d,%d,%d,%d%c", &h.hq, &h.hk, &h.hd, &h.window, &rest);
  if (n < 2 || n > (allow_window ? 4 : 3) || h.hk <= 0 || h.hq <= 0 || h.hq % h.hk != 0 ||
      (h.hd != 64 && h.hd != 128) || h.window < 0) {
    std::fprintf(stderr, "OSPREY_BENCH_HEADS=%s: want hq,hk[,hd%s] with hk dividing hq, hd 64 or 128\n", v,
                 allow_window ? "[,window]" : "");
    return std::nullopt;
  }
  return h;
}

}  // namespace osprey::gpu_test
