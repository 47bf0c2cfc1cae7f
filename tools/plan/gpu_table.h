// GpuSpec and GpuTable: the accelerator figures `osprey plan` computes with.
// Built-in entries are vendor datasheet figures (docs/plan.md cites each);
// a JSON file or command-line overrides add or replace entries.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "osprey/status.h"

namespace osprey::plan {

// One accelerator. Rates are dense (no 2:4 sparsity), per device.
struct GpuSpec {
  std::string key;             // lookup key, e.g. "h100-sxm"
  std::string name;            // display name, e.g. "H100 SXM 80GB"
  double memory_gib = 0;       // device memory, GiB (2^30 bytes; vendors' "80 GB" HBM is 80 GiB)
  double bandwidth_gbs = 0;    // memory bandwidth, GB/s (1e9 bytes/s)
  double tflops_16 = 0;        // dense FP16/BF16 tensor rate, TFLOP/s (FP32 accumulate)
  double tflops_fp8 = 0;       // dense FP8 tensor rate, TFLOP/s; 0: no FP8 support
  double tops_int8 = 0;        // dense INT8 tensor rate, TOP/s; 0: no INT8 tensor cores
  bool bf16 = true;            // false: FP16 only (bf16 models run as fp16, same size)
  double link_gbs = 0;         // GPU-to-GPU bandwidth per direction, GB/s (ring all-reduce step rate)
  std::string link;            // "NVLink 4", "PCIe 4.0 x16", ...
  double link_latency_us = 0;  // fixed cost of one all-reduce, microseconds (approximate)
  bool approximate = false;    // some figure is an estimate (docs/plan.md says which)
};

// Command-line overrides of single fields (--mem-gb, --bw-gbs, ...).
struct GpuOverrides {
  std::optional<double> memory_gib, bandwidth_gbs, tflops_16, tflops_fp8, tops_int8, link_gbs, link_latency_us;
  bool any() const {
    return memory_gib || bandwidth_gbs || tflops_16 || tflops_fp8 || tops_int8 || link_gbs || link_latency_us;
  }
};

class GpuTable {
 public:
  // The built-in entries.
  static GpuTable builtin();

  const std::vector<GpuSpec>& entries() const { return entries_; }

  // By key or alias, ignoring case, spaces, '-' and '_' ("H100 SXM", "h100_sxm",
  // "h100" -> h100-sxm). "custom" gives an all-zero entry to be filled by
  // overrides. An unknown name is an error listing the known keys.
  Expected<GpuSpec> find(const std::string& name) const;

  // Adds or replaces entries from JSON: an array of objects, or one object,
  // each {"key": "...", "name": "...", "memory_gb": 80, "bandwidth_gbs": 3350,
  // "tflops_bf16": 989, "tflops_fp8": 1979, "tops_int8": 1979, "bf16": true,
  // "link_gbs": 450, "link": "NVLink 4", "link_latency_us": 5}. A key already
  // present starts from that entry, so a file may change one field.
  Status merge_json(const std::string& json_text, const std::string& origin);

  // Comma-separated keys, for error messages and --help.
  std::string key_list() const;

 private:
  std::vector<GpuSpec> entries_;
};

// Applies overrides; then checks that memory, bandwidth and the 16-bit rate
// are positive and every figure finite and non-negative.
Expected<GpuSpec> apply_overrides(GpuSpec gpu, const GpuOverrides& o);
Status validate_gpu(const GpuSpec& gpu);

}  // namespace osprey::plan
