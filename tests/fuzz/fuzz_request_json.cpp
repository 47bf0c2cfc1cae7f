// libFuzzer target: request bodies through the server's JSON parsing and
// OpenAI request validation (chat, completions, tokenize, detokenize), and
// the error object and SSE formatting of whatever comes out. The same bytes
// also go through the tool-call parsers as if a model had written them:
// whole and streamed in two pieces must agree, and text without a parsed
// call must come back unchanged. Must never crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/json_util.h"
#include "server/openai_format.h"
#include "server/openai_request.h"
#include "server/tool_parser.h"

using namespace osprey::server;

namespace {

void check_tool_parsers(std::string_view text) {
  for (auto kind : {ToolParserKind::kHermes, ToolParserKind::kLlama3Json, ToolParserKind::kMistral}) {
    const ToolParseResult whole = parse_tool_calls(kind, text);
    if (whole.calls.empty() && whole.content != text) std::abort();
    const size_t cut = text.empty() ? 0 : static_cast<unsigned char>(text[0]) % (text.size() + 1);
    ToolCallStream s(kind);
    ToolParseResult a = s.push(text.substr(0, cut));
    ToolParseResult b = s.push(text.substr(cut));
    ToolParseResult c = s.finish();
    if (a.content + b.content + c.content != whole.content) std::abort();
    if (a.calls.size() + b.calls.size() + c.calls.size() != whole.calls.size()) std::abort();
    (void)dump_json(tool_calls_json(whole.calls));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check_tool_parsers(body);
  auto parsed = parse_json_object(body);
  if (!parsed.ok()) {
    (void)dump_json(parsed.error->to_json());
    return 0;
  }
  ParseLimits limits;
  limits.vocab_size = 49152;
  const nlohmann::ordered_json& j = *parsed.value;
  if (auto chat = parse_chat_request(j, limits); chat.ok()) {
    (void)sse_event(chat_chunk({"chatcmpl-x", 0, chat.value->model, "fp"}, 0, {{"content", chat.value->user}}, nullptr,
                               osprey::FinishReason::kNone, chat.value->include_usage));
  } else {
    (void)dump_json(chat.error->to_json());
  }
  if (auto comp = parse_completion_request(j, limits); comp.ok()) {
    for (const PromptSpec& p : comp.value->prompts) (void)sse_event(nlohmann::ordered_json(p.text));
  } else {
    (void)dump_json(comp.error->to_json());
  }
  (void)parse_tokenize_request(j, limits);
  (void)parse_detokenize_request(j, limits);
  return 0;
}
