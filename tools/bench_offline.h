// `osprey bench offline`: in-process engine benchmarks on synthetic prompts.
//   throughput: N concurrent requests against the same requests one at a
//               time (fixed input/output lengths): tokens/s, TTFT, TPOT.
//   prefix:     time to first token of a request whose long shared system
//               prompt is warm in the prefix cache against a cold one.
// Each throughput row also reports TTFT / TPOT / ITL / E2E percentiles with
// the metrics code of `osprey bench serve` (tools/bench/metrics.h): every
// output of the engine's stream is timestamped as it arrives.
#pragma once

#include <cstdint>
#include <string>

#include "engine_options.h"
#include "osprey/engine.h"

namespace osprey {

struct BenchOfflineOptions {
  // The shared engine flags (tools/engine_options.h). max_num_seqs 0: num_requests;
  // no_prefix_caching: the prefix mode's (the throughput mode always runs without).
  cli::EngineOptions engine;
  std::string mode = "all";      // "throughput" | "prefix" | "all"
  int num_requests = 32;         // concurrent requests
  int num_sequential = 4;        // requests measured one at a time (the baseline)
  int input_len = 128;           // prompt tokens
  int output_len = 64;           // generated tokens (EOS ignored)
  int shared_prefix_len = 1024;  // prefix mode: system-prompt tokens
  int suffix_len = 32;           // prefix mode: per-request tokens after the prefix
  int prefix_trials = 3;
  std::string json_path;         // also write the results as JSON here
  // Prompts: token ids from a seeded RNG (works without a tokenizer), or, by
  // default when the model has a tokenizer, text of exactly input_len tokens.
  bool random_prompts = false;
  uint64_t seed = 1234;
  std::string slo;               // goodput SLOs, as `bench serve --slo`
  // Throughput mode: per-op profile of the one-at-a-time and the concurrent
  // runs (EngineConfig::profile: eager, every op timed; slower runs).
  bool profile = false;
};

// The engine configuration of the runs: o.engine with the model resolved
// and max_num_seqs defaulting to num_requests.
Expected<EngineConfig> bench_offline_engine_config(const BenchOfflineOptions& o);

// Runs the benchmark with `config` (bench_offline_engine_config; each mode
// sets enable_prefix_caching itself), prints a report to stdout; returns a
// process exit code.
int run_bench_offline(const BenchOfflineOptions& options, const EngineConfig& config);

}  // namespace osprey
