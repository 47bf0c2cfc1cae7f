// Rendering of PlanResults: a readable report, a side-by-side comparison, and
// JSON for machines.
#pragma once

#include <string>
#include <vector>

#include "plan/planner.h"

namespace osprey::plan {

// One variant of a --compare run: the plan, or why there is none.
struct CompareColumn {
  std::string value;  // the compared field's value ("h100-sxm", "fp8", ...)
  std::optional<PlanResult> plan;
  std::string error;  // when !plan
};

std::string format_text(const PlanResult& p);
std::string format_compare_text(const std::string& field, const std::vector<CompareColumn>& columns);
std::string format_json(const PlanResult& p);
std::string format_compare_json(const std::string& field, const std::vector<CompareColumn>& columns);

}  // namespace osprey::plan
