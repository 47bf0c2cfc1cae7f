// Normalizers (tokenizer.json "normalizer"): text -> text, applied to each
// stretch of input between added tokens that are matched unnormalised.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "osprey/status.h"
#include "tokenizer/regex.h"

namespace osprey::tok {

class Normalizer {
 public:
  enum class Kind { kNfc, kNfkc, kNfd, kNfkd, kLowercase, kPrepend, kReplace, kStrip, kSequence };

  // Parses one normalizer object; unsupported types are refused by name.
  static Expected<std::unique_ptr<Normalizer>> from_json(const nlohmann::json& j);
  static std::unique_ptr<Normalizer> make_nfc();

  std::string apply(std::string_view s) const;

 private:
  Kind kind_ = Kind::kSequence;
  std::string text_;                 // Prepend: prefix; Replace: content
  std::unique_ptr<Regex> pattern_;   // Replace
  bool strip_left_ = false, strip_right_ = false;
  std::vector<std::unique_ptr<Normalizer>> children_;
};

// Replaces every match of re in s with content.
std::string regex_replace_all(const Regex& re, std::string_view s, std::string_view content);

// Compiles a tokenizer.json pattern object: {"String": "..."} or {"Regex": "..."}.
Expected<std::unique_ptr<Regex>> compile_pattern(const nlohmann::json& pattern, std::string_view where);

}  // namespace osprey::tok
