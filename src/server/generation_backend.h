// GenerationBackend: what the OpenAI service needs from an engine. The real
// one wraps osprey::Engine and a TextProcessor on the same model; tests use a
// fake that needs no model.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "osprey/engine.h"

namespace osprey::server {

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  virtual Expected<std::shared_ptr<RequestStream>> submit(Request request, OutputCallback callback) = 0;
  virtual bool cancel(const std::string& request_id) = 0;
  virtual EngineStats stats() const = 0;
  virtual ModelInfo model_info() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;
  virtual Expected<std::string> apply_chat_template(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                                    bool add_generation_prompt, const nlohmann::ordered_json& extra) const = 0;
  // The chat template's Jinja source ("" when none or unknown): picks the
  // tool-call parser under --tool-call-parser auto.
  virtual std::string chat_template_source() const { return {}; }
  // Replaces the model's chat template (--chat-template); an error when the
  // source does not compile or the backend cannot.
  virtual Status set_chat_template(const std::string& source) {
    (void)source;
    return invalid_argument("this backend cannot change its chat template");
  }
  virtual void shutdown() = 0;
};

// Loads the model at `config.model_path` (engine and text processor).
Expected<std::unique_ptr<GenerationBackend>> make_engine_backend(const EngineConfig& config);

}  // namespace osprey::server
