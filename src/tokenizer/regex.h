// A compiled PCRE2 pattern (UTF + UCP, JIT when available) for pre-tokenizer
// splits and Replace normalizers. Compiled once at load; matching is
// thread-safe (per-thread match data).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "osprey/status.h"

namespace osprey::tok {

class Regex {
 public:
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // pattern uses Oniguruma/Rust-regex syntax as written in tokenizer.json;
  // the subset those files use is also valid PCRE2.
  static Expected<std::unique_ptr<Regex>> compile(std::string_view pattern);
  // A regex matching the literal string.
  static Expected<std::unique_ptr<Regex>> literal(std::string_view text);

  // Appends the non-empty, non-overlapping matches [start, end) of text (valid
  // UTF-8), leftmost first.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
};

}  // namespace osprey::tok
