// The per-op profile of `osprey bench offline --profile` (EngineConfig::profile,
// Engine::profile()): a table per phase of kernel groups with their time,
// share of the profiled time, and achieved GB/s and TFLOP/s against the
// device's measured copy and GEMM ceilings; and the same as JSON.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "osprey/engine.h"

namespace osprey::bench {

// Rows: group, calls, ms, share of all profiled time, GB/s (% of the copy
// ceiling), TFLOP/s (% of the GEMM ceiling; only for groups with FLOPs),
// then a total per phase. Empty when the report has no entries.
std::string format_profile_table(const ProfileReport& report);

// {"ceilings": {...}, "steps": {...}, "untimed_calls", "groups": [{phase, group,
// calls, total_ms, share, bytes, flops, gb_per_s, copy_fraction, tflops, gemm_fraction}]}.
nlohmann::ordered_json profile_to_json(const ProfileReport& report);

}  // namespace osprey::bench
