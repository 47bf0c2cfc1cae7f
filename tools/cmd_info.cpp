// osprey info --model PATH: architecture, parameters, dtypes, memory.
#include <cstdio>

#include "commands.h"
#include "osprey/model_info.h"

namespace osprey::cli {

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print a model's architecture, parameter count, dtypes and memory needs");
  auto model = std::make_shared<std::string>("default");
  auto context = std::make_shared<int>(0);
  cmd->add_option("--model", *model, "Model folder, .gguf file, or 'default'");
  cmd->add_option("--context", *context, "Tokens of KV cache to size (default: the model's context length)");
  cmd->callback([model, context] {
    auto info = inspect_model(*model);
    if (!info.ok()) {
      std::fprintf(stderr, "osprey: %s\n", info.status().to_string().c_str());
      exit_code() = 1;
      return;
    }
    const ModelInspection& m = *info;
    const int ctx = *context > 0 ? *context : m.max_position_embeddings;
    const double mib = 1024.0 * 1024.0;
    std::printf("path:            %s\n", m.path.c_str());
    std::printf("format:          %s\n", m.format.c_str());
    std::printf("architecture:    %s\n", m.architecture.c_str());
    std::printf("parameters:      %lld (%.1f M)\n", static_cast<long long>(m.num_parameters), m.num_parameters / 1e6);
    std::printf("layers:          %d\n", m.num_layers);
    std::printf("hidden / ffn:    %d / %d\n", m.hidden_size, m.intermediate_size);
    std::printf("heads / kv / dim: %d / %d / %d\n", m.num_heads, m.num_kv_heads, m.head_dim);
    std::printf("vocab:           %d%s\n", m.vocab_size, m.tie_word_embeddings ? " (tied embeddings)" : "");
    std::printf("context:         %d (rope theta %g)\n", m.max_position_embeddings, m.rope_theta);
    std::printf("dtypes:         ");
    for (const auto& [name, count] : m.dtype_counts) std::printf(" %s x%d", name.c_str(), count);
    std::printf("\n");
    std::printf("weights:         %.1f MiB\n", m.weight_bytes / mib);
    std::printf("KV cache:        %.1f KiB per token (F32), %.1f MiB for %d tokens\n", m.kv_bytes_per_token / 1024.0,
                static_cast<double>(m.kv_bytes_per_token) * ctx / mib, ctx);
    std::printf("memory needed:   %.1f MiB (weights + KV for %d tokens)\n",
                (static_cast<double>(m.weight_bytes) + static_cast<double>(m.kv_bytes_per_token) * ctx) / mib, ctx);
  });
}

}  // namespace osprey::cli
