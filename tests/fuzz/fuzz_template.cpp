// libFuzzer target: compile arbitrary template text and render it against a
// fixed chat context under small limits. Any crash, hang or sanitizer report
// is a bug; errors returned as Status are expected.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json kContext = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi {{ x }} é 🌍"},
      {"role": "assistant", "content": "<think>\nr\n</think>\n\nHello", "reasoning_content": "r",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [1.5, null, true]}}}]},
      {"role": "tool", "content": "{\"ok\": true}"},
      {"role": "user", "content": ""}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "documents": null,
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "enable_thinking": false
  })");
  return kContext;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 16) return 0;
  std::string_view src(reinterpret_cast<const char*>(data), size);
  auto t = osprey::ChatTemplate::compile(src);
  if (!t.ok()) return 0;
  osprey::TemplateLimits limits;
  limits.max_output_bytes = 1 << 16;
  limits.max_loop_iterations = 10'000;
  limits.max_recursion_depth = 16;
  limits.max_steps = 200'000;
  auto out = t->render(context(), limits);
  (void)out;
  return 0;
}
