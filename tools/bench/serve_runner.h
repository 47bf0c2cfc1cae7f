// `osprey bench serve`: drives an OpenAI-compatible server with a workload
// under an arrival schedule, for each point of a sweep over request rates
// and/or concurrencies, and reports the metrics (bench/metrics.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/arrival.h"
#include "bench/metrics.h"
#include "bench/stream_client.h"
#include "bench/workload.h"

namespace osprey {
class TextProcessor;
}

namespace osprey::bench {

struct ServeOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string model;                         // the "model" field sent
  std::string api_key;
  WorkloadOptions workload;
  std::vector<double> request_rates{0};      // 0 or inf: all at once
  std::vector<int> max_concurrencies{0};     // 0: unlimited
  ArrivalOptions arrival;                    // rate and seed are set per run
  int num_warmups = 0;
  double timeout_s = 600;
  bool ignore_eos = true;
  double temperature = 0.0;
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body
  std::string slo;                          // "ttft=200ms,tpot=50ms"
  std::string output_json, output_csv, plot_dir;
  bool progress = false;                    // live progress line on stderr
  bool save_detailed = false;               // per-request arrays in the JSON
  int num_io_threads = 1;
};

struct RunResult {
  double request_rate = 0;  // inf: all at once
  int max_concurrency = 0;
  std::vector<RequestRecord> records;
  RunMetrics metrics;
};

// Runs every point of the sweep; text: the tokenizer (null: token-id prompts).
// Returns a process exit code; writes the outputs the options name.
int run_bench_serve(const ServeOptions& options, std::shared_ptr<const TextProcessor> text);

// One run (exposed for tests): conversations under the schedule through client.
std::vector<RequestRecord> run_conversations(StreamClient& client, const ServeOptions& options,
                                             const std::vector<Conversation>& conversations,
                                             const std::vector<double>& arrivals, int max_concurrency,
                                             const std::string& progress_label);

// The JSON body of turn `turn` of a conversation, given the answers of the earlier turns.
nlohmann::json request_body(const ServeOptions& options, const Conversation& c, size_t turn,
                            const std::vector<std::string>& answers);

}  // namespace osprey::bench
