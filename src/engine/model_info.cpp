#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "loader/gguf_file.h"
#include "model/builtin_configs.h"
#include "model/model.h"
#include "model/model_config.h"
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

namespace {

ModelShape shape_from_config(const ModelConfig& c, const std::string& source) {
  ModelShape s;
  s.source = source;
  s.architecture = c.architecture;
  s.num_layers = c.num_layers;
  s.hidden_size = c.hidden_size;
  s.num_heads = c.num_heads;
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  s.intermediate_size = c.intermediate_size;
  s.vocab_size = c.vocab_size;
  s.max_position_embeddings = c.max_position_embeddings;
  s.sliding_window = c.sliding_window;
  s.tie_word_embeddings = c.tie_word_embeddings;
  s.attention_bias = c.attention_bias;
  s.qk_norm = c.qk_norm;
  s.num_parameters = c.num_parameters();
  s.torch_dtype = c.torch_dtype;
  return s;
}

// Reads a config.json (at most 16 MiB) and parses it.
Expected<ModelShape> shape_from_json_file(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found("cannot open model config '" + file + "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > (16u << 20)) return invalid_argument("model config '" + file + "' is larger than 16 MiB");
  OSP_ASSIGN_OR_RETURN(ModelConfig c, model_config_from_hf_json(text.str(), file));
  OSP_RETURN_IF_ERROR(c.validate());
  return shape_from_config(c, file);
}

Expected<ModelShape> shape_from_gguf(const std::string& file) {
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> g, GgufFile::open(file));
  OSP_ASSIGN_OR_RETURN(ModelConfig c, model_config_from_gguf(*g));
  OSP_RETURN_IF_ERROR(c.validate());
  ModelShape s = shape_from_config(c, file);
  std::map<std::string, int> matrix_dtypes;  // dtype -> number of blk.* matrices
  for (const GgufTensorInfo& t : g->tensors()) {
    s.stored_weight_bytes += t.nbytes;
    if (t.name == "token_embd.weight") s.stored_embedding_bytes = t.nbytes;
    if (t.name == "output.weight") s.stored_lm_head_bytes = t.nbytes;
    if (t.shape.size() == 2 && t.name.rfind("blk.", 0) == 0) ++matrix_dtypes[std::string(dtype_name(t.dtype))];
  }
  int best = 0;
  for (const auto& [name, count] : matrix_dtypes) {
    if (count > best) {
      best = count;
      s.stored_matrix_dtype = name;
    }
  }
  for (char& ch : s.stored_matrix_dtype) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

std::vector<std::string> builtin_model_names() { return builtin_model_config_names(); }

Expected<ModelShape> model_shape(const std::string& name_or_path) {
  if (auto json = builtin_model_config(name_or_path)) {
    OSP_ASSIGN_OR_RETURN(ModelConfig c, model_config_from_hf_json(std::string(*json), name_or_path));
    OSP_RETURN_IF_ERROR(c.validate());
    return shape_from_config(c, name_or_path);
  }
  OSP_ASSIGN_OR_RETURN(std::string path, resolve_model_path(name_or_path));
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return shape_from_json_file(path + "/config.json");
  if (!std::filesystem::is_regular_file(path, ec)) {
    std::string names;
    for (const auto& n : builtin_model_config_names()) names += (names.empty() ? "" : ", ") + n;
    return not_found("model '" + path + "' is neither a bundled configuration (" + names +
                     ") nor a file or folder");
  }
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(magic, 4);
  if (in.gcount() == 4 && magic[0] == 'G' && magic[1] == 'G' && magic[2] == 'U' && magic[3] == 'F') {
    return shape_from_gguf(path);
  }
  return shape_from_json_file(path);
}

}  // namespace osprey
