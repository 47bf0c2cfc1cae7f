#include "bench/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace osprey::bench {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kNone: return "ok";
    case ErrorKind::kHttpStatus: return "http";
    case ErrorKind::kConnect: return "connect";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kDisconnect: return "disconnect";
    case ErrorKind::kMalformed: return "malformed";
    case ErrorKind::kOther: return "other";
  }
  return "other";
}

double percentile_sorted(std::span<const double> sorted, double p) {
  if (sorted.empty()) return 0;
  p = std::clamp(p, 0.0, 100.0);
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

double percentile(std::span<const double> samples, double p) {
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  return percentile_sorted(v, p);
}

Distribution summarize(std::vector<double> v) {
  Distribution d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  d.count = static_cast<int64_t>(v.size());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - d.mean) * (x - d.mean);
  d.stddev = std::sqrt(sq / static_cast<double>(v.size()));  // population (numpy's default ddof=0)
  d.min = v.front();
  d.max = v.back();
  d.p50 = percentile_sorted(v, 50);
  d.p90 = percentile_sorted(v, 90);
  d.p95 = percentile_sorted(v, 95);
  d.p99 = percentile_sorted(v, 99);
  return d;
}

namespace {

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// "200ms" / "0.2s" / "150us" / "200" (ms) -> seconds.
Expected<double> parse_duration(const std::string& text) {
  std::string s = trim(text);
  double scale = 1e-3;
  auto ends_with = [&](const char* suf) {
    const std::string x(suf);
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (ends_with("ms")) {
    s.resize(s.size() - 2);
  } else if (ends_with("us")) {
    scale = 1e-6;
    s.resize(s.size() - 2);
  } else if (ends_with("s")) {
    scale = 1.0;
    s.resize(s.size() - 1);
  }
  if (s.empty()) return invalid_argument("empty duration in '" + text + "'");
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (...) {
    return invalid_argument("not a duration: '" + text + "'");
  }
  if (used != s.size() || !std::isfinite(v) || v < 0) return invalid_argument("not a duration: '" + text + "'");
  return v * scale;
}

}  // namespace

Expected<Slo> parse_slo(const std::string& text) {
  Slo slo;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = trim(text.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) {
      if (comma >= text.size()) break;
      continue;
    }
    size_t eq = item.find('=');
    if (eq == std::string::npos) eq = item.find(':');
    if (eq == std::string::npos) return invalid_argument("SLO item '" + item + "' is not name=value");
    std::string name = trim(item.substr(0, eq));
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    auto v = parse_duration(item.substr(eq + 1));
    if (!v.ok()) return v.status();
    if (name == "ttft") {
      slo.ttft_s = *v;
    } else if (name == "tpot") {
      slo.tpot_s = *v;
    } else if (name == "e2e" || name == "e2el") {
      slo.e2e_s = *v;
    } else {
      return invalid_argument("unknown SLO '" + name + "' (ttft, tpot, e2e)");
    }
    if (comma >= text.size()) break;
  }
  return slo;
}

namespace {
double ttft_of(const RequestRecord& r) { return r.first_token_s - r.send_s; }
double e2e_of(const RequestRecord& r) { return r.end_s - r.send_s; }
bool has_first_token(const RequestRecord& r) { return r.first_token_s >= 0; }
}  // namespace

bool meets_slo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_s && (!has_first_token(r) || ttft_of(r) > *slo.ttft_s)) return false;
  if (slo.e2e_s && e2e_of(r) > *slo.e2e_s) return false;
  if (slo.tpot_s && r.output_tokens > 1 && has_first_token(r)) {
    const double tpot = (e2e_of(r) - ttft_of(r)) / (r.output_tokens - 1);
    if (tpot > *slo.tpot_s) return false;
  }
  return true;
}

std::vector<double> ttft_samples(std::span<const RequestRecord> records) {
  std::vector<double> v;
  for (const auto& r : records)
    if (r.ok() && has_first_token(r)) v.push_back(ttft_of(r));
  return v;
}

std::vector<double> e2e_samples(std::span<const RequestRecord> records) {
  std::vector<double> v;
  for (const auto& r : records)
    if (r.ok()) v.push_back(e2e_of(r));
  return v;
}

std::vector<double> tpot_samples(std::span<const RequestRecord> records) {
  std::vector<double> v;
  for (const auto& r : records)
    if (r.ok() && has_first_token(r) && r.output_tokens > 1)
      v.push_back((e2e_of(r) - ttft_of(r)) / (r.output_tokens - 1));
  return v;
}

std::vector<double> itl_samples(std::span<const RequestRecord> records) {
  std::vector<double> v;
  for (const auto& r : records) {
    if (!r.ok()) continue;
    for (size_t i = 1; i < r.chunk_s.size(); ++i) v.push_back(r.chunk_s[i] - r.chunk_s[i - 1]);
  }
  return v;
}

namespace {

// RunMetrics::sustained_*: the window [sends[streams], last send) and its token rate.
void sustained_throughput(std::span<const RequestRecord> records, int streams, RunMetrics& m) {
  if (streams <= 0 || records.size() <= static_cast<size_t>(streams)) return;
  std::vector<double> sends;
  sends.reserve(records.size());
  for (const auto& r : records) sends.push_back(r.send_s);
  std::sort(sends.begin(), sends.end());
  const double a = sends[static_cast<size_t>(streams)], b = sends.back();
  if (!(b > a)) return;
  double tokens = 0;
  for (const auto& r : records) {
    if (!r.ok() || r.chunk_s.empty()) continue;
    const auto in = std::count_if(r.chunk_s.begin(), r.chunk_s.end(), [&](double t) { return t >= a && t < b; });
    tokens += static_cast<double>(in) * r.output_tokens / static_cast<double>(r.chunk_s.size());
  }
  m.sustained_window_s = b - a;
  m.sustained_output_throughput = tokens / (b - a);
}

}  // namespace

RunMetrics compute_metrics(std::span<const RequestRecord> records, const Slo& slo, int streams) {
  RunMetrics m;
  m.num_requests = static_cast<int64_t>(records.size());
  double t0 = std::numeric_limits<double>::infinity(), t1 = -std::numeric_limits<double>::infinity();
  for (const auto& r : records) {
    t0 = std::min(t0, r.send_s);
    t1 = std::max(t1, r.end_s);
    if (!r.ok()) {
      ++m.num_failed;
      std::string key = error_kind_name(r.error);
      if (r.error == ErrorKind::kHttpStatus) key += "_" + std::to_string(r.http_status);
      ++m.errors[key];
      continue;
    }
    ++m.num_ok;
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    if (r.usage_reported) ++m.num_usage_reported;
    if (r.expected_output_tokens > 0 && r.output_tokens != r.expected_output_tokens) ++m.num_output_mismatch;
  }
  m.duration_s = records.empty() ? 0 : std::max(0.0, t1 - t0);
  if (m.duration_s > 0) {
    m.request_throughput = static_cast<double>(m.num_ok) / m.duration_s;
    m.input_throughput = static_cast<double>(m.total_input_tokens) / m.duration_s;
    m.output_throughput = static_cast<double>(m.total_output_tokens) / m.duration_s;
    m.total_throughput = m.input_throughput + m.output_throughput;
  }
  m.ttft_s = summarize(ttft_samples(records));
  m.tpot_s = summarize(tpot_samples(records));
  m.itl_s = summarize(itl_samples(records));
  m.e2e_s = summarize(e2e_samples(records));
  m.has_slo = !slo.empty();
  for (const auto& r : records)
    if (meets_slo(r, slo)) ++m.num_good;
  if (m.duration_s > 0) m.goodput = static_cast<double>(m.num_good) / m.duration_s;
  if (m.num_requests > 0) m.good_fraction = static_cast<double>(m.num_good) / static_cast<double>(m.num_requests);
  sustained_throughput(records, streams, m);
  return m;
}

}  // namespace osprey::bench
