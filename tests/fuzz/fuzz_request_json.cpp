// libFuzzer target: request bodies through the server's JSON parsing and
// OpenAI request validation (chat, completions, tokenize, detokenize), and
// the error object and SSE formatting of whatever comes out. Must never
// crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/json_util.h"
#include "server/openai_format.h"
#include "server/openai_request.h"

using namespace osprey::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
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
