// Architecture registry: what each supported architecture adds to the shared
// Llama-style decoder. Adding an architecture is one file in src/model/ that
// defines its ArchSpec, plus one line in arch_registry.cpp.
#pragma once

#include <string_view>
#include <vector>

namespace osprey {

struct ArchSpec {
  std::string_view name;          // ModelConfig::architecture
  bool qkv_bias = false;          // q/k/v projections carry biases (always, not per config)
  bool qk_norm = false;           // per-head RMSNorm of q and k before rope
  bool sliding_window = false;    // honours ModelConfig::sliding_window
};

// Null when the architecture is not supported.
const ArchSpec* find_arch(std::string_view name);
std::vector<std::string_view> supported_archs();

// Per-architecture specs (one per file).
const ArchSpec& llama_arch_spec();
const ArchSpec& mistral_arch_spec();
const ArchSpec& qwen2_arch_spec();
const ArchSpec& qwen3_arch_spec();

}  // namespace osprey
