// Reports of benchmark runs: the summary table, JSON (vLLM benchmark_serving
// key names where they exist, milliseconds) and CSV (one row per run).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/metrics.h"

namespace osprey::bench {

// The run's metrics as JSON: completed, failed, duration, request_throughput,
// output_throughput, mean_ttft_ms, p99_itl_ms, request_goodput, errors, ...
nlohmann::ordered_json metrics_to_json(const RunMetrics& m);

// A vertical block of the run's metrics, as vLLM prints them.
void print_summary(std::FILE* out, const std::string& title, const RunMetrics& m);

// One line per run (label, then key figures) for a sweep.
void print_sweep_table(std::FILE* out, const std::vector<std::string>& labels, const std::vector<RunMetrics>& runs);

// CSV: a header line, then one row per run; `keys` name leading columns whose
// values are given per run in `key_values` (e.g. request_rate, max_concurrency).
std::string metrics_csv(const std::vector<std::string>& keys, const std::vector<std::vector<std::string>>& key_values,
                        const std::vector<RunMetrics>& runs);

}  // namespace osprey::bench
