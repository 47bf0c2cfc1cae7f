// IncrementalDetokenizer: decodes a sliding window of ids and emits the text
// the newest ids add, as HF tokenizers' DecodeStream and vLLM do.
//
// Invariant: ids_[0, read_offset_) have been emitted; the emitted text ends
// where decode(ids_[prefix_offset_, read_offset_)) ends. A delta is released
// only when the window's text does not end in U+FFFD, so a character whose
// bytes span several tokens is emitted whole; finish() releases the rest.
#include "tokenizer/tokenizer.h"

namespace osprey {

namespace {

constexpr size_t kPromptContext = 6;  // ids of prompt kept as left context

bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens,
                                               std::span<const int32_t> prompt_ids)
    : tok_(tok), skip_special_(skip_special_tokens) {
  size_t keep = std::min(prompt_ids.size(), kPromptContext);
  ids_.assign(prompt_ids.end() - static_cast<std::ptrdiff_t>(keep), prompt_ids.end());
  prefix_offset_ = 0;
  read_offset_ = ids_.size();
}

std::string IncrementalDetokenizer::step(int32_t id) {
  ids_.push_back(id);
  std::span<const int32_t> all(ids_);
  std::string prefix = tok_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  std::string text = tok_.decode(all.subspan(prefix_offset_), skip_special_);
  if (text.size() <= prefix.size() || ends_with_replacement(text)) return "";
  std::string delta;
  if (text.compare(0, prefix.size(), prefix) == 0) {
    delta = text.substr(prefix.size());
  } else {
    // The decoder rewrote earlier text (not seen with supported decoders):
    // emit what follows the common prefix.
    size_t k = 0;
    while (k < prefix.size() && prefix[k] == text[k]) ++k;
    delta = text.substr(k);
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  // Drop ids that can no longer influence the window.
  if (prefix_offset_ > 64) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_));
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
  }
  return delta;
}

std::string IncrementalDetokenizer::finish() {
  if (read_offset_ >= ids_.size()) return "";
  std::span<const int32_t> all(ids_);
  std::string prefix = tok_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  std::string text = tok_.decode(all.subspan(prefix_offset_), skip_special_);
  read_offset_ = ids_.size();
  if (text.size() <= prefix.size()) return "";
  size_t k = 0;
  while (k < prefix.size() && prefix[k] == text[k]) ++k;
  return text.substr(k);
}

}  // namespace osprey
