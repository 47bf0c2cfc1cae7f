// `osprey bench offline`: in-process engine benchmarks on synthetic prompts.
//   throughput: N concurrent requests against the same requests one at a
//               time (fixed input/output lengths): tokens/s, TTFT, TPOT.
//   prefix:     time to first token of a request whose long shared system
//               prompt is warm in the prefix cache against a cold one.
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
  std::string json_path;         // also write the results as JSON here
};

// Runs the benchmark, prints a report to stdout; returns a process exit code.
int run_bench_offline(const BenchOfflineOptions& options);

}  // namespace osprey
