// ModelConfig: the architecture-independent description of a decoder-only
// transformer, filled from a Hugging Face config.json or GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/rope_freq.h"
#include "osprey/status.h"

namespace osprey {

class GgufFile;

struct ModelConfig {
  std::string architecture;  // registry key: "llama", "mistral", "qwen2", "qwen3"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  ops::RopeScalingParams rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm on q and k (Qwen3)
  int sliding_window = 0;       // 0: full attention
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  std::string torch_dtype;      // as declared by the file, informational

  // Sanity limits for untrusted files; returns an error naming the field.
  Status validate() const;
  int64_t num_parameters() const;
};

// From a Hugging Face config.json text (model_type selects the architecture).
Expected<ModelConfig> model_config_from_hf_json(const std::string& json_text, const std::string& origin);
// From GGUF metadata (general.architecture and <arch>.* keys).
Expected<ModelConfig> model_config_from_gguf(const GgufFile& gguf);

}  // namespace osprey
