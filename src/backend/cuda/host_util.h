// Host-side helpers shared by the CUDA backend's launchers: pointer
// alignment and the environment switches of A/B runs (docs/cuda.md lists
// them; each caller reads its switch once into a static).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace osprey::cuda {

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// True when environment variable `name` is set to exactly `value`.
inline bool env_equals(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// Environment variable `name` as a whole decimal integer in [lo, hi];
// `fallback` when unset, empty, not an integer or out of range.
inline int64_t env_int(const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return *end == '\0' && x >= lo && x <= hi ? static_cast<int64_t>(x) : fallback;
}

}  // namespace osprey::cuda
