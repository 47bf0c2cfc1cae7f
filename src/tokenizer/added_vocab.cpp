#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/unicode_text.h"

namespace osprey::tok {

void AddedTokenMatcher::build(const std::vector<AddedToken>& tokens,
                              const std::vector<std::pair<std::string, size_t>>& patterns) {
  tokens_ = tokens;
  nodes_.assign(1, Node{});
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (const auto& [spelling, index] : patterns) {
    if (spelling.empty()) continue;
    int32_t n = 0;
    for (char ch : spelling) {
      uint8_t b = static_cast<uint8_t>(ch);
      int32_t c = child(n, b);
      if (c < 0) {
        c = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        auto& nx = nodes_[n].next;
        nx.insert(std::lower_bound(nx.begin(), nx.end(), std::make_pair(b, int32_t{-1})), {b, c});
      }
      n = c;
    }
    if (nodes_[n].token < 0) nodes_[n].token = static_cast<int32_t>(index);  // first listed wins
    first_byte_[static_cast<uint8_t>(spelling[0])] = true;
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  const auto& nx = nodes_[node].next;
  auto it = std::lower_bound(nx.begin(), nx.end(), std::make_pair(b, int32_t{-1}));
  return it != nx.end() && it->first == b ? it->second : -1;
}

namespace {

// Last code point before pos (pos > 0).
char32_t code_point_before(std::string_view s, size_t pos) {
  size_t k = pos - 1;
  while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
  return next_code_point(s, k);
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  out.clear();
  if (empty()) {
    if (!text.empty()) out.push_back({0, text.size(), -1});
    return;
  }
  size_t emitted = 0;  // text before this is already in out
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest pattern starting at pos.
    int32_t n = 0, best = -1;
    size_t best_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      n = child(n, static_cast<uint8_t>(text[i]));
      if (n < 0) break;
      if (nodes_[n].token >= 0) {
        best = nodes_[n].token;
        best_end = i + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[best];
    size_t start = pos, stop = best_end;
    pos = best_end;  // matching resumes after this match whether or not it is kept
    if (t.single_word) {
      bool start_ok = start == 0 || !is_alphanumeric(code_point_before(text, start));
      size_t k = stop;
      bool stop_ok = stop == text.size() || !is_alphanumeric(next_code_point(text, k));
      if (!start_ok || !stop_ok) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > emitted) {
        size_t k = s - 1;
        while (k > emitted && (static_cast<uint8_t>(text[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!is_whitespace(next_code_point(text, j))) break;
        s = k;
      }
      start = s;
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        size_t j = stop;
        if (!is_whitespace(next_code_point(text, j))) break;
        stop = j;
      }
      pos = std::max(pos, stop);
    }
    if (start > emitted) out.push_back({emitted, start, -1});
    out.push_back({start, stop, t.id});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
}

}  // namespace osprey::tok
