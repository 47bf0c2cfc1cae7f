// Model configurations bundled in the binary (Hugging Face config.json text),
// so that `osprey plan` and `--load-format dummy` work on real shapes without
// any file: Llama-3-8B, Llama-3.1-8B, Llama-3-70B, Llama-3.2-1B, Qwen2.5-7B,
// Mistral-7B and SmolLM2-135M.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace osprey {

// The config.json text of a bundled model by name, compared case-insensitively
// ("llama-3-8b", "Llama-3-8B" ...); nullopt when unknown.
std::optional<std::string_view> builtin_model_config(std::string_view name);
// Every bundled name, in a fixed order.
std::vector<std::string> builtin_model_config_names();

}  // namespace osprey
