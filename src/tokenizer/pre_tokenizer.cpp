#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "tokenizer/normalizer.h"
#include "tokenizer/unicode_text.h"

namespace osprey::tok {

using nlohmann::json;

namespace {

struct Span {
  size_t a, b;
  bool is_match;
};

// Turns sorted non-overlapping matches into spans covering [0, n).
void cover(const std::vector<std::pair<size_t, size_t>>& m, size_t n, bool invert, std::vector<Span>& out) {
  out.clear();
  size_t prev = 0;
  for (auto [a, b] : m) {
    if (a > prev) out.push_back({prev, a, invert});
    out.push_back({a, b, !invert});
    prev = b;
  }
  if (prev < n) out.push_back({prev, n, invert});
}

// Applies a delimiter behaviour to covering spans (HF NormalizedString::split).
void split_spans(const Piece& in, std::vector<Span>& spans, SplitBehavior behavior, std::vector<Piece>& out) {
  std::vector<std::pair<size_t, size_t>> ranges;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& s : spans)
        if (!s.is_match) ranges.emplace_back(s.a, s.b);
      break;
    case SplitBehavior::kIsolated:
      for (const auto& s : spans) ranges.emplace_back(s.a, s.b);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const auto& s : spans) {
        if (s.is_match && !prev_match && !ranges.empty()) ranges.back().second = s.b;
        else ranges.emplace_back(s.a, s.b);
        prev_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const auto& s = spans[k];
        if (s.is_match && !prev_match && !ranges.empty()) ranges.back().first = s.a;
        else ranges.emplace_back(s.a, s.b);
        prev_match = s.is_match;
      }
      std::reverse(ranges.begin(), ranges.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      bool first = true;
      for (const auto& s : spans) {
        if (!first && s.is_match == prev_match) ranges.back().second = s.b;
        else ranges.emplace_back(s.a, s.b);
        prev_match = s.is_match;
        first = false;
      }
      break;
    }
  }
  for (auto [a, b] : ranges) {
    if (b > a) out.push_back({in.text.substr(a, b - a), in.at_origin && a == 0});
  }
}

// One match per code point satisfying pred.
template <class Pred>
void char_matches(std::string_view s, Pred pred, std::vector<std::pair<size_t, size_t>>& m) {
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t c = next_code_point(s, i);
    if (pred(c)) m.emplace_back(start, i);
  }
}

Expected<SplitBehavior> parse_behavior(const json& j) {
  if (!j.is_string()) return invalid_argument("pre_tokenizer Split: string \"behavior\" expected");
  const std::string b = j.get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return unsupported("pre_tokenizer Split: behavior '" + b + "' is not supported");
}

}  // namespace

Expected<std::unique_ptr<PreTokenizer>> PreTokenizer::make_split(std::string_view regex, SplitBehavior behavior) {
  auto p = std::make_unique<PreTokenizer>();
  p->kind_ = Kind::kSplit;
  OSP_ASSIGN_OR_RETURN(p->regex_, Regex::compile(regex));
  p->behavior_ = behavior;
  return p;
}

Expected<std::unique_ptr<PreTokenizer>> PreTokenizer::make_byte_level(bool add_prefix_space, bool use_regex) {
  auto p = std::make_unique<PreTokenizer>();
  p->kind_ = Kind::kByteLevel;
  p->add_prefix_space_ = add_prefix_space;
  if (use_regex) { OSP_ASSIGN_OR_RETURN(p->regex_, Regex::compile(kGpt2Pattern)); }
  return p;
}

std::unique_ptr<PreTokenizer> PreTokenizer::make_metaspace(std::string replacement, Prepend scheme, bool split) {
  auto p = std::make_unique<PreTokenizer>();
  p->kind_ = Kind::kMetaspace;
  p->replacement_ = std::move(replacement);
  p->prepend_ = scheme;
  p->split_ = split;
  return p;
}

std::unique_ptr<PreTokenizer> PreTokenizer::make_sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) {
  auto p = std::make_unique<PreTokenizer>();
  p->kind_ = Kind::kSequence;
  p->children_ = std::move(steps);
  return p;
}

Expected<std::unique_ptr<PreTokenizer>> PreTokenizer::from_json(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument("pre_tokenizer: object with a string \"type\" expected");
  const std::string type = j["type"].get<std::string>();
  auto p = std::make_unique<PreTokenizer>();
  if (type == "Split") {
    p->kind_ = Kind::kSplit;
    if (!j.contains("pattern") || !j.contains("behavior"))
      return invalid_argument("pre_tokenizer Split: \"pattern\" and \"behavior\" expected");
    OSP_ASSIGN_OR_RETURN(p->regex_, compile_pattern(j["pattern"], "pre_tokenizer Split"));
    OSP_ASSIGN_OR_RETURN(p->behavior_, parse_behavior(j["behavior"]));
    p->invert_ = j.value("invert", false);
  } else if (type == "ByteLevel") {
    bool use_regex = j.value("use_regex", true);
    return make_byte_level(j.value("add_prefix_space", true), use_regex);
  } else if (type == "Digits") {
    p->kind_ = Kind::kDigits;
    p->individual_digits_ = j.value("individual_digits", false);
  } else if (type == "Metaspace") {
    std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
    if (rep.empty() || utf8_len(static_cast<uint8_t>(rep[0])) != rep.size())
      return invalid_argument("pre_tokenizer Metaspace: replacement must be one character");
    Prepend scheme = Prepend::kAlways;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "always") scheme = Prepend::kAlways;
      else if (s == "first") scheme = Prepend::kFirst;
      else if (s == "never") scheme = Prepend::kNever;
      else return unsupported("pre_tokenizer Metaspace: prepend_scheme '" + s + "' is not supported");
    } else if (j.contains("add_prefix_space")) {
      scheme = j.value("add_prefix_space", true) ? Prepend::kAlways : Prepend::kNever;
    }
    return make_metaspace(rep, scheme, j.value("split", true));
  } else if (type == "WhitespaceSplit") {
    p->kind_ = Kind::kWhitespaceSplit;
  } else if (type == "Sequence") {
    p->kind_ = Kind::kSequence;
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      return invalid_argument("pre_tokenizer Sequence: array \"pretokenizers\" expected");
    for (const auto& c : j["pretokenizers"]) {
      OSP_ASSIGN_OR_RETURN(auto child, from_json(c));
      p->children_.push_back(std::move(child));
    }
  } else {
    return unsupported("pre_tokenizer type '" + type + "' is not supported");
  }
  return p;
}

bool PreTokenizer::contains_byte_level() const {
  if (kind_ == Kind::kByteLevel) return true;
  for (const auto& c : children_)
    if (c->contains_byte_level()) return true;
  return false;
}

bool PreTokenizer::ends_with_byte_level() const {
  if (kind_ == Kind::kByteLevel) return true;
  if (kind_ != Kind::kSequence || children_.empty()) return false;
  for (size_t k = 0; k + 1 < children_.size(); ++k)
    if (children_[k]->contains_byte_level()) return false;
  return children_.back()->ends_with_byte_level();
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  if (kind_ == Kind::kSequence) {
    for (const auto& c : children_) c->apply(pieces);
    return;
  }
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (const auto& p : pieces) apply_one(p, out);
  pieces.swap(out);
}

void PreTokenizer::apply_one(const Piece& in, std::vector<Piece>& out) const {
  thread_local std::vector<std::pair<size_t, size_t>> m;
  thread_local std::vector<Span> spans;
  m.clear();
  switch (kind_) {
    case Kind::kSplit:
      regex_->find_all(in.text, m);
      cover(m, in.text.size(), invert_, spans);
      split_spans(in, spans, behavior_, out);
      return;
    case Kind::kByteLevel: {
      const Piece* src = &in;
      Piece prefixed;
      if (add_prefix_space_ && (in.text.empty() || in.text[0] != ' ')) {
        prefixed = {" " + in.text, in.at_origin};
        src = &prefixed;
      }
      if (!regex_) {
        out.push_back(*src);
        return;
      }
      regex_->find_all(src->text, m);
      cover(m, src->text.size(), false, spans);
      split_spans(*src, spans, SplitBehavior::kIsolated, out);
      return;
    }
    case Kind::kDigits:
      char_matches(in.text, is_numeric, m);
      cover(m, in.text.size(), false, spans);
      split_spans(in, spans, individual_digits_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, out);
      return;
    case Kind::kWhitespaceSplit:
      char_matches(in.text, is_whitespace, m);
      cover(m, in.text.size(), false, spans);
      split_spans(in, spans, SplitBehavior::kRemoved, out);
      return;
    case Kind::kMetaspace: {
      Piece p{std::string(), in.at_origin};
      p.text.reserve(in.text.size() + 3);
      for (char c : in.text) {
        if (c == ' ') p.text += replacement_;
        else p.text.push_back(c);
      }
      bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && in.at_origin)))
        p.text.insert(0, replacement_);
      if (!split_) {
        if (!p.text.empty()) out.push_back(std::move(p));
        return;
      }
      size_t pos = 0;
      while ((pos = p.text.find(replacement_, pos)) != std::string::npos) {
        m.emplace_back(pos, pos + replacement_.size());
        pos += replacement_.size();
      }
      cover(m, p.text.size(), false, spans);
      split_spans(p, spans, SplitBehavior::kMergedWithNext, out);
      return;
    }
    case Kind::kSequence:
      return;  // handled by apply()
  }
}

}  // namespace osprey::tok
