// Public model inspection: what `osprey info` prints, and model path
// resolution ("default" names the bundled default model).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "osprey/status.h"

namespace osprey {

// The default model: SmolLM2-135M-Instruct Q4_1 (fetched by scripts/fetch_model.sh).
inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// "default" -> $OSPREY_MODELS_DIR or ~/.cache/osprey/models/<kDefaultModelFile>
// (an error says how to fetch it when absent); any other path is returned as is.
Expected<std::string> resolve_model_path(const std::string& name);

struct ModelInspection {
  std::string path;
  std::string format;        // "gguf" or "safetensors"
  std::string architecture;
  int64_t num_parameters = 0;
  int vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, max_position_embeddings = 0;
  float rope_theta = 0;
  bool tie_word_embeddings = false;
  std::vector<std::pair<std::string, int>> dtype_counts;  // storage dtype -> tensors
  uint64_t weight_bytes = 0;
  uint64_t kv_bytes_per_token = 0;  // F32 KV cache, all layers
};

Expected<ModelInspection> inspect_model(const std::string& path);

// A model's shape, read without loading its weights: what `osprey plan` needs.
// Parameter counts are in elements; stored_* fields are bytes as stored in a
// GGUF file (0 when the source holds no weights: a bundled name, a
// config.json, or a Hugging Face folder, whose weights are not opened).
struct ModelShape {
  std::string source;        // the bundled name or the path read
  std::string architecture;
  int num_layers = 0, hidden_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int intermediate_size = 0, vocab_size = 0, max_position_embeddings = 0;
  int sliding_window = 0;    // 0: full attention
  bool tie_word_embeddings = false;
  bool attention_bias = false, qk_norm = false;
  int64_t num_parameters = 0;  // every stored parameter (a tied embedding once)
  std::string torch_dtype;     // as declared by config.json; "" for GGUF
  uint64_t stored_weight_bytes = 0;     // all tensors of a GGUF file
  uint64_t stored_embedding_bytes = 0;  // its token embedding tensor
  uint64_t stored_lm_head_bytes = 0;    // its separate output tensor (0 when tied)
  std::string stored_matrix_dtype;      // the dtype most layer matrices use ("q4_1")
};

// `name_or_path`: a bundled configuration (builtin_model_names(), compared
// case-insensitively), "default", a config.json file, a Hugging Face folder
// (its config.json) or a .gguf file (metadata and tensor directory only).
Expected<ModelShape> model_shape(const std::string& name_or_path);
std::vector<std::string> builtin_model_names();

}  // namespace osprey
