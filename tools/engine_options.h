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

// The defaults are EngineConfig's own (one place), except where a flag means
// something else: --model "default", --max-num-seqs 0 (the command's default).
inline const EngineConfig kEngineConfigDefaults{};

struct EngineOptions {
  std::string model = "default";  // --model: folder, .gguf, "default"; a config with --load-format dummy
  std::string tokenizer = kEngineConfigDefaults.tokenizer;  // "" : the model's own
  std::string device = kEngineConfigDefaults.device;
  std::string dtype = kEngineConfigDefaults.dtype;
  std::string kv_cache_dtype = kEngineConfigDefaults.kv_cache_dtype;
  bool calculate_kv_scales = kEngineConfigDefaults.calculate_kv_scales;
  std::string quantization = kEngineConfigDefaults.quantization;
  std::string load_format = kEngineConfigDefaults.load_format;
  int threads = kEngineConfigDefaults.num_threads;  // <= 0: all cores
  int max_num_seqs = 0;  // 0: the command's default (EngineConfig's 256; bench offline: --num-prompts)
  int max_num_batched_tokens = kEngineConfigDefaults.max_num_batched_tokens;
  int max_model_len = kEngineConfigDefaults.max_model_len;  // 0: the model's own
  int block_size = kEngineConfigDefaults.block_size;
  int kv_cache_mb = static_cast<int>(kEngineConfigDefaults.kv_cache_bytes >> 20);
  bool kv_cache_mb_set = false;  // --kv-cache-mb given: overrides --gpu-memory-utilization sizing
  double gpu_memory_utilization = kEngineConfigDefaults.gpu_memory_utilization;
  int swap_space_mb = static_cast<int>(kEngineConfigDefaults.swap_space_bytes >> 20);
  bool enforce_eager = kEngineConfigDefaults.enforce_eager;
  bool no_async_scheduling = !kEngineConfigDefaults.async_scheduling;
  bool no_prefix_caching = !kEngineConfigDefaults.enable_prefix_caching;
  bool no_chunked_prefill = !kEngineConfigDefaults.enable_chunked_prefill;
  bool quantize_activations = kEngineConfigDefaults.quantize_activations;
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
