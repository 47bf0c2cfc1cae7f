// Decoders (tokenizer.json "decoder"): token spellings -> text, as HF
// tokenizers' decode_chain: each step maps the list of token strings to a new
// list; the result is their concatenation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "osprey/status.h"

namespace osprey::tok {

class Decoder {
 public:
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace, kSequence };

  static Expected<std::unique_ptr<Decoder>> from_json(const nlohmann::json& j);
  static std::unique_ptr<Decoder> make_byte_level();
  static std::unique_ptr<Decoder> make_replace(std::string from, std::string to);
  static std::unique_ptr<Decoder> make_simple(Kind kind);  // ByteFallback, Fuse
  static std::unique_ptr<Decoder> make_strip(std::string content, size_t start, size_t stop);
  static std::unique_ptr<Decoder> make_sequence(std::vector<std::unique_ptr<Decoder>> steps);

  void decode_chain(std::vector<std::string>& tokens) const;

 private:
  Kind kind_ = Kind::kSequence;
  std::string from_, to_;           // Replace: literal pattern and content; Strip: content char
  size_t start_ = 0, stop_ = 0;     // Strip
  std::string replacement_;         // Metaspace
  bool prepend_ = true;             // Metaspace: prepend_scheme != never
  std::vector<std::unique_ptr<Decoder>> children_;
};

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

}  // namespace osprey::tok
