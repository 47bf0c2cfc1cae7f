// Engine::create: the real model and tokenizer behind the engine. Kept apart
// from engine.cpp so that tests with a fake executor do not link the model.
#include "engine/engine_impl.h"
#include "engine/model_executor.h"
#include "engine/tokenizer_loader.h"
#include "model/model.h"
#include "ops/backend.h"

namespace osprey {

Expected<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  if (config.model_path.empty()) return invalid_argument("no model path given");
  std::unique_ptr<ops::Backend> backend = ops::make_cpu_backend(config.num_threads);
  ModelLoadOptions load;
  load.load_format = config.load_format;
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(config.model_path, *backend, load));
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, load_tokenizer_for_model(*model));
  EngineParts parts;
  parts.eos_token_ids.assign(model->config().eos_token_ids.begin(), model->config().eos_token_ids.end());
  parts.model_max_len = model->config().max_position_embeddings;
  parts.kv_bytes_per_token = model->kv_bytes_per_token();
  parts.model_path = config.model_path;
  parts.codec = make_tokenizer_codec(std::move(tokenizer));
  parts.executor = std::make_unique<ModelExecutor>(std::move(backend), std::move(model));
  return make_engine(config, std::move(parts));
}

}  // namespace osprey
