// Pre-tokenizers (tokenizer.json "pre_tokenizer"): split normalised text into
// the words the model encodes one at a time.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "osprey/status.h"
#include "tokenizer/regex.h"

namespace osprey::tok {

struct Piece {
  std::string text;
  bool at_origin = false;  // starts at offset 0 of the original input (Metaspace "first")
};

// How a Split keeps the delimiters it finds (HF SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// GPT-2's split pattern, used by ByteLevel(use_regex = true).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  enum class Kind { kSplit, kByteLevel, kDigits, kMetaspace, kWhitespaceSplit, kSequence };
  enum class Prepend { kAlways, kFirst, kNever };

  static Expected<std::unique_ptr<PreTokenizer>> from_json(const nlohmann::json& j);
  static Expected<std::unique_ptr<PreTokenizer>> make_split(std::string_view regex, SplitBehavior behavior);
  static Expected<std::unique_ptr<PreTokenizer>> make_byte_level(bool add_prefix_space, bool use_regex);
  static std::unique_ptr<PreTokenizer> make_metaspace(std::string replacement, Prepend scheme, bool split);
  static std::unique_ptr<PreTokenizer> make_sequence(std::vector<std::unique_ptr<PreTokenizer>> steps);

  // Rewrites pieces in place. Byte-level steps leave raw bytes (the model
  // spells them), so ends_with_byte_level() must be true for such a pipeline.
  void apply(std::vector<Piece>& pieces) const;
  // True when the last step is ByteLevel (the model then runs in byte mode);
  // ByteLevel anywhere else is refused at load.
  bool ends_with_byte_level() const;
  bool contains_byte_level() const;

 private:
  void apply_one(const Piece& in, std::vector<Piece>& out) const;

  Kind kind_ = Kind::kSequence;
  std::unique_ptr<Regex> regex_;  // Split pattern; ByteLevel GPT-2 pattern when use_regex
  SplitBehavior behavior_ = SplitBehavior::kIsolated;
  bool invert_ = false;
  bool add_prefix_space_ = false;
  bool individual_digits_ = false;
  std::string replacement_;  // Metaspace
  Prepend prepend_ = Prepend::kAlways;
  bool split_ = true;
  std::vector<std::unique_ptr<PreTokenizer>> children_;
};

}  // namespace osprey::tok
