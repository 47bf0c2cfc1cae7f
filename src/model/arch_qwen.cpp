// Qwen2/2.5 (biases on q/k/v) and Qwen3 (per-head q/k RMSNorm, no biases).
#include "model/arch_registry.h"

namespace osprey {

const ArchSpec& qwen2_arch_spec() {
  static const ArchSpec kSpec{.name = "qwen2", .qkv_bias = true, .sliding_window = false};
  return kSpec;
}

const ArchSpec& qwen3_arch_spec() {
  static const ArchSpec kSpec{.name = "qwen3", .qk_norm = true};
  return kSpec;
}

}  // namespace osprey
