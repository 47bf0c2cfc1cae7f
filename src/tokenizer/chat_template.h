// ChatTemplate: a compiled Hugging Face chat template (a Jinja2 program) and
// its sandboxed renderer. Rendering follows transformers' apply_chat_template
// (jinja2 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, raise_exception, strftime_now, tojson without HTML escaping).
//
// The template is untrusted input: compile() and render() never crash or hang;
// every failure (syntax error, raise_exception, undefined call, a limit hit)
// comes back as a Status whose message names line:column where known.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "osprey/status.h"

namespace osprey {

namespace jinja {
struct Template;
}

// Bounds on one render; exceeding any is an error (kResourceExhausted).
struct TemplateLimits {
  size_t max_output_bytes = 1 << 22;          // also bounds any one string value
  int64_t max_loop_iterations = 1'000'000;    // total over all loops; also bounds list sizes
  int max_recursion_depth = 64;               // nested macro / caller calls
  int64_t max_steps = 50'000'000;             // evaluation steps (nodes visited, items copied)
};

class ChatTemplate {
 public:
  // Parses the template. Syntax errors give kInvalidArgument with "line L, column C: ...".
  static Expected<ChatTemplate> compile(std::string_view source);

  // context: {"messages": [...], "tools": [...]?, "add_generation_prompt": bool,
  // "bos_token": "...", "eos_token": "...", plus any extra variables such as
  // "enable_thinking"}. Every top-level key becomes a template variable.
  // Prefer the ordered_json overload where the caller has one: Python dicts
  // keep insertion order, which shows in `tojson` and `.items()` output;
  // nlohmann::json sorts object keys.
  Expected<std::string> render(const nlohmann::json& context, const TemplateLimits& limits = {}) const;
  Expected<std::string> render(const nlohmann::ordered_json& context,
                               const TemplateLimits& limits = {}) const;

  const std::string& source() const;

 private:
  explicit ChatTemplate(std::shared_ptr<const jinja::Template> tmpl) : tmpl_(std::move(tmpl)) {}
  std::shared_ptr<const jinja::Template> tmpl_;  // immutable, shared by copies
};

}  // namespace osprey
