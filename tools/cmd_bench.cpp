// osprey bench offline: in-process engine throughput (tools/bench_offline.h);
// osprey bench serve / mock-server: tools/cmd_bench_serve.cpp.
#include "bench_offline.h"
#include "commands.h"
#include "osprey/model_info.h"

namespace osprey::cli {

void add_bench_serve_commands(CLI::App& bench);  // tools/cmd_bench_serve.cpp

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchOfflineOptions>();
  o->model_path = "default";
  auto kv_mb = std::make_shared<int64_t>(1024);
  auto* cmd = bench->add_subcommand("offline", "In-process engine benchmark (no HTTP)");
  cmd->add_option("--model", o->model_path, "Model folder, .gguf file, or 'default'");
  cmd->add_option("--mode", o->mode, "throughput | prefix | all")
      ->check(CLI::IsMember({"throughput", "prefix", "all"}));
  cmd->add_option("--threads", o->num_threads, "Compute threads (default: all cores)");
  cmd->add_option("--num-prompts", o->num_requests, "Concurrent requests")->check(CLI::Range(1, 100000));
  cmd->add_option("--num-sequential", o->num_sequential, "Requests measured one at a time")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--input-len", o->input_len, "Prompt tokens")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--output-len", o->output_len, "Generated tokens")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--shared-prefix-len", o->shared_prefix_len, "Prefix mode: shared system-prompt tokens");
  cmd->add_option("--suffix-len", o->suffix_len, "Prefix mode: tokens after the shared prefix");
  cmd->add_option("--prefix-trials", o->prefix_trials, "Prefix mode: trials");
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Token budget per step");
  cmd->add_option("--kv-cache-mb", *kv_mb, "KV cache size in MiB");
  cmd->add_option("--output-json", o->json_path, "Write the results as JSON to this file");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Compute dtype: auto, float32, bfloat16, float16")->capture_default_str();
  cmd->add_option("--load-format", o->load_format, "auto, or dummy (random weights from a config)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer path or 'default' (default: the model's own)");
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization, "CUDA: fraction of device memory")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Running sequences at most (default: --num-prompts)");
  cmd->add_flag("--enforce-eager", o->enforce_eager, "CUDA: no graph capture");
  cmd->add_flag("--no-async-scheduling", o->no_async_scheduling,
                "Wait for each step before scheduling the next (no overlap of host work with the device)");
  cmd->add_flag("--quantize-activations", o->quantize_activations,
                "CPU: 8-bit activations in matmuls with Q8_0/Q4_0/Q4_1 weights (faster, not bit-exact)");
  cmd->add_option("--block-size", o->block_size, "Tokens per KV page")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_flag("--no-prefix-caching", o->no_prefix_caching, "Prefix mode: run without the prefix cache");
  cmd->add_flag("--random-prompts", o->random_prompts,
                "Random token-id prompts (default: text prompts when the model has a tokenizer)");
  cmd->add_option("--seed", o->seed, "Seed of the prompts")->capture_default_str();
  cmd->add_option("--slo", o->slo, "Goodput SLOs, e.g. ttft=200ms,tpot=50ms");
  cmd->add_flag("--profile", o->profile,
                "Throughput mode: time every op (eager) and print time, GB/s and TFLOP/s per kernel group "
                "against the device's measured ceilings");
  auto* kv_opt = cmd->get_option("--kv-cache-mb");
  cmd->callback([o, kv_mb, kv_opt] {
    auto path = resolve_model_path(o->model_path);
    if (!path.ok()) {
      std::fprintf(stderr, "osprey: %s\n", path.status().to_string().c_str());
      exit_code() = 1;
      return;
    }
    BenchOfflineOptions opts = *o;
    opts.model_path = *path;
    opts.kv_cache_bytes = *kv_mb * 1024 * 1024;
    opts.kv_cache_bytes_explicit = kv_opt->count() > 0;
    exit_code() = run_bench_offline(opts);
  });
  add_bench_serve_commands(*bench);
}

}  // namespace osprey::cli
