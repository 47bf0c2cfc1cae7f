// osprey bench offline: in-process engine throughput (tools/bench_offline.h).
#include "bench_offline.h"
#include "commands.h"
#include "osprey/model_info.h"

namespace osprey::cli {

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
  cmd->callback([o, kv_mb] {
    auto path = resolve_model_path(o->model_path);
    if (!path.ok()) {
      std::fprintf(stderr, "osprey: %s\n", path.status().to_string().c_str());
      exit_code() = 1;
      return;
    }
    BenchOfflineOptions opts = *o;
    opts.model_path = *path;
    opts.kv_cache_bytes = *kv_mb * 1024 * 1024;
    exit_code() = run_bench_offline(opts);
  });
}

}  // namespace osprey::cli
