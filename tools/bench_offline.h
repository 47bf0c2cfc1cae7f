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

namespace osprey {

struct BenchOfflineOptions {
  std::string model_path;
  std::string mode = "all";      // "throughput" | "prefix" | "all"
  int num_threads = 0;           // backend threads; <= 0: all cores
  int num_requests = 32;         // concurrent requests
  int num_sequential = 4;        // requests measured one at a time (the baseline)
  int input_len = 128;           // prompt tokens
  int output_len = 64;           // generated tokens (EOS ignored)
  int shared_prefix_len = 1024;  // prefix mode: system-prompt tokens
  int suffix_len = 32;           // prefix mode: per-request tokens after the prefix
  int prefix_trials = 3;
  int max_num_batched_tokens = 2048;
  int64_t kv_cache_bytes = int64_t{1} << 30;
  bool kv_cache_bytes_explicit = false;
  std::string json_path;         // also write the results as JSON here
  // EngineConfig pass-through (include/osprey/engine.h).
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string load_format = "auto";
  std::string tokenizer;
  double gpu_memory_utilization = 0.90;
  int max_num_seqs = 0;          // <= 0: num_requests
  bool enforce_eager = false;
  bool no_async_scheduling = false;  // EngineConfig::async_scheduling off
  bool quantize_activations = false;  // CPU: 8-bit activations in quantised matmuls
  int block_size = 16;
  bool no_prefix_caching = false;  // prefix mode always turns it on; this turns it off there too
  // Prompts: token ids from a seeded RNG (works without a tokenizer), or, by
  // default when the model has a tokenizer, text of exactly input_len tokens.
  bool random_prompts = false;
  uint64_t seed = 1234;
  std::string slo;               // goodput SLOs, as `bench serve --slo`
  // Throughput mode: per-op profile of the one-at-a-time and the concurrent
  // runs (EngineConfig::profile: eager, every op timed; slower runs).
  bool profile = false;
};

// Runs the benchmark, prints a report to stdout; returns a process exit code.
int run_bench_offline(const BenchOfflineOptions& options);

}  // namespace osprey
