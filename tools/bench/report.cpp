#include "bench/report.h"

#include <cmath>

namespace osprey::bench {

namespace {

void put_dist(nlohmann::ordered_json& j, const char* name, const Distribution& d) {
  const std::string n(name);
  j["mean_" + n + "_ms"] = d.mean * 1e3;
  j["median_" + n + "_ms"] = d.p50 * 1e3;
  j["std_" + n + "_ms"] = d.stddev * 1e3;
  j["p90_" + n + "_ms"] = d.p90 * 1e3;
  j["p95_" + n + "_ms"] = d.p95 * 1e3;
  j["p99_" + n + "_ms"] = d.p99 * 1e3;
  j["max_" + n + "_ms"] = d.max * 1e3;
}

std::string fmt(double v) {
  char b[64];
  if (std::isinf(v)) return "inf";
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

}  // namespace

nlohmann::ordered_json metrics_to_json(const RunMetrics& m) {
  nlohmann::ordered_json j;
  j["num_requests"] = m.num_requests;
  j["completed"] = m.num_ok;
  j["failed"] = m.num_failed;
  j["errors"] = m.errors;
  j["duration"] = m.duration_s;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["output_len_mismatch"] = m.num_output_mismatch;
  j["usage_reported"] = m.num_usage_reported;
  j["request_throughput"] = m.request_throughput;
  j["input_throughput"] = m.input_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_throughput;
  if (m.sustained_window_s > 0) {
    j["sustained_output_throughput"] = m.sustained_output_throughput;
    j["sustained_window"] = m.sustained_window_s;
  }
  if (m.has_slo) {
    j["request_goodput"] = m.goodput;
    j["good_requests"] = m.num_good;
    j["good_fraction"] = m.good_fraction;
  }
  put_dist(j, "ttft", m.ttft_s);
  put_dist(j, "tpot", m.tpot_s);
  put_dist(j, "itl", m.itl_s);
  put_dist(j, "e2el", m.e2e_s);
  return j;
}

void print_summary(std::FILE* out, const std::string& title, const RunMetrics& m) {
  std::fprintf(out, "============ %s ============\n", title.c_str());
  std::fprintf(out, "%-40s %10lld\n", "Successful requests:", static_cast<long long>(m.num_ok));
  std::fprintf(out, "%-40s %10lld\n", "Failed requests:", static_cast<long long>(m.num_failed));
  for (const auto& [k, v] : m.errors) std::fprintf(out, "  %-38s %10lld\n", (k + ":").c_str(), static_cast<long long>(v));
  std::fprintf(out, "%-40s %10.2f\n", "Benchmark duration (s):", m.duration_s);
  std::fprintf(out, "%-40s %10lld\n", "Total input tokens:", static_cast<long long>(m.total_input_tokens));
  std::fprintf(out, "%-40s %10lld\n", "Total generated tokens:", static_cast<long long>(m.total_output_tokens));
  if (m.num_output_mismatch > 0)
    std::fprintf(out, "%-40s %10lld\n", "Outputs not of the asked length:", static_cast<long long>(m.num_output_mismatch));
  std::fprintf(out, "%-40s %10.2f\n", "Request throughput (req/s):", m.request_throughput);
  if (m.has_slo) {
    std::fprintf(out, "%-40s %10.2f\n", "Request goodput (req/s):", m.goodput);
    std::fprintf(out, "%-40s %9.1f%%\n", "Requests meeting the SLOs:", 100 * m.good_fraction);
  }
  std::fprintf(out, "%-40s %10.2f\n", "Input token throughput (tok/s):", m.input_throughput);
  std::fprintf(out, "%-40s %10.2f\n", "Output token throughput (tok/s):", m.output_throughput);
  std::fprintf(out, "%-40s %10.2f\n", "Total token throughput (tok/s):", m.total_throughput);
  if (m.sustained_window_s > 0)
    std::fprintf(out, "%-40s %10.2f  (%.2f s with every stream busy)\n", "Output tok/s, all streams busy:",
                 m.sustained_output_throughput, m.sustained_window_s);
  std::fprintf(out, "%-14s %9s %9s %9s %9s %9s %9s\n", "(ms)", "mean", "p50", "p90", "p95", "p99", "max");
  auto row = [&](const char* name, const Distribution& d) {
    std::fprintf(out, "%-14s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", name, d.mean * 1e3, d.p50 * 1e3, d.p90 * 1e3,
                 d.p95 * 1e3, d.p99 * 1e3, d.max * 1e3);
  };
  row("TTFT", m.ttft_s);
  row("TPOT", m.tpot_s);
  row("ITL", m.itl_s);
  row("E2E latency", m.e2e_s);
  std::fprintf(out, "==================================================\n");
}

void print_sweep_table(std::FILE* out, const std::vector<std::string>& labels, const std::vector<RunMetrics>& runs) {
  std::fprintf(out, "%-22s %6s %6s %9s %10s %10s %10s %10s %10s %9s\n", "run", "ok", "failed", "req/s", "out tok/s",
               "p50 TTFT", "p99 TTFT", "p50 TPOT", "p99 ITL", "goodput");
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& m = runs[i];
    std::fprintf(out, "%-22s %6lld %6lld %9.2f %10.1f %10.1f %10.1f %10.2f %10.2f %9s\n", labels[i].c_str(),
                 static_cast<long long>(m.num_ok), static_cast<long long>(m.num_failed), m.request_throughput,
                 m.output_throughput, m.ttft_s.p50 * 1e3, m.ttft_s.p99 * 1e3, m.tpot_s.p50 * 1e3, m.itl_s.p99 * 1e3,
                 m.has_slo ? fmt(m.goodput).c_str() : "-");
  }
  std::fprintf(out, "(latencies in ms)\n");
}

std::string metrics_csv(const std::vector<std::string>& keys, const std::vector<std::vector<std::string>>& key_values,
                        const std::vector<RunMetrics>& runs) {
  std::string s;
  for (const auto& k : keys) s += k + ",";
  s += "num_requests,completed,failed,duration_s,request_throughput,input_throughput,output_throughput,"
       "total_token_throughput,request_goodput,good_fraction";
  for (const char* m : {"ttft", "tpot", "itl", "e2el"})
    for (const char* q : {"mean", "p50", "p90", "p95", "p99", "max"}) s += std::string(",") + q + "_" + m + "_ms";
  s += ",sustained_output_throughput\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& m = runs[i];
    for (size_t k = 0; k < keys.size(); ++k) s += (i < key_values.size() && k < key_values[i].size() ? key_values[i][k] : "") + ",";
    s += std::to_string(m.num_requests) + "," + std::to_string(m.num_ok) + "," + std::to_string(m.num_failed) + "," +
         fmt(m.duration_s) + "," + fmt(m.request_throughput) + "," + fmt(m.input_throughput) + "," +
         fmt(m.output_throughput) + "," + fmt(m.total_throughput) + "," + (m.has_slo ? fmt(m.goodput) : "") + "," +
         (m.has_slo ? fmt(m.good_fraction) : "");
    for (const Distribution* d : {&m.ttft_s, &m.tpot_s, &m.itl_s, &m.e2e_s})
      for (double v : {d->mean, d->p50, d->p90, d->p95, d->p99, d->max}) s += "," + fmt(v * 1e3);
    s += "," + (m.sustained_window_s > 0 ? fmt(m.sustained_output_throughput) : std::string()) + "\n";
  }
  return s;
}

}  // namespace osprey::bench
