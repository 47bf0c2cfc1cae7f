#include "model/builtin_configs.h"

#include <algorithm>
#include <cctype>

namespace osprey {

namespace {

struct BuiltinConfig {
  const char* name;
  const char* json;
};

// Shapes as published in each model's config.json (weights are not bundled).
constexpr BuiltinConfig kConfigs[] = {
    {"llama-3-8b", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": null, "attention_bias": false, "tie_word_embeddings": false, "bos_token_id": 128000,
  "eos_token_id": 128001, "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"llama-3.1-8b", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "attention_bias": false, "tie_word_embeddings": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"llama-3-70b", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
  "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
  "num_key_value_heads": 8, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": null, "attention_bias": false, "tie_word_embeddings": false, "bos_token_id": 128000,
  "eos_token_id": 128001, "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"llama-3.2-1b", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
  "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
  "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "attention_bias": false, "tie_word_embeddings": true, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"qwen2.5-7b", R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
  "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
  "num_key_value_heads": 4, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "use_sliding_window": false, "max_window_layers": 28, "tie_word_embeddings": false,
  "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"mistral-7b", R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32000,
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 4096, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"smollm2-135m", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
  "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
  "num_key_value_heads": 3, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000.0,
  "rope_scaling": null, "attention_bias": false, "tie_word_embeddings": true, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::optional<std::string_view> builtin_model_config(std::string_view name) {
  for (const auto& c : kConfigs)
    if (iequals(name, c.name)) return std::string_view(c.json);
  return std::nullopt;
}

std::vector<std::string> builtin_model_config_names() {
  std::vector<std::string> names;
  for (const auto& c : kConfigs) names.emplace_back(c.name);
  return names;
}

}  // namespace osprey
