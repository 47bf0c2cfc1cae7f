// Public text facade: a model's tokenizer and chat template, for tools and
// the server (they use only include/osprey).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "osprey/status.h"

namespace osprey {

class Tokenizer;
class ChatTemplate;

class TextProcessor {
 public:
  ~TextProcessor();
  // path: "default", a model folder, a tokenizer.json (tokenizer_config.json
  // beside it is read too) or a .gguf file (only its metadata is read).
  static Expected<std::unique_ptr<TextProcessor>> open(const std::string& path);
  static std::unique_ptr<TextProcessor> wrap(std::shared_ptr<const Tokenizer> tokenizer);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  bool has_chat_template() const;
  // The chat template's Jinja source ("" when the model has none).
  const std::string& chat_template_source() const;
  // The same tokenizer with another chat template (Jinja source), e.g. a
  // user's --chat-template file; an error when it does not compile.
  Expected<std::unique_ptr<TextProcessor>> with_chat_template(const std::string& source) const;
  // Renders messages with the model's own template as transformers'
  // apply_chat_template does. messages and tools are JSON arrays as in the
  // OpenAI API (null tools: none); extra: an object of further template
  // variables (e.g. {"enable_thinking": false}). ordered_json keeps the key
  // order of the request, which shows in templates that print tool schemas.
  Expected<std::string> apply_chat_template(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                            bool add_generation_prompt, const nlohmann::ordered_json& extra) const;
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  TextProcessor() = default;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const ChatTemplate> template_;  // null: none, or it failed to compile
  std::string template_error_;                    // why template_ is null despite a source
  std::string template_source_;                   // the source of template_ (or of the failed one)
};

}  // namespace osprey
