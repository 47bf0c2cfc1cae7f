// Llama 2/3/3.1/3.2, SmolLM2, TinyLlama (model_type "llama") and Mistral:
// the base decoder. Llama 3.1 rope scaling and attention_bias come from the
// config; Mistral adds the sliding window.
#include "model/arch_registry.h"

namespace osprey {

const ArchSpec& llama_arch_spec() {
  static const ArchSpec kSpec{.name = "llama"};
  return kSpec;
}

const ArchSpec& mistral_arch_spec() {
  static const ArchSpec kSpec{.name = "mistral", .sliding_window = true};
  return kSpec;
}

}  // namespace osprey
