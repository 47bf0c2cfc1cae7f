// FNV-1a, 64-bit, over the bytes of a string: a small, stable hash for
// short keys (tokenizer hash maps, request keys, dummy-weight seeds). Its
// values are part of those uses' behaviour (dummy weights are made from
// them), so the constants must not change.
#pragma once

#include <cstdint>
#include <string_view>

namespace osprey {

inline uint64_t fnv1a64(std::string_view s) noexcept {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace osprey
