#include <nlohmann/json.hpp>

#include "engine/tokenizer_loader.h"
#include "osprey/model_info.h"
#include "osprey/text.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace osprey {

TextProcessor::~TextProcessor() = default;

Expected<std::unique_ptr<TextProcessor>> TextProcessor::open(const std::string& path) {
  OSP_ASSIGN_OR_RETURN(std::string resolved, resolve_model_path(path));
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, load_tokenizer_from_path(resolved));
  return wrap(std::shared_ptr<const Tokenizer>(std::move(tok)));
}

std::unique_ptr<TextProcessor> TextProcessor::wrap(std::shared_ptr<const Tokenizer> tokenizer) {
  std::unique_ptr<TextProcessor> p(new TextProcessor());
  p->tokenizer_ = std::move(tokenizer);
  const std::string& source = p->tokenizer_->chat_template();
  p->template_source_ = source;
  if (!source.empty()) {
    auto compiled = ChatTemplate::compile(source);
    if (compiled.ok()) {
      p->template_ = std::make_shared<const ChatTemplate>(std::move(compiled).value());
    } else {
      p->template_error_ = "the model's chat template does not compile: " + compiled.status().message();
    }
  }
  return p;
}

std::vector<int32_t> TextProcessor::encode(std::string_view text, bool add_special_tokens) const {
  return tokenizer_->encode(text, add_special_tokens);
}

std::string TextProcessor::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return tokenizer_->decode(ids, skip_special_tokens);
}

bool TextProcessor::has_chat_template() const { return template_ != nullptr; }

const std::string& TextProcessor::chat_template_source() const { return template_source_; }

Expected<std::unique_ptr<TextProcessor>> TextProcessor::with_chat_template(const std::string& source) const {
  auto compiled = ChatTemplate::compile(source);
  if (!compiled.ok()) return invalid_argument("the chat template does not compile: " + compiled.status().message());
  std::unique_ptr<TextProcessor> p(new TextProcessor());
  p->tokenizer_ = tokenizer_;
  p->template_ = std::make_shared<const ChatTemplate>(std::move(compiled).value());
  p->template_source_ = source;
  return p;
}

namespace {

// What transformers does to messages before rendering: keys whose value is
// null are dropped, and the reasoning field is visible under each of the
// names templates use for it.
nlohmann::ordered_json prepare_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return messages;
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) {
      out.push_back(m);
      continue;
    }
    nlohmann::ordered_json clean = nlohmann::ordered_json::object();
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (!it.value().is_null()) clean[it.key()] = it.value();
    }
    for (const char* key : {"reasoning_content", "reasoning", "thinking"}) {
      if (!clean.contains(key)) continue;
      for (const char* alias : {"reasoning_content", "reasoning", "thinking"}) {
        if (!clean.contains(alias)) clean[alias] = clean[key];
      }
      break;
    }
    out.push_back(std::move(clean));
  }
  return out;
}

}  // namespace

Expected<std::string> TextProcessor::apply_chat_template(const nlohmann::ordered_json& messages,
                                                         const nlohmann::ordered_json& tools,
                                                         bool add_generation_prompt,
                                                         const nlohmann::ordered_json& extra) const {
  if (!template_) {
    return invalid_argument(template_error_.empty() ? "this model has no chat template" : template_error_);
  }
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (extra.is_object()) ctx = extra;
  ctx["messages"] = prepare_messages(messages);
  ctx["tools"] = tools;
  if (!ctx.contains("documents")) ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = tokenizer_->bos_token();
  ctx["eos_token"] = tokenizer_->eos_token();
  return template_->render(ctx);
}

}  // namespace osprey
