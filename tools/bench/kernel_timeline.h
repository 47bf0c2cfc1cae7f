// Where a GPU step's time goes when its kernels overlap (programmatic
// dependent launch lets a kernel start before the one before it ends, so
// per-kernel durations add up to more than the step): a trace of kernel
// spans (CUPTI activity records in model_bench --trace) summarised per
// kernel. Each moment of the step is charged to the oldest kernel running
// then (the one whose completion the others wait on): "gating" time, which
// with the idle time adds up to the step's wall time; "busy" is the sum of
// the kernel's own durations (overlaps counted twice).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::bench {

struct KernelSpan {
  std::string name;  // grouping key (short name, plus e.g. the grid size)
  uint64_t start_ns = 0, end_ns = 0;
};

struct KernelTimelineRow {
  std::string name;
  int calls = 0;
  double busy_us = 0;    // sum of end - start
  double gating_us = 0;  // moments when this was the oldest kernel running
};

struct KernelTimeline {
  double wall_us = 0;     // last end - first start
  double idle_us = 0;     // moments with no kernel running
  double overlap_us = 0;  // moments with two or more kernels running
  std::vector<KernelTimelineRow> rows;  // by gating time, largest first (ties: name)
};

// Spans with end < start are treated as empty. Empty input: all zeros.
KernelTimeline summarize_kernel_timeline(const std::vector<KernelSpan>& spans);

// Rows: kernel, calls, busy us, gating us, gating share of the wall time;
// then wall, idle and overlap.
std::string format_kernel_timeline(const KernelTimeline& t);

// "ns::(anonymous namespace)::gemv_kernel<(osprey::DType)9, ...>(char const*, ...)"
// -> "gemv_kernel": the demangled name without its namespaces, template
// arguments and parameters ("void " return types dropped too). Names
// without those parts come back unchanged.
std::string short_kernel_name(std::string_view demangled);

}  // namespace osprey::bench
