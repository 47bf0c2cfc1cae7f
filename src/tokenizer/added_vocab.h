// AddedVocab: tokens matched whole in the input before the model runs
// (tokenizer.json "added_tokens"), with HF's lstrip / rstrip / single_word
// semantics and leftmost-longest matching.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = false;  // matched in normalised text (else in raw text)
};

// One stretch of text [start, end): an added token (id >= 0) or plain text.
struct Segment {
  size_t start, end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // patterns: (spelling to match, index into tokens). Empty spellings are ignored.
  void build(const std::vector<AddedToken>& tokens, const std::vector<std::pair<std::string, size_t>>& patterns);
  bool empty() const { return nodes_.size() <= 1; }
  // Splits text into segments covering it; plain-text segments are non-empty.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t token = -1;                             // index into tokens_ when a pattern ends here
  };
  int32_t child(int32_t node, uint8_t b) const;
  std::vector<Node> nodes_;
  std::vector<AddedToken> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace osprey::tok
