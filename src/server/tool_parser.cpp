#include "server/tool_parser.h"

#include <nlohmann/json.hpp>

#include "core/json_nesting.h"
#include "server/json_util.h"

namespace osprey::server {

namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

std::string_view trim(std::string_view s) {
  size_t b = skip_space(s, 0), e = s.size();
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// The marker that starts a call inside content ("" for none).
std::string_view start_marker(ToolParserKind k) {
  switch (k) {
    case ToolParserKind::kHermes: return kHermesOpen;
    case ToolParserKind::kLlama3Json: return kPythonTag;
    case ToolParserKind::kMistral: return kMistralCalls;
    case ToolParserKind::kNone: break;
  }
  return {};
}

// One past the end of the JSON object or array starting at s[begin], or npos
// when it does not close (or nests deeper than kMaxJsonDepth).
size_t json_value_end(std::string_view s, size_t begin) {
  if (begin >= s.size() || (s[begin] != '{' && s[begin] != '[')) return std::string_view::npos;
  JsonNesting nesting;
  for (size_t i = begin; i < s.size(); ++i) {
    const int step = nesting.feed(s[i]);
    if (step > 0 && nesting.depth() > kMaxJsonDepth) return std::string_view::npos;
    if (step < 0 && nesting.depth() == 0) return i + 1;
  }
  return std::string_view::npos;
}

// Parses exactly one JSON value (no exceptions; discarded on any error).
json parse_value(std::string_view s) {
  if (json_max_depth(s, kMaxJsonDepth) > kMaxJsonDepth) return json(json::value_t::discarded);
  return json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
}

// {"name": string, "arguments" | "parameters": object | string | null}.
bool call_from_json(const json& j, ToolCall& call) {
  if (!j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
  call.name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || args->is_null()) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = dump_json(*args);
  } else if (args->is_string()) {
    call.arguments = args->get<std::string>();  // some models send the JSON text itself
  } else {
    return false;
  }
  return true;
}

// hermes: the JSON between the tags.
bool parse_hermes_body(std::string_view body, std::vector<ToolCall>& calls) {
  body = trim(body);
  ToolCall c;
  if (body.empty() || body.front() != '{' || json_value_end(body, 0) != body.size()) return false;
  if (!call_from_json(parse_value(body), c)) return false;
  calls.push_back(std::move(c));
  return true;
}

// llama3_json: one or more objects separated by ';' filling the whole body.
bool parse_llama_body(std::string_view body, std::vector<ToolCall>& calls) {
  size_t i = skip_space(body, 0);
  if (i == body.size()) return false;
  while (i < body.size()) {
    const size_t end = json_value_end(body, i);
    if (end == std::string_view::npos || body[i] != '{') return false;
    ToolCall c;
    if (!call_from_json(parse_value(body.substr(i, end - i)), c)) return false;
    calls.push_back(std::move(c));
    i = skip_space(body, end);
    if (i < body.size()) {
      if (body[i] != ';') return false;
      i = skip_space(body, i + 1);
    }
  }
  return true;
}

// mistral: an array of call objects (or one object); text after it is content.
bool parse_mistral_body(std::string_view body, std::vector<ToolCall>& calls, std::string_view& rest) {
  const size_t i = skip_space(body, 0);
  const size_t end = json_value_end(body, i);
  if (end == std::string_view::npos) return false;
  const json v = parse_value(body.substr(i, end - i));
  if (v.is_array()) {
    if (v.empty()) return false;
    for (const json& e : v) {
      ToolCall c;
      if (!call_from_json(e, c)) return false;
      calls.push_back(std::move(c));
    }
  } else {
    ToolCall c;
    if (!call_from_json(v, c)) return false;
    calls.push_back(std::move(c));
  }
  rest = body.substr(end);
  return true;
}

}  // namespace

std::optional<ToolParserKind> tool_parser_from_name(std::string_view name) {
  if (name == "none") return ToolParserKind::kNone;
  if (name == "hermes") return ToolParserKind::kHermes;
  if (name == "llama3_json") return ToolParserKind::kLlama3Json;
  if (name == "mistral") return ToolParserKind::kMistral;
  return std::nullopt;
}

const char* tool_parser_name(ToolParserKind kind) {
  switch (kind) {
    case ToolParserKind::kHermes: return "hermes";
    case ToolParserKind::kLlama3Json: return "llama3_json";
    case ToolParserKind::kMistral: return "mistral";
    case ToolParserKind::kNone: break;
  }
  return "none";
}

ToolParserKind detect_tool_parser(std::string_view src) {
  if (src.find(kHermesOpen) != std::string_view::npos) return ToolParserKind::kHermes;
  if (src.find(kMistralCalls) != std::string_view::npos) return ToolParserKind::kMistral;
  if (src.find(kPythonTag) != std::string_view::npos ||
      (src.find("ipython") != std::string_view::npos && src.find("\"parameters\"") != std::string_view::npos))
    return ToolParserKind::kLlama3Json;
  return ToolParserKind::kNone;
}

bool tool_parser_needs_special_tokens(ToolParserKind kind) {
  return kind == ToolParserKind::kLlama3Json || kind == ToolParserKind::kMistral;
}

void ToolCallStream::emit_content(ToolParseResult& out, std::string_view text) {
  if (after_call_) {
    text = text.substr(skip_space(text, 0));
    if (text.empty()) return;
    after_call_ = false;
  }
  size_t body_end = text.size();
  while (body_end > 0 && is_space(text[body_end - 1])) --body_end;
  if (body_end == 0) {
    held_ws_ += text;
    return;
  }
  out.content += held_ws_;
  held_ws_.clear();
  out.content += text.substr(0, body_end);
  held_ws_ = std::string(text.substr(body_end));
}

void ToolCallStream::emit_call(ToolParseResult& out, ToolCall call) {
  held_ws_.clear();
  after_call_ = true;
  call.id = random_id("call_");
  out.calls.push_back(std::move(call));
  ++num_calls_;
}

void ToolCallStream::run(ToolParseResult& out, bool at_end) {
  const std::string_view marker = start_marker(kind_);
  while (true) {
    if (mode_ == Mode::kStart) {
      if (kind_ != ToolParserKind::kLlama3Json) {
        mode_ = Mode::kContent;
        continue;
      }
      // llama3_json: an output that opens with '{' is (maybe) a call.
      const size_t i = skip_space(pending_, 0);
      if (i == pending_.size()) {
        if (!at_end) return;
        mode_ = Mode::kContent;
        continue;
      }
      mode_ = pending_[i] == '{' ? Mode::kInCall : Mode::kContent;
      continue;
    }
    if (mode_ == Mode::kContent) {
      if (marker.empty()) {
        emit_content(out, pending_);
        pending_.clear();
        return;
      }
      const size_t p = pending_.find(marker);
      if (p != std::string::npos) {
        emit_content(out, std::string_view(pending_).substr(0, p));
        pending_.erase(0, p);
        mode_ = Mode::kInCall;
        continue;
      }
      size_t hold = 0;
      if (!at_end)
        for (size_t k = std::min(marker.size() - 1, pending_.size()); k > 0; --k)
          if (std::string_view(pending_).substr(pending_.size() - k) == marker.substr(0, k)) {
            hold = k;
            break;
          }
      emit_content(out, std::string_view(pending_).substr(0, pending_.size() - hold));
      pending_.erase(0, pending_.size() - hold);
      return;
    }
    // kInCall: pending_ starts with the marker (or, llama3_json at the start, with '{').
    if (kind_ == ToolParserKind::kHermes) {
      const size_t q = pending_.find(kHermesClose, kHermesOpen.size());
      if (q == std::string::npos && !at_end) return;
      const size_t body_end = q == std::string::npos ? pending_.size() : q;
      const size_t raw_end = q == std::string::npos ? pending_.size() : q + kHermesClose.size();
      std::vector<ToolCall> calls;
      const std::string_view body = std::string_view(pending_).substr(kHermesOpen.size(), body_end - kHermesOpen.size());
      if (parse_hermes_body(body, calls))
        emit_call(out, std::move(calls[0]));
      else
        emit_content(out, std::string_view(pending_).substr(0, raw_end));
      pending_.erase(0, raw_end);
      mode_ = Mode::kContent;
      if (q == std::string::npos) return;
      continue;
    }
    if (!at_end) return;  // llama3_json and mistral: the call runs to the end of the output
    const bool tagged = pending_.compare(0, marker.size(), marker) == 0;
    const std::string_view body = std::string_view(pending_).substr(tagged ? marker.size() : 0);
    std::vector<ToolCall> calls;
    std::string_view rest;
    const bool ok = kind_ == ToolParserKind::kMistral ? parse_mistral_body(body, calls, rest)
                                                      : parse_llama_body(body, calls);
    if (ok) {
      for (auto& c : calls) emit_call(out, std::move(c));
      emit_content(out, rest);
    } else {
      emit_content(out, pending_);
    }
    pending_.clear();
    mode_ = Mode::kContent;
    return;
  }
}

ToolParseResult ToolCallStream::push(std::string_view delta) {
  ToolParseResult out;
  pending_ += delta;
  run(out, false);
  return out;
}

ToolParseResult ToolCallStream::finish() {
  ToolParseResult out;
  run(out, true);
  out.content += held_ws_;
  held_ws_.clear();
  return out;
}

ToolParseResult parse_tool_calls(ToolParserKind kind, std::string_view text) {
  ToolCallStream s(kind);
  ToolParseResult a = s.push(text);
  ToolParseResult b = s.finish();
  a.content += b.content;
  for (auto& c : b.calls) a.calls.push_back(std::move(c));
  return a;
}

}  // namespace osprey::server
