// ServerMetrics: Prometheus text exposition of the server's and the
// engine's state, named osprey:* after vLLM's vllm:* metrics so that existing
// dashboards adapt by a prefix. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "osprey/engine.h"

namespace osprey::server {

// A cumulative histogram with fixed upper bounds (+Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends the _bucket, _sum and _count lines of `name` with `labels`
  // ("k=\"v\"" list, may be empty).
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// Gauges the server itself knows (not the engine).
struct ServerGauges {
  int64_t open_connections = 0;
  int64_t queued_requests = 0;    // admitted, no output yet
  int64_t inflight_requests = 0;  // admitted generation requests not finished
  bool ready = false;
};

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_name);

  void count_http(int status);
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  // Queue time of one engine request. The engine does not report when it
  // first scheduled a request, so callers pass arrival -> first output of
  // that engine request: an upper bound that includes its prefill step(s).
  void observe_queue_time(double seconds);
  // One engine request's prompt (counted once, whatever its n).
  void observe_prompt(int prompt_tokens);
  // A finished sequence (one choice): its finish reason, generated tokens and
  // timings (ttft_seconds < 0: it produced no token).
  void observe_finished(FinishReason reason, int completion_tokens, double e2e_seconds, double ttft_seconds);

  std::string render(const EngineStats& engine, const ServerGauges& gauges) const;

  // For tests.
  int64_t http_count(int status) const;
  uint64_t queue_time_count() const;

 private:
  mutable std::mutex mu_;
  std::string labels_;  // model_name="..."
  std::map<int, int64_t> http_by_code_;
  std::map<std::string, int64_t> finished_by_reason_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, tpot_, e2e_, queue_, prompt_len_, output_len_;
};

// Escapes a Prometheus label value (\\, \", \n).
std::string prometheus_escape(const std::string& v);

}  // namespace osprey::server
