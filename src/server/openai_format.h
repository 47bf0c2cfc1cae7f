// OpenAI response shapes: chat.completion, chat.completion.chunk,
// text_completion (whole and streamed), usage, logprobs, SSE framing.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "osprey/engine.h"
#include "server/tool_parser.h"

namespace osprey::server {

// Identity shared by every chunk of one response.
struct ResponseMeta {
  std::string id;           // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;      // Unix seconds
  std::string model;        // the served model name
  std::string fingerprint;  // system_fingerprint
};

// A logprob OpenAI can carry in JSON (-inf -> -9999.0, as OpenAI does).
double json_logprob(float lp);

nlohmann::ordered_json usage_json(const Usage& u);

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}.
nlohmann::ordered_json chat_logprobs_json(const std::vector<TokenLogprob>& lps);

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
// appends to `out` (created as an object of empty arrays when null).
// `offset` is the byte offset of the first token in the choice's text;
// advanced by each token's length. A token with `no_logprob` (the first
// prompt token under echo) gets null entries.
void append_completion_logprobs(nlohmann::ordered_json& out, const std::vector<TokenLogprob>& lps, size_t& offset,
                                bool first_is_null = false);

// finish_reason as JSON ("stop", "length", "abort", "error" or null).
nlohmann::ordered_json finish_json(FinishReason r);

// One choice of a whole chat.completion response.
nlohmann::ordered_json chat_choice(int index, const std::string& text, const nlohmann::ordered_json& logprobs, FinishReason finish);
// message.tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
nlohmann::ordered_json tool_calls_json(const std::vector<ToolCall>& calls);
// A streamed tool call is two chat deltas: first
// {"tool_calls": [{"index", "id", "type": "function", "function": {"name", "arguments": ""}}]},
// then {"tool_calls": [{"index", "function": {"arguments"}}]}. `call_index`
// counts the choice's calls from 0.
nlohmann::ordered_json tool_call_name_delta(int call_index, const ToolCall& c);
nlohmann::ordered_json tool_call_arguments_delta(int call_index, const ToolCall& c);

// One choice of a whole text_completion response.
nlohmann::ordered_json completion_choice(int index, const std::string& text, const nlohmann::ordered_json& logprobs,
                                 FinishReason finish);
nlohmann::ordered_json chat_response(const ResponseMeta& m, nlohmann::ordered_json choices, const Usage& usage);
nlohmann::ordered_json completion_response(const ResponseMeta& m, nlohmann::ordered_json choices, const Usage& usage);

// Streamed chunks. `delta` is the chat delta object ({"role"}, {"content"}, {});
// `usage_null` adds "usage": null (when the client asked for include_usage).
nlohmann::ordered_json chat_chunk(const ResponseMeta& m, int index, nlohmann::ordered_json delta, const nlohmann::ordered_json& logprobs,
                          FinishReason finish, bool usage_null);
nlohmann::ordered_json completion_chunk(const ResponseMeta& m, int index, const std::string& text,
                                const nlohmann::ordered_json& logprobs, FinishReason finish, bool usage_null);
// The last chunk under stream_options.include_usage: no choices, usage set.
nlohmann::ordered_json usage_chunk(const ResponseMeta& m, bool chat, const Usage& usage);

// "data: <json>\n\n"
std::string sse_event(const nlohmann::ordered_json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace osprey::server
