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

}  // namespace osprey
