#include "bench/profile_table.h"

#include <cstdio>

namespace osprey::bench {

namespace {

double total_ms(const ProfileReport& r) {
  double t = 0;
  for (const ProfileEntry& e : r.entries) t += e.total_ms;
  return t;
}

// Achieved rates of one entry: bytes / s / 1e9 and FLOP / s / 1e12 (0 when no time).
double gb_per_s(const ProfileEntry& e) {
  return e.total_ms > 0 ? e.bytes / (e.total_ms * 1e-3) / 1e9 : 0.0;
}
double tflops(const ProfileEntry& e) {
  return e.total_ms > 0 ? e.flops / (e.total_ms * 1e-3) / 1e12 : 0.0;
}

void append(std::string& out, const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  out += buf;
}

}  // namespace

std::string format_profile_table(const ProfileReport& r) {
  std::string out;
  if (r.entries.empty()) return out;
  const double all = total_ms(r);
  append(out, "per-op profile (device time inside each op; %lld prefill and %lld decode steps)\n",
         static_cast<long long>(r.prefill_steps), static_cast<long long>(r.decode_steps));
  if (r.copy_gbs > 0 || r.gemm_tflops > 0)
    append(out, "  ceilings: copy %.1f GB/s (device to device, read + write), GEMM %.2f TFLOP/s (%s)\n", r.copy_gbs,
           r.gemm_tflops, r.gemm_shape.empty() ? "-" : r.gemm_shape.c_str());
  append(out, "  %-34s %8s %11s %7s %16s %16s\n", "group", "calls", "ms", "share", "GB/s (copy %)", "TFLOP/s (GEMM %)");
  std::string phase;
  double phase_ms = 0;
  auto phase_total = [&] {
    if (!phase.empty())
      append(out, "  %-34s %8s %11.3f %6.1f%%\n", ("total " + phase).c_str(), "", phase_ms,
             all > 0 ? 100.0 * phase_ms / all : 0.0);
  };
  for (const ProfileEntry& e : r.entries) {
    if (e.phase != phase) {
      phase_total();
      phase = e.phase;
      phase_ms = 0;
      append(out, "  [%s]\n", phase.c_str());
    }
    phase_ms += e.total_ms;
    char bw[32] = "", fl[32] = "";
    if (e.bytes > 0) {
      if (r.copy_gbs > 0) {
        std::snprintf(bw, sizeof bw, "%.1f (%3.0f%%)", gb_per_s(e), 100.0 * gb_per_s(e) / r.copy_gbs);
      } else {
        std::snprintf(bw, sizeof bw, "%.1f", gb_per_s(e));
      }
    }
    if (e.flops > 0) {
      if (r.gemm_tflops > 0) {
        std::snprintf(fl, sizeof fl, "%.2f (%3.0f%%)", tflops(e), 100.0 * tflops(e) / r.gemm_tflops);
      } else {
        std::snprintf(fl, sizeof fl, "%.2f", tflops(e));
      }
    }
    append(out, "  %-34s %8lld %11.3f %6.1f%% %16s %16s\n", e.group.c_str(), static_cast<long long>(e.calls),
           e.total_ms, all > 0 ? 100.0 * e.total_ms / all : 0.0, bw, fl);
  }
  phase_total();
  if (r.untimed_calls > 0)
    append(out, "  (%lld op calls not timed: too many in one step)\n", static_cast<long long>(r.untimed_calls));
  return out;
}

nlohmann::ordered_json profile_to_json(const ProfileReport& r) {
  const double all = total_ms(r);
  nlohmann::ordered_json j;
  j["ceilings"] = {{"copy_gb_per_s", r.copy_gbs}, {"gemm_tflops", r.gemm_tflops}, {"gemm_shape", r.gemm_shape}};
  j["steps"] = {{"prefill", r.prefill_steps}, {"decode", r.decode_steps}};
  j["untimed_calls"] = r.untimed_calls;
  j["total_ms"] = all;
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const ProfileEntry& e : r.entries) {
    nlohmann::ordered_json g;
    g["phase"] = e.phase;
    g["group"] = e.group;
    g["calls"] = e.calls;
    g["total_ms"] = e.total_ms;
    g["share"] = all > 0 ? e.total_ms / all : 0.0;
    g["bytes"] = e.bytes;
    g["flops"] = e.flops;
    g["gb_per_s"] = gb_per_s(e);
    g["copy_fraction"] = r.copy_gbs > 0 ? gb_per_s(e) / r.copy_gbs : 0.0;
    g["tflops"] = tflops(e);
    g["gemm_fraction"] = r.gemm_tflops > 0 ? tflops(e) / r.gemm_tflops : 0.0;
    groups.push_back(std::move(g));
  }
  j["groups"] = std::move(groups);
  return j;
}

}  // namespace osprey::bench
