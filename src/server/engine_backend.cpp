// GenerationBackend over the real osprey::Engine.
#include "osprey/text.h"
#include "server/generation_backend.h"

namespace osprey::server {

namespace {

class EngineBackend final : public GenerationBackend {
 public:
  explicit EngineBackend(std::unique_ptr<Engine> engine) : engine_(std::move(engine)), text_(engine_->text()) {}

  Expected<std::shared_ptr<RequestStream>> submit(Request request, OutputCallback callback) override {
    return engine_->submit(std::move(request), std::move(callback));
  }
  bool cancel(const std::string& id) override { return engine_->cancel(id); }
  EngineStats stats() const override { return engine_->stats(); }
  ModelInfo model_info() const override { return engine_->model_info(); }
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    return text_->encode(text, add_special_tokens);
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    return text_->decode(ids, skip_special_tokens);
  }
  Expected<std::string> apply_chat_template(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                            bool add_generation_prompt, const nlohmann::ordered_json& extra) const override {
    if (!text_->has_chat_template())
      return invalid_argument("this model has no chat template; use /v1/completions instead");
    return text_->apply_chat_template(messages, tools, add_generation_prompt, extra);
  }
  std::string chat_template_source() const override { return text_->chat_template_source(); }
  // Called once, before the backend serves requests (text_ is not guarded).
  Status set_chat_template(const std::string& source) override {
    OSP_ASSIGN_OR_RETURN(std::unique_ptr<TextProcessor> t, text_->with_chat_template(source));
    text_ = std::move(t);
    return Status::Ok();
  }
  void shutdown() override { engine_->shutdown(); }

 private:
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<const TextProcessor> text_;  // the engine's own tokenizer and template
};

}  // namespace

Expected<std::unique_ptr<GenerationBackend>> make_engine_backend(const EngineConfig& config) {
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(config));
  if (!engine->text()) return internal_error("the engine has no tokenizer");
  return std::unique_ptr<GenerationBackend>(new EngineBackend(std::move(engine)));
}

}  // namespace osprey::server
