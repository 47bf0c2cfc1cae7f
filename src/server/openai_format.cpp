#include "server/openai_format.h"

#include <cmath>

#include "server/json_util.h"

namespace osprey::server {

using json = nlohmann::ordered_json;

double json_logprob(float lp) {
  if (std::isnan(lp) || lp < -9999.0f) return -9999.0;
  return lp;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

json chat_logprobs_json(const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const TokenLogprob& t : lps) {
    json top = json::array();
    for (const TopLogprob& alt : t.top)
      top.push_back({{"token", alt.token}, {"logprob", json_logprob(alt.logprob)}, {"bytes", bytes_json(alt.token)}});
    content.push_back({{"token", t.token},
                       {"logprob", json_logprob(t.logprob)},
                       {"bytes", bytes_json(t.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

void append_completion_logprobs(json& out, const std::vector<TokenLogprob>& lps, size_t& offset, bool first_is_null) {
  if (out.is_null())
    out = {{"tokens", json::array()},
           {"token_logprobs", json::array()},
           {"top_logprobs", json::array()},
           {"text_offset", json::array()}};
  for (size_t i = 0; i < lps.size(); ++i) {
    const TokenLogprob& t = lps[i];
    out["tokens"].push_back(t.token);
    out["text_offset"].push_back(offset);
    offset += t.token.size();
    if (first_is_null && i == 0) {
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
      continue;
    }
    out["token_logprobs"].push_back(json_logprob(t.logprob));
    json top = json::object();
    for (const TopLogprob& alt : t.top) top[alt.token] = json_logprob(alt.logprob);
    out["top_logprobs"].push_back(std::move(top));
  }
}

json finish_json(FinishReason r) {
  if (r == FinishReason::kNone) return nullptr;
  return finish_reason_name(r);
}

json chat_choice(int index, const std::string& text, const json& logprobs, FinishReason finish) {
  return {{"index", index},
          {"message", {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}, {"tool_calls", json::array()}}},
          {"logprobs", logprobs},
          {"finish_reason", finish_json(finish)}};
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json a = json::array();
  for (const ToolCall& c : calls)
    a.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return a;
}

json tool_call_name_delta(int call_index, const ToolCall& c) {
  return {{"tool_calls", json::array({{{"index", call_index},
                                       {"id", c.id},
                                       {"type", "function"},
                                       {"function", {{"name", c.name}, {"arguments", ""}}}}})}};
}

json tool_call_arguments_delta(int call_index, const ToolCall& c) {
  return {{"tool_calls", json::array({{{"index", call_index}, {"function", {{"arguments", c.arguments}}}}})}};
}

json completion_choice(int index, const std::string& text, const json& logprobs, FinishReason finish) {
  return {{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_json(finish)}};
}

json chat_response(const ResponseMeta& m, json choices, const Usage& usage) {
  return {{"id", m.id},
          {"object", "chat.completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", std::move(choices)},
          {"usage", usage_json(usage)},
          {"system_fingerprint", m.fingerprint}};
}

json completion_response(const ResponseMeta& m, json choices, const Usage& usage) {
  return {{"id", m.id},
          {"object", "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", std::move(choices)},
          {"usage", usage_json(usage)},
          {"system_fingerprint", m.fingerprint}};
}

json chat_chunk(const ResponseMeta& m, int index, json delta, const json& logprobs, FinishReason finish,
                bool usage_null) {
  json choice = {
      {"index", index}, {"delta", std::move(delta)}, {"logprobs", logprobs}, {"finish_reason", finish_json(finish)}};
  json j = {{"id", m.id},       {"object", "chat.completion.chunk"},   {"created", m.created},
            {"model", m.model}, {"system_fingerprint", m.fingerprint}, {"choices", json::array({std::move(choice)})}};
  if (usage_null) j["usage"] = nullptr;
  return j;
}

json completion_chunk(const ResponseMeta& m, int index, const std::string& text, const json& logprobs,
                      FinishReason finish, bool usage_null) {
  json choice = {{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_json(finish)}};
  json j = {{"id", m.id},       {"object", "text_completion"},         {"created", m.created},
            {"model", m.model}, {"system_fingerprint", m.fingerprint}, {"choices", json::array({std::move(choice)})}};
  if (usage_null) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const ResponseMeta& m, bool chat, const Usage& usage) {
  return {{"id", m.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"system_fingerprint", m.fingerprint},
          {"choices", json::array()},
          {"usage", usage_json(usage)}};
}

std::string sse_event(const json& j) {
  std::string s = "data: ";
  s += dump_json(j);
  s += "\n\n";
  return s;
}

}  // namespace osprey::server
