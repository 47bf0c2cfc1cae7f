#include "tokenizer/normalizer.h"

#include <nlohmann/json.hpp>

#include "tokenizer/unicode_text.h"

namespace osprey::tok {

using nlohmann::json;

std::string regex_replace_all(const Regex& re, std::string_view s, std::string_view content) {
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all(s, m);
  if (m.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size() + m.size() * content.size());
  size_t prev = 0;
  for (auto [a, b] : m) {
    out.append(s.substr(prev, a - prev));
    out.append(content);
    prev = b;
  }
  out.append(s.substr(prev));
  return out;
}

Expected<std::unique_ptr<Regex>> compile_pattern(const json& pattern, std::string_view where) {
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string())
    return Regex::literal(pattern["String"].get<std::string>());
  if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    auto r = Regex::compile(pattern["Regex"].get<std::string>());
    if (!r.ok()) return invalid_argument(std::string(where) + ": " + r.status().message());
    return r;
  }
  return invalid_argument(std::string(where) + ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

std::unique_ptr<Normalizer> Normalizer::make_nfc() {
  auto n = std::make_unique<Normalizer>();
  n->kind_ = Kind::kNfc;
  return n;
}

Expected<std::unique_ptr<Normalizer>> Normalizer::from_json(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument("normalizer: object with a string \"type\" expected");
  const std::string type = j["type"].get<std::string>();
  auto n = std::make_unique<Normalizer>();
  if (type == "NFC") {
    n->kind_ = Kind::kNfc;
  } else if (type == "NFKC") {
    n->kind_ = Kind::kNfkc;
  } else if (type == "NFD") {
    n->kind_ = Kind::kNfd;
  } else if (type == "NFKD") {
    n->kind_ = Kind::kNfkd;
  } else if (type == "Lowercase") {
    n->kind_ = Kind::kLowercase;
  } else if (type == "Prepend") {
    n->kind_ = Kind::kPrepend;
    if (!j.contains("prepend") || !j["prepend"].is_string())
      return invalid_argument("normalizer Prepend: string \"prepend\" expected");
    n->text_ = j["prepend"].get<std::string>();
  } else if (type == "Replace") {
    n->kind_ = Kind::kReplace;
    if (!j.contains("content") || !j["content"].is_string() || !j.contains("pattern"))
      return invalid_argument("normalizer Replace: \"pattern\" and string \"content\" expected");
    n->text_ = j["content"].get<std::string>();
    OSP_ASSIGN_OR_RETURN(n->pattern_, compile_pattern(j["pattern"], "normalizer Replace"));
  } else if (type == "Strip") {
    n->kind_ = Kind::kStrip;
    n->strip_left_ = j.value("strip_left", false);
    n->strip_right_ = j.value("strip_right", false);
  } else if (type == "Sequence") {
    n->kind_ = Kind::kSequence;
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      return invalid_argument("normalizer Sequence: array \"normalizers\" expected");
    for (const auto& c : j["normalizers"]) {
      OSP_ASSIGN_OR_RETURN(auto child, from_json(c));
      n->children_.push_back(std::move(child));
    }
  } else {
    return unsupported("normalizer type '" + type + "' is not supported");
  }
  return n;
}

std::string Normalizer::apply(std::string_view s) const {
  switch (kind_) {
    case Kind::kNfc: return nfc(s);
    case Kind::kNfkc: return nfkc(s);
    case Kind::kNfd: return nfd(s);
    case Kind::kNfkd: return nfkd(s);
    case Kind::kLowercase: return to_lower(s);
    case Kind::kPrepend: return s.empty() ? std::string() : text_ + std::string(s);
    case Kind::kReplace: return regex_replace_all(*pattern_, s, text_);
    case Kind::kStrip: {
      size_t a = 0, b = s.size();
      if (strip_left_) {
        while (a < b) {
          size_t i = a;
          if (!is_whitespace(next_code_point(s, i))) break;
          a = i;
        }
      }
      if (strip_right_) {
        while (b > a) {
          size_t k = b - 1;
          while (k > a && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
          size_t i = k;
          if (!is_whitespace(next_code_point(s, i))) break;
          b = k;
        }
      }
      return std::string(s.substr(a, b - a));
    }
    case Kind::kSequence: {
      std::string cur(s);
      for (const auto& c : children_) cur = c->apply(cur);
      return cur;
    }
  }
  return std::string(s);
}

}  // namespace osprey::tok
