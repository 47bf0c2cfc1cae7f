#include "bench/kernel_timeline.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace osprey::bench {

KernelTimeline summarize_kernel_timeline(const std::vector<KernelSpan>& spans) {
  KernelTimeline t;
  if (spans.empty()) return t;
  // The spans with end >= start and their rows (std::map: stable addresses).
  struct Span {
    uint64_t start, end;
    KernelTimelineRow* row;
  };
  std::map<std::string, KernelTimelineRow> rows;
  std::vector<Span> ss;
  std::vector<uint64_t> cuts;
  for (const KernelSpan& s : spans) {
    KernelTimelineRow& r = rows[s.name];
    r.name = s.name;
    ++r.calls;
    const Span sp{s.start_ns, std::max(s.start_ns, s.end_ns), &r};
    r.busy_us += static_cast<double>(sp.end - sp.start) * 1e-3;
    ss.push_back(sp);
    cuts.push_back(sp.start);
    cuts.push_back(sp.end);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  t.wall_us = static_cast<double>(cuts.back() - cuts.front()) * 1e-3;
  // Each elementary interval between consecutive cuts: the spans covering
  // it all cover it whole; charge it to the one that started first.
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const uint64_t lo = cuts[i], hi = cuts[i + 1];
    const double us = static_cast<double>(hi - lo) * 1e-3;
    const Span* oldest = nullptr;
    int running = 0;
    for (const Span& s : ss) {
      if (s.start <= lo && s.end >= hi) {
        ++running;
        if (oldest == nullptr || s.start < oldest->start) oldest = &s;
      }
    }
    if (oldest == nullptr) {
      t.idle_us += us;
    } else {
      oldest->row->gating_us += us;
      if (running >= 2) t.overlap_us += us;
    }
  }
  for (auto& [name, r] : rows) t.rows.push_back(r);
  std::stable_sort(t.rows.begin(), t.rows.end(),
                   [](const KernelTimelineRow& a, const KernelTimelineRow& b) { return a.gating_us > b.gating_us; });
  return t;
}

std::string format_kernel_timeline(const KernelTimeline& t) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "  %-44s %6s %10s %10s %7s\n", "kernel", "calls", "busy us", "gating us", "share");
  out += line;
  for (const KernelTimelineRow& r : t.rows) {
    std::snprintf(line, sizeof line, "  %-44s %6d %10.1f %10.1f %6.1f%%\n", r.name.c_str(), r.calls, r.busy_us,
                  r.gating_us, t.wall_us > 0 ? 100.0 * r.gating_us / t.wall_us : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "  wall %.1f us, idle %.1f us, two or more kernels running %.1f us\n", t.wall_us,
                t.idle_us, t.overlap_us);
  out += line;
  return out;
}

std::string short_kernel_name(std::string_view n) {
  // Drop the parameter list: from the first '(' at template depth 0 that
  // does not open "(anonymous namespace)".
  int depth = 0;
  size_t params = std::string_view::npos;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    if (c == '<') ++depth;
    if (c == '>' && depth > 0) --depth;
    if (c == '(' && depth == 0) {
      // "(anonymous namespace)" is part of a qualified name, not parameters.
      if (n.substr(i).rfind("(anonymous namespace)", 0) == 0) {
        i += std::string_view("(anonymous namespace)").size() - 1;
        continue;
      }
      params = i;
      break;
    }
  }
  std::string_view s = n.substr(0, params);
  // Drop the template arguments: from the first '<' at depth 0.
  const size_t lt = s.find('<');
  if (lt != std::string_view::npos) s = s.substr(0, lt);
  // Drop a return type ("void ") and the qualifiers before the last "::".
  const size_t sp = s.rfind(' ');
  if (sp != std::string_view::npos) s = s.substr(sp + 1);
  const size_t colons = s.rfind("::");
  if (colons != std::string_view::npos) s = s.substr(colons + 2);
  return std::string(s.empty() ? n : s);
}

}  // namespace osprey::bench
