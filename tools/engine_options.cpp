#include "engine_options.h"

#include "osprey/model_info.h"

namespace osprey::cli {

void add_engine_options(CLI::App* cmd, EngineOptions* o) {
  cmd->add_option("--model", o->model,
                  "Model folder, .gguf file, or 'default'; with --load-format dummy a bundled config name "
                  "(e.g. llama-3-8b), a config.json or a folder with one");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Tokenizer to use instead of the model's (a folder, tokenizer.json, .gguf or 'default')");
  cmd->add_option("--device", o->device, "cpu, or cuda / cuda:N (builds with the CUDA backend)");
  cmd->add_option("--dtype", o->dtype,
                  "Compute dtype: auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16 (CUDA)");
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "KV page dtype: auto (the compute dtype), float32, bfloat16, float16, fp8 (E4M3, one byte a "
                  "value: twice the pages of bf16; scales from the checkpoint's k_scale / v_scale, else 1), or int8 "
                  "(one byte a value and one fp32 scale a token and KV head, set as it is written; CPU backend)");
  cmd->add_flag("--calculate-kv-scales", o->calculate_kv_scales,
                "With --kv-cache-dtype fp8: calibrate each layer's K and V scale at start-up on a built-in text "
                "(instead of the checkpoint's scales or 1)");
  cmd->add_option("--quantization", o->quantization,
                  "Weight quantisation at load: none, or fp8 (CUDA 8.9+: the layers' projections in FP8 E4M3 with "
                  "FP8 GEMMs; not bit-exact)");
  cmd->add_option("--load-format", o->load_format,
                  "auto, or dummy: random weights of the right shapes from a config (see --model)");
  cmd->add_option("--threads", o->threads, "Compute threads (default: all cores)");
  cmd->add_option("--max-num-seqs", o->max_num_seqs,
                  "Running sequences at most (0: default, 256; bench offline: --num-prompts)")
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Token budget of one engine step")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--max-model-len", o->max_model_len, "Context length (0: the model's own)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--block-size", o->block_size, "Tokens per KV page")->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-cache-mb", o->kv_cache_mb,
                  "KV cache size in MiB (default 1024 on CPU; CUDA default: what --gpu-memory-utilization leaves)")
      ->check(CLI::Range(1, 1 << 24))
      ->each([o](const std::string&) { o->kv_cache_mb_set = true; });
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "CUDA: fraction of the device memory for weights, step buffers and the KV cache")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--swap-space-mb", o->swap_space_mb,
                  "Host memory in MiB for swapping preempted requests' KV pages (0: recompute instead)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_flag("--enforce-eager", o->enforce_eager, "CUDA: run decode steps eagerly (no CUDA graphs)");
  cmd->add_flag("--no-async-scheduling", o->no_async_scheduling,
                "Wait for each step before scheduling the next (no overlap of host work with the device)");
  cmd->add_flag("--no-prefix-caching", o->no_prefix_caching,
                "Disable prefix caching (bench offline: its prefix mode; throughput mode always runs without)");
  cmd->add_flag("--no-chunked-prefill", o->no_chunked_prefill,
                "Schedule each prompt whole in one step (prompts longer than --max-num-batched-tokens are "
                "rejected)");
  cmd->add_flag("--quantize-activations", o->quantize_activations,
                "CPU: 8-bit activations in matmuls with Q8_0/Q4_0/Q4_1 weights (faster, not bit-exact)");
  // --help shows the defaults of the valued options.
  for (const char* name : {"--model", "--device", "--dtype", "--kv-cache-dtype", "--quantization", "--load-format", "--max-num-seqs",
                           "--max-num-batched-tokens", "--max-model-len", "--block-size", "--kv-cache-mb",
                           "--gpu-memory-utilization", "--swap-space-mb"})
    cmd->get_option(name)->capture_default_str();
}

EngineConfig to_engine_config(const EngineOptions& o) {
  EngineConfig c;
  c.model_path = o.model;
  c.tokenizer = o.tokenizer;
  c.device = o.device;
  c.dtype = o.dtype;
  c.kv_cache_dtype = o.kv_cache_dtype;
  c.calculate_kv_scales = o.calculate_kv_scales;
  c.quantization = o.quantization;
  c.load_format = o.load_format;
  c.num_threads = o.threads;
  if (o.max_num_seqs > 0) c.max_num_seqs = o.max_num_seqs;
  c.max_num_batched_tokens = o.max_num_batched_tokens;
  c.max_model_len = o.max_model_len;
  c.block_size = o.block_size;
  c.kv_cache_bytes = int64_t{o.kv_cache_mb} << 20;
  c.kv_cache_bytes_explicit = o.kv_cache_mb_set;
  c.gpu_memory_utilization = o.gpu_memory_utilization;
  c.swap_space_bytes = int64_t{o.swap_space_mb} << 20;
  c.enforce_eager = o.enforce_eager;
  c.async_scheduling = !o.no_async_scheduling;
  c.enable_prefix_caching = !o.no_prefix_caching;
  c.enable_chunked_prefill = !o.no_chunked_prefill;
  c.quantize_activations = o.quantize_activations;
  return c;
}

Expected<EngineConfig> resolve_engine_config(const EngineOptions& o) {
  EngineConfig c = to_engine_config(o);
  if (o.load_format != "dummy") {
    auto path = resolve_model_path(o.model);
    if (!path.ok()) return path.status();
    c.model_path = *path;
  }
  return c;
}

}  // namespace osprey::cli
