#include "tokenizer/tokenizer.h"

#include "tokenizer/tokenizer_state.h"
#include "tokenizer/unicode_text.h"

namespace osprey {

using tok::Piece;
using tok::Segment;

namespace tok {

void TokenizerState::add_token(AddedToken t) {
  for (auto& a : added) {
    if (a.content == t.content) {
      if (t.special) a.special = true;
      if (a.id >= 0 && static_cast<size_t>(a.id) < special.size()) special[a.id] = a.special;
      return;
    }
  }
  if (t.id < 0) {
    auto it = token_to_id.find(t.content);
    t.id = it != token_to_id.end() ? it->second : static_cast<int32_t>(id_to_token.size());
  }
  size_t need = static_cast<size_t>(t.id) + 1;
  if (id_to_token.size() < need) {
    id_to_token.resize(need);
    special.resize(need, 0);
    is_added.resize(need, 0);
  }
  id_to_token[t.id] = t.content;
  special[t.id] = t.special ? 1 : 0;
  is_added[t.id] = 1;
  token_to_id[t.content] = t.id;
  added.push_back(std::move(t));
}

void TokenizerState::finalize() {
  std::vector<std::pair<std::string, size_t>> raw, norm;
  for (size_t i = 0; i < added.size(); ++i) {
    if (added[i].normalized) {
      norm.emplace_back(normalizer ? normalizer->apply(added[i].content) : added[i].content, i);
    } else {
      raw.emplace_back(added[i].content, i);
    }
  }
  raw_matcher.build(added, raw);
  normalized_matcher.build(added, norm);
  special.resize(id_to_token.size(), 0);
  is_added.resize(id_to_token.size(), 0);
}

}  // namespace tok

Tokenizer::Tokenizer(std::unique_ptr<tok::TokenizerState> state) : state_(std::move(state)) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const tok::TokenizerState& s = *state_;
  std::string sanitized;
  std::string_view text = input;
  if (!tok::is_valid_utf8(input)) {
    sanitized = tok::sanitize_utf8(input);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids.insert(ids.end(), s.post.before.begin(), s.post.before.end());

  std::vector<Segment> segs, segs2;
  std::vector<Piece> pieces;
  auto encode_text = [&](std::string_view t, bool at_origin) {
    pieces.clear();
    pieces.push_back({std::string(t), at_origin});
    if (s.pre_tokenizer) s.pre_tokenizer->apply(pieces);
    for (const auto& p : pieces) s.model->encode_word(p.text, ids);
  };

  s.raw_matcher.split(text, segs);
  for (const auto& seg : segs) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view part = text.substr(seg.start, seg.end - seg.start);
    std::string normalized;
    if (s.normalizer) {
      normalized = s.normalizer->apply(part);
      part = normalized;
    }
    if (s.normalized_matcher.empty()) {
      if (!part.empty()) encode_text(part, seg.start == 0);
      continue;
    }
    s.normalized_matcher.split(part, segs2);
    for (const auto& seg2 : segs2) {
      if (seg2.id >= 0) ids.push_back(seg2.id);
      else encode_text(part.substr(seg2.start, seg2.end - seg2.start), seg.start == 0 && seg2.start == 0);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), s.post.after.begin(), s.post.after.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const tok::TokenizerState& s = *state_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= s.id_to_token.size()) continue;
    if (skip_special_tokens && s.special[id]) continue;
    const std::string& t = s.id_to_token[id];
    if (t.empty() && !s.is_added[id]) continue;  // a hole in the vocabulary
    tokens.push_back(t);
  }
  if (!s.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  s.decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(state_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = state_->token_to_id.find(token); it != state_->token_to_id.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= state_->id_to_token.size()) return "";
  return state_->id_to_token[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < state_->special.size() && state_->special[id];
}

std::optional<int32_t> Tokenizer::bos_id() const {
  if (state_->bos_token.empty()) return std::nullopt;
  return token_to_id(state_->bos_token);
}

std::optional<int32_t> Tokenizer::eos_id() const {
  if (state_->eos_token.empty()) return std::nullopt;
  return token_to_id(state_->eos_token);
}

const std::string& Tokenizer::bos_token() const { return state_->bos_token; }
const std::string& Tokenizer::eos_token() const { return state_->eos_token; }
const std::string& Tokenizer::chat_template() const { return state_->chat_template; }

}  // namespace osprey
