// Engine::create: the real model and tokenizer behind the engine. Kept apart
// from engine.cpp so that tests with a fake executor do not link the model.
#include "engine/engine_impl.h"
#include "engine/model_executor.h"
#include "engine/tokenizer_loader.h"
#include "model/model.h"
#include "ops/backend.h"
#include "osprey/model_info.h"
#include "osprey/text.h"

namespace osprey {

namespace {

Expected<std::unique_ptr<ops::Backend>> make_backend(const EngineConfig& config) {
  if (config.device == "cpu") return ops::make_cpu_backend(config.num_threads);
  if (config.device.rfind("cuda", 0) == 0) {
#ifdef OSPREY_HAVE_CUDA
    int index = 0;
    if (config.device.size() > 4) {
      if (config.device[4] != ':' || config.device.size() == 5) {
        return invalid_argument("device must be cpu, cuda or cuda:N, got '" + config.device + "'");
      }
      try {
        index = std::stoi(config.device.substr(5));
      } catch (...) {
        return invalid_argument("device must be cpu, cuda or cuda:N, got '" + config.device + "'");
      }
    }
    auto backend = ops::make_cuda_backend(index);
    if (!backend) return Status(StatusCode::kUnavailable, "cannot open CUDA device " + std::to_string(index));
    return backend;
#else
    return unsupported("this osprey was built without the CUDA backend (device '" + config.device + "')");
#endif
  }
  return invalid_argument("device must be cpu, cuda or cuda:N, got '" + config.device + "'");
}

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  if (config.model_path.empty()) return invalid_argument("no model path given");
  OSP_ASSIGN_OR_RETURN(std::string path, resolve_model_path(config.model_path));
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<ops::Backend> backend, make_backend(config));
  ModelLoadOptions load;
  load.load_format = config.load_format;
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(path, *backend, load));
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, load_tokenizer_for_model(*model));
  std::shared_ptr<const Tokenizer> shared_tokenizer(std::move(tokenizer));
  EngineParts parts;
  parts.eos_token_ids.assign(model->config().eos_token_ids.begin(), model->config().eos_token_ids.end());
  parts.model_max_len = model->config().max_position_embeddings;
  parts.kv_bytes_per_token = model->kv_bytes_per_token();
  parts.model_path = path;
  parts.codec = make_tokenizer_codec(shared_tokenizer);
  parts.text = TextProcessor::wrap(shared_tokenizer);
  parts.executor = std::make_unique<ModelExecutor>(std::move(backend), std::move(model));
  return make_engine(config, std::move(parts));
}

}  // namespace osprey
