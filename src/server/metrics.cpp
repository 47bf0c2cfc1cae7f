#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace osprey::server {

namespace {

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char b[40];
  std::snprintf(b, sizeof(b), "%.9g", v);
  return b;
}

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0};
}
std::vector<double> length_buckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000};
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const char* name, const std::string& labels, double v) {
  out += name;
  if (!labels.empty()) out += "{" + labels + "}";
  out += ' ';
  out += num(v);
  out += '\n';
}

}  // namespace

std::string prometheus_escape(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\')
      o += "\\\\";
    else if (c == '"')
      o += "\\\"";
    else if (c == '\n')
      o += "\\n";
    else
      o += c;
  }
  return o;
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    const std::string le = i < bounds_.size() ? num(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + sep + "le=\"" + le + "\"} " + std::to_string(cum) + "\n";
  }
  const std::string l = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + l + " " + num(sum_) + "\n";
  out += name + "_count" + l + " " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics(std::string model_name)
    : labels_("model_name=\"" + prometheus_escape(model_name) + "\""),
      ttft_(latency_buckets()),
      itl_(latency_buckets()),
      tpot_(latency_buckets()),
      e2e_(e2e_buckets()),
      queue_(e2e_buckets()),
      prompt_len_(length_buckets()),
      output_len_(length_buckets()) {}

void ServerMetrics::count_http(int status) {
  std::lock_guard lock(mu_);
  ++http_by_code_[status];
}

void ServerMetrics::observe_ttft(double s) {
  std::lock_guard lock(mu_);
  ttft_.observe(s);
}

void ServerMetrics::observe_inter_token(double s) {
  std::lock_guard lock(mu_);
  itl_.observe(s);
}

void ServerMetrics::observe_queue_time(double s) {
  std::lock_guard lock(mu_);
  queue_.observe(s);
}

void ServerMetrics::observe_prompt(int prompt_tokens) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += prompt_tokens;
  prompt_len_.observe(prompt_tokens);
}

void ServerMetrics::observe_finished(FinishReason reason, int completion_tokens, double e2e, double ttft) {
  std::lock_guard lock(mu_);
  const char* name = finish_reason_name(reason);
  ++finished_by_reason_[*name ? name : "none"];
  generation_tokens_ += completion_tokens;
  e2e_.observe(e2e);
  output_len_.observe(completion_tokens);
  if (completion_tokens > 1 && ttft >= 0.0) tpot_.observe((e2e - ttft) / (completion_tokens - 1));
}

int64_t ServerMetrics::http_count(int status) const {
  std::lock_guard lock(mu_);
  auto it = http_by_code_.find(status);
  return it == http_by_code_.end() ? 0 : it->second;
}

uint64_t ServerMetrics::queue_time_count() const {
  std::lock_guard lock(mu_);
  return queue_.count();
}

std::string ServerMetrics::render(const EngineStats& e, const ServerGauges& g) const {
  std::lock_guard lock(mu_);
  std::string o;
  o.reserve(8192);
  const std::string& L = labels_;
  header(o, "osprey:num_requests_running", "gauge", "Sequences in the engine's running batch.");
  sample(o, "osprey:num_requests_running", L, e.num_running);
  header(o, "osprey:num_requests_waiting", "gauge", "Sequences waiting to be scheduled.");
  sample(o, "osprey:num_requests_waiting", L, e.num_waiting);
  header(o, "osprey:num_preemptions_total", "counter", "Preemptions of running sequences.");
  sample(o, "osprey:num_preemptions_total", L, static_cast<double>(e.num_preemptions));
  header(o, "osprey:num_swap_outs_total", "counter", "Preemptions that swapped KV pages to host memory.");
  sample(o, "osprey:num_swap_outs_total", L, static_cast<double>(e.num_swap_outs));
  header(o, "osprey:cpu_cache_usage_perc", "gauge", "Fraction of host swap pages in use (0 to 1; 0 without swap).");
  sample(o, "osprey:cpu_cache_usage_perc", L,
         e.num_swap_blocks > 0 ? static_cast<double>(e.num_swap_blocks - e.num_free_swap_blocks) / e.num_swap_blocks
                               : 0.0);
  header(o, "osprey:kv_cache_usage_perc", "gauge", "Fraction of KV cache pages in use (0 to 1).");
  sample(o, "osprey:kv_cache_usage_perc", L, e.kv_usage);
  header(o, "osprey:num_kv_blocks", "gauge", "KV cache pages in the pool.");
  sample(o, "osprey:num_kv_blocks", L, e.num_kv_blocks);
  header(o, "osprey:num_free_kv_blocks", "gauge", "KV cache pages not referenced by a sequence.");
  sample(o, "osprey:num_free_kv_blocks", L, e.num_free_kv_blocks);
  header(o, "osprey:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.");
  sample(o, "osprey:prefix_cache_queries_total", L, static_cast<double>(e.prefix_query_tokens));
  header(o, "osprey:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.");
  sample(o, "osprey:prefix_cache_hits_total", L, static_cast<double>(e.prefix_hit_tokens));
  header(o, "osprey:engine_steps_total", "counter", "Engine steps run.");
  sample(o, "osprey:engine_steps_total", L, static_cast<double>(e.num_steps));
  header(o, "osprey:engine_prompt_tokens_computed_total", "counter", "Prompt tokens computed (prefill work).");
  sample(o, "osprey:engine_prompt_tokens_computed_total", L, static_cast<double>(e.num_prompt_tokens));
  header(o, "osprey:prompt_tokens_total", "counter",
         "Prompt tokens of finished engine requests (once each, whatever n).");
  sample(o, "osprey:prompt_tokens_total", L, static_cast<double>(prompt_tokens_));
  header(o, "osprey:generation_tokens_total", "counter", "Generated tokens of finished sequences.");
  sample(o, "osprey:generation_tokens_total", L, static_cast<double>(generation_tokens_));
  header(o, "osprey:request_success_total", "counter", "Finished sequences by finish reason.");
  for (const auto& [reason, n] : finished_by_reason_)
    sample(o, "osprey:request_success_total", L + ",finished_reason=\"" + reason + "\"", static_cast<double>(n));
  header(o, "osprey:time_to_first_token_seconds", "histogram", "Time to first token (arrival to first output).");
  ttft_.render(o, "osprey:time_to_first_token_seconds", L);
  header(o, "osprey:inter_token_latency_seconds", "histogram", "Time between consecutive outputs of a sequence.");
  itl_.render(o, "osprey:inter_token_latency_seconds", L);
  header(o, "osprey:request_time_per_output_token_seconds", "histogram",
         "Mean time per output token after the first, per request.");
  tpot_.render(o, "osprey:request_time_per_output_token_seconds", L);
  header(o, "osprey:e2e_request_latency_seconds", "histogram", "End-to-end request latency.");
  e2e_.render(o, "osprey:e2e_request_latency_seconds", L);
  header(o, "osprey:request_queue_time_seconds", "histogram",
         "Arrival to first output of an engine request (upper bound of the queue time: includes its prefill).");
  queue_.render(o, "osprey:request_queue_time_seconds", L);
  header(o, "osprey:request_prompt_tokens", "histogram", "Prompt tokens per request.");
  prompt_len_.render(o, "osprey:request_prompt_tokens", L);
  header(o, "osprey:request_generation_tokens", "histogram", "Generated tokens per request.");
  output_len_.render(o, "osprey:request_generation_tokens", L);
  header(o, "osprey:http_requests_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, n] : http_by_code_)
    sample(o, "osprey:http_requests_total", "code=\"" + std::to_string(code) + "\"", static_cast<double>(n));
  header(o, "osprey:http_errors_total", "counter", "HTTP error responses (status >= 400) by status code.");
  for (const auto& [code, n] : http_by_code_)
    if (code >= 400)
      sample(o, "osprey:http_errors_total", "code=\"" + std::to_string(code) + "\"", static_cast<double>(n));
  header(o, "osprey:http_connections_open", "gauge", "Open HTTP connections.");
  sample(o, "osprey:http_connections_open", "", static_cast<double>(g.open_connections));
  header(o, "osprey:server_queued_requests", "gauge", "Admitted requests without any output yet.");
  sample(o, "osprey:server_queued_requests", L, static_cast<double>(g.queued_requests));
  header(o, "osprey:server_inflight_requests", "gauge", "Admitted generation requests not yet finished.");
  sample(o, "osprey:server_inflight_requests", L, static_cast<double>(g.inflight_requests));
  header(o, "osprey:ready", "gauge", "1 when the engine can generate.");
  sample(o, "osprey:ready", L, g.ready ? 1 : 0);
  return o;
}

}  // namespace osprey::server
