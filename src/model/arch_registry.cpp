#include "model/arch_registry.h"

namespace osprey {

namespace {
const ArchSpec* const* registry() {
  static const ArchSpec* const kArchs[] = {
      &llama_arch_spec(),
      &mistral_arch_spec(),
      &qwen2_arch_spec(),
      &qwen3_arch_spec(),
      nullptr,
  };
  return kArchs;
}
}  // namespace

const ArchSpec* find_arch(std::string_view name) {
  for (const ArchSpec* const* a = registry(); *a; ++a) {
    if ((*a)->name == name) return *a;
  }
  return nullptr;
}

std::vector<std::string_view> supported_archs() {
  std::vector<std::string_view> out;
  for (const ArchSpec* const* a = registry(); *a; ++a) out.push_back((*a)->name);
  return out;
}

}  // namespace osprey
