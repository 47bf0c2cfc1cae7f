#include "bench/sse_parser.h"

#include <nlohmann/json.hpp>

namespace osprey::bench {

void SseParser::take_line() {
  const std::string_view line(line_);
  const size_t colon = line.find(':');
  if (colon == 0) return;  // comment
  const std::string_view field = line.substr(0, colon);
  if (field != "data") return;
  std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

namespace {

// Appends a string field's text; true when it is a non-empty string.
bool take_text(const nlohmann::json& obj, const char* key, size_t& bytes, std::string* text) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return false;
  const auto& s = it->get_ref<const std::string&>();
  if (s.empty()) return false;
  bytes += s.size();
  if (text) text->append(s);
  return true;
}

}  // namespace

ChunkInfo parse_openai_chunk(std::string_view data, std::string* text) {
  ChunkInfo info;
  // Trailing whitespace is tolerated around the [DONE] sentinel.
  std::string_view trimmed = data;
  while (!trimmed.empty() && (trimmed.back() == ' ' || trimmed.back() == '\n')) trimmed.remove_suffix(1);
  if (trimmed == "[DONE]") {
    info.done = true;
    return info;
  }
  const nlohmann::json j = nlohmann::json::parse(data.begin(), data.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    info.malformed = true;
    return info;
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    info.error = true;
    if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
      info.error_message = (*e)["message"].get<std::string>();
    else
      info.error_message = e->dump();
    return info;
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    auto p = u->find("prompt_tokens");
    auto c = u->find("completion_tokens");
    if (p != u->end() && p->is_number_integer() && c != u->end() && c->is_number_integer()) {
      info.has_usage = true;
      info.prompt_tokens = p->get<int>();
      info.completion_tokens = c->get<int>();
    }
  }
  auto ch = j.find("choices");
  if (ch == j.end()) {
    if (!info.has_usage) info.malformed = true;  // neither choices nor usage
    return info;
  }
  if (!ch->is_array()) {
    info.malformed = true;
    return info;
  }
  for (const auto& c : *ch) {
    if (!c.is_object()) {
      info.malformed = true;
      return info;
    }
    if (take_text(c, "text", info.text_bytes, text)) info.has_token = true;
    if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
      if (take_text(*d, "content", info.text_bytes, text)) info.has_token = true;
      if (take_text(*d, "reasoning_content", info.text_bytes, nullptr)) info.has_token = true;
    }
  }
  return info;
}

}  // namespace osprey::bench
