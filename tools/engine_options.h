// The engine flags shared by `osprey generate`, `osprey serve` and
// `osprey bench offline`: declared once (same names, defaults, checks and
// help on every command) and mapped onto EngineConfig (include/osprey/engine.h)
// in one place. Flags that mean different things per command (--seed: the
// request's seed, the server's base seed, the bench's prompt seed) stay with
// their commands.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "osprey/engine.h"
#include "osprey/status.h"

namespace osprey::cli {

struct EngineOptions {
  std::string model = "default";  // --model: folder, .gguf, "default"; a config with --load-format dummy
  std::string tokenizer;          // "" : the model's own
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  std::string load_format = "auto";
  int threads = 0;       // <= 0: all cores
  int max_num_seqs = 0;  // 0: the command's default (EngineConfig's 256; bench offline: --num-prompts)
  int max_num_batched_tokens = 2048;
  int max_model_len = 0;  // 0: the model's own
  int block_size = 16;
  int kv_cache_mb = 1024;
  bool kv_cache_mb_set = false;  // --kv-cache-mb given: overrides --gpu-memory-utilization sizing
  double gpu_memory_utilization = 0.90;
  int swap_space_mb = 0;
  bool enforce_eager = false;
  bool no_async_scheduling = false;
  bool no_prefix_caching = false;
  bool no_chunked_prefill = false;
  bool quantize_activations = false;
};

// Registers the shared flags on `cmd`, writing into *o (which must outlive
// parsing).
void add_engine_options(CLI::App* cmd, EngineOptions* o);

// The EngineConfig the options describe, model_path = o.model as given.
EngineConfig to_engine_config(const EngineOptions& o);

// to_engine_config with the model resolved ("default": the cached default
// model; left as given with --load-format dummy, where it names a config).
Expected<EngineConfig> resolve_engine_config(const EngineOptions& o);

// Test seam of the commands that create an engine: when set, the command's
// callback hands it the EngineConfig it would create the engine with and
// returns without loading anything (tests/unit/tools).
using EngineConfigSink = std::function<void(const EngineConfig&)>;

}  // namespace osprey::cli
