// Benchmark metrics: pure functions from per-request timelines to the summary
// that `osprey bench serve` and `osprey bench offline` both report.
//
// Definitions (docs/bench.md states them with examples):
//   TTFT  = first_token_s - send_s                      (per ok request)
//   E2E   = end_s - send_s                              (per ok request)
//   TPOT  = (E2E - TTFT) / (output_tokens - 1)          (ok requests with > 1 output token)
//   ITL   = every gap between consecutive token chunks   (pooled over ok requests)
//   duration = max(end_s) - min(send_s) over all measured requests (ok or not)
//   request throughput = num_ok / duration; tokens/s = token sums of ok requests / duration
//   goodput = ok requests meeting every SLO / duration; good_fraction = those / all measured
// Percentiles interpolate linearly between closest ranks, like numpy's default:
//   rank = p / 100 * (n - 1); value = x[floor(rank)] + (x[ceil(rank)] - x[floor(rank)]) * frac(rank)
// over the sorted samples. All times are seconds on one monotonic clock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "osprey/status.h"

namespace osprey::bench {

// How a request failed; kNone is success.
enum class ErrorKind { kNone, kHttpStatus, kConnect, kTimeout, kDisconnect, kMalformed, kOther };
const char* error_kind_name(ErrorKind kind);  // "ok", "http", "connect", "timeout", "disconnect", "malformed", "other"

// One request's timeline. Times in seconds from the run's start (any common origin).
struct RequestRecord {
  double send_s = 0;                // request written (offline: submitted)
  double first_token_s = -1;        // first token chunk received; < 0: none
  double end_s = 0;                 // response complete, or the failure noticed
  std::vector<double> chunk_s;      // arrival of every token-bearing chunk, in order (first == first_token_s)
  int prompt_tokens = 0;            // usage.prompt_tokens, else what the workload built
  int output_tokens = 0;            // usage.completion_tokens, else the number of token chunks
  int expected_output_tokens = 0;   // max_tokens asked
  bool usage_reported = false;      // token counts came from the server
  ErrorKind error = ErrorKind::kNone;
  int http_status = 0;              // the response status when one was read
  std::string error_message;        // short, for the report
  bool ok() const { return error == ErrorKind::kNone; }
};

// Linear-interpolation percentile of unsorted samples, p in [0, 100]; 0 when empty.
double percentile(std::span<const double> samples, double p);
// Percentile of samples already sorted ascending.
double percentile_sorted(std::span<const double> sorted, double p);

// mean, the percentiles of kPercentiles, max; milliseconds in reports.
struct Distribution {
  int64_t count = 0;
  double mean = 0, stddev = 0, min = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0, max = 0;
};
Distribution summarize(std::vector<double> samples);  // samples in any unit; result in the same unit

// Service-level objectives, in seconds; unset: not checked.
struct Slo {
  std::optional<double> ttft_s, tpot_s, e2e_s;
  bool empty() const { return !ttft_s && !tpot_s && !e2e_s; }
};
// "ttft=200ms,tpot=50ms,e2e=2s" (units ms, s, us; a bare number is ms; "e2el" is accepted for e2e).
Expected<Slo> parse_slo(const std::string& text);
// Whether an ok request meets every SLO that is set (a TPOT SLO is met by a request with <= 1 output token).
bool meets_slo(const RequestRecord& r, const Slo& slo);

struct RunMetrics {
  int64_t num_requests = 0;      // measured (warm-ups excluded)
  int64_t num_ok = 0;
  int64_t num_failed = 0;
  std::map<std::string, int64_t> errors;  // error kind ("http_503" for statuses) -> count
  double duration_s = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;  // ok requests
  int64_t num_output_mismatch = 0;  // ok requests whose output_tokens != expected_output_tokens (expected > 0)
  int64_t num_usage_reported = 0;
  double request_throughput = 0;    // ok requests / s
  double input_throughput = 0, output_throughput = 0, total_throughput = 0;  // tokens / s
  Distribution ttft_s, tpot_s, itl_s, e2e_s;  // seconds
  bool has_slo = false;
  int64_t num_good = 0;
  double goodput = 0;               // good requests / s
  double good_fraction = 0;         // good / num_requests
  // Closed-loop runs (compute_metrics' streams > 0): output tokens / s while
  // every stream was busy, from the (streams + 1)-th send (the first one
  // sent because a request had finished) to the last send; the run's start
  // (all prompts at once, no output yet) and its drain (fewer and fewer
  // streams) are left out. Token chunks arriving in the window count, each
  // weighted by its request's output_tokens / chunks. 0 (window 0) when the
  // run has no such window.
  double sustained_window_s = 0;
  double sustained_output_throughput = 0;
};

// `streams`: the client's fixed number of requests in flight (closed loop,
// no arrival rate), or 0.
RunMetrics compute_metrics(std::span<const RequestRecord> records, const Slo& slo, int streams = 0);

// Per-request derived values, also used by the CDF charts (seconds; ok requests only).
std::vector<double> ttft_samples(std::span<const RequestRecord> records);
std::vector<double> itl_samples(std::span<const RequestRecord> records);
std::vector<double> tpot_samples(std::span<const RequestRecord> records);
std::vector<double> e2e_samples(std::span<const RequestRecord> records);

}  // namespace osprey::bench
