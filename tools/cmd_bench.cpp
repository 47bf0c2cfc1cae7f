// osprey bench offline: in-process engine throughput (tools/bench_offline.h);
// osprey bench serve / mock-server: tools/cmd_bench_serve.cpp.
#include <cstdio>

#include "bench_offline.h"
#include "commands.h"

namespace osprey::cli {

void add_bench_serve_commands(CLI::App& bench);  // tools/cmd_bench_serve.cpp

void add_bench_command(CLI::App& app, EngineConfigSink dry_run) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchOfflineOptions>();
  auto* cmd = bench->add_subcommand("offline", "In-process engine benchmark (no HTTP)");
  add_engine_options(cmd, &o->engine);
  cmd->add_option("--mode", o->mode, "throughput | prefix | all")
      ->check(CLI::IsMember({"throughput", "prefix", "all"}));
  cmd->add_option("--num-prompts", o->num_requests, "Concurrent requests")->check(CLI::Range(1, 100000));
  cmd->add_option("--num-sequential", o->num_sequential, "Requests measured one at a time")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--input-len", o->input_len, "Prompt tokens")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--output-len", o->output_len, "Generated tokens")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--shared-prefix-len", o->shared_prefix_len, "Prefix mode: shared system-prompt tokens");
  cmd->add_option("--suffix-len", o->suffix_len, "Prefix mode: tokens after the shared prefix");
  cmd->add_option("--prefix-trials", o->prefix_trials, "Prefix mode: trials");
  cmd->add_option("--output-json", o->json_path, "Write the results as JSON to this file");
  cmd->add_flag("--random-prompts", o->random_prompts,
                "Random token-id prompts (default: text prompts when the model has a tokenizer)");
  cmd->add_option("--seed", o->seed, "Seed of the prompts")->capture_default_str();
  cmd->add_option("--slo", o->slo, "Goodput SLOs, e.g. ttft=200ms,tpot=50ms");
  cmd->add_flag("--profile", o->profile,
                "Throughput mode: time every op (eager) and print time, GB/s and TFLOP/s per kernel group "
                "against the device's measured ceilings");
  cmd->callback([o, dry_run] {
    auto cfg = bench_offline_engine_config(*o);
    if (!cfg.ok()) {
      std::fprintf(stderr, "osprey: %s\n", cfg.status().to_string().c_str());
      exit_code() = 1;
      return;
    }
    if (dry_run) {
      dry_run(*cfg);
      exit_code() = 0;
      return;
    }
    exit_code() = run_bench_offline(*o, *cfg);
  });
  add_bench_serve_commands(*bench);
}

}  // namespace osprey::cli
