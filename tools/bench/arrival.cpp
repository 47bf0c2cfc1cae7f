#include "bench/arrival.h"

#include <cmath>
#include <limits>
#include <random>

namespace osprey::bench {

Expected<std::vector<double>> arrival_times(const ArrivalOptions& o, int n) {
  std::vector<double> t(static_cast<size_t>(std::max(0, n)), 0.0);
  if (o.kind == "burst") {
    if (o.burst_size < 1) return invalid_argument("--burst-size must be >= 1");
    if (!(o.burst_interval_s >= 0) || !std::isfinite(o.burst_interval_s))
      return invalid_argument("--burst-interval must be a finite number >= 0");
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<double>(i / static_cast<size_t>(o.burst_size)) * o.burst_interval_s;
    return t;
  }
  if (o.kind != "poisson" && o.kind != "constant")
    return invalid_argument("unknown arrival '" + o.kind + "' (poisson, constant, burst)");
  if (!(o.rate > 0) || std::isinf(o.rate)) return t;  // all at once
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate);
  double now = 0;
  for (size_t i = 1; i < t.size(); ++i) {
    now += o.kind == "poisson" ? gap(rng) : 1.0 / o.rate;
    t[i] = now;
  }
  return t;
}

Expected<std::vector<double>> parse_number_list(const std::string& text) {
  std::vector<double> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    if (item == "inf" || item == "Inf" || item == "INF") {
      out.push_back(std::numeric_limits<double>::infinity());
    } else {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(item, &used);
      } catch (...) {
        return invalid_argument("not a number: '" + item + "' in '" + text + "'");
      }
      if (used != item.size() || !(v > 0)) return invalid_argument("not a positive number: '" + item + "'");
      out.push_back(v);
    }
    start = comma + 1;
    if (comma >= text.size()) break;
  }
  if (out.empty()) return invalid_argument("empty list");
  return out;
}

}  // namespace osprey::bench
