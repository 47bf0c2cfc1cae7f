#include <cstdlib>
#include <filesystem>

#include "model/model.h"
#include "osprey/model_info.h"

namespace osprey {

Expected<std::string> resolve_model_path(const std::string& name) {
  if (name != "default") return name;
  std::string dir;
  if (const char* env = std::getenv("OSPREY_MODELS_DIR"); env && *env) {
    dir = env;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/osprey/models";
  } else {
    return not_found("cannot locate the default model: neither OSPREY_MODELS_DIR nor HOME is set");
  }
  std::string path = dir + "/" + kDefaultModelFile;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return not_found("the default model is not at " + path + "; run ./scripts/fetch_model.sh to fetch it");
  }
  return path;
}

Expected<ModelInspection> inspect_model(const std::string& name) {
  OSP_ASSIGN_OR_RETURN(std::string path, resolve_model_path(name));
  auto backend = ops::make_cpu_backend(1);
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(path, *backend));
  const ModelConfig& c = model->config();
  ModelInspection info;
  info.path = path;
  info.format = model->gguf() ? "gguf" : "safetensors";
  info.architecture = c.architecture;
  info.num_parameters = c.num_parameters();
  info.vocab_size = c.vocab_size;
  info.hidden_size = c.hidden_size;
  info.intermediate_size = c.intermediate_size;
  info.num_layers = c.num_layers;
  info.num_heads = c.num_heads;
  info.num_kv_heads = c.num_kv_heads;
  info.head_dim = c.head_dim;
  info.max_position_embeddings = c.max_position_embeddings;
  info.rope_theta = c.rope_theta;
  info.tie_word_embeddings = c.tie_word_embeddings;
  info.dtype_counts = model->weight_dtype_counts();
  info.weight_bytes = model->weight_bytes();
  info.kv_bytes_per_token = model->kv_bytes_per_token();
  return info;
}

}  // namespace osprey
