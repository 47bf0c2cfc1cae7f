#include "plan/gpu_table.h"

#include <cctype>
#include <cmath>

#include <nlohmann/json.hpp>

namespace osprey::plan {

namespace {

// Vendor datasheet figures, dense rates; docs/plan.md cites the source of each
// and marks the approximate ones. Link: per direction per GPU; latency: an
// estimate of one small NCCL all-reduce (NVLink ~8 us, PCIe ~15 us).
// key, name, GiB, GB/s, 16-bit TFLOP/s, FP8 TFLOP/s, INT8 TOP/s, bf16, link GB/s, link, latency us, approximate
const GpuSpec kBuiltin[] = {
    {"rtx-4090", "GeForce RTX 4090 24GB", 24, 1008, 165.2, 330.3, 660.6, true, 32, "PCIe 4.0 x16", 15, false},
    {"t4", "T4 16GB", 16, 320, 65, 0, 130, false, 16, "PCIe 3.0 x16", 15, false},
    {"v100-16gb", "V100 SXM2 16GB", 16, 900, 125, 0, 0, false, 150, "NVLink 2", 8, false},
    {"v100-32gb", "V100 SXM2 32GB", 32, 900, 125, 0, 0, false, 150, "NVLink 2", 8, false},
    {"a30", "A30 24GB", 24, 933, 165, 0, 330, true, 32, "PCIe 4.0 x16", 15, false},
    {"a10g", "A10G 24GB (AWS G5)", 24, 600, 70, 0, 140, true, 32, "PCIe 4.0 x16", 15, true},
    {"l4", "L4 24GB", 24, 300, 121, 242.5, 242.5, true, 32, "PCIe 4.0 x16", 15, false},
    {"l40s", "L40S 48GB", 48, 864, 362, 733, 733, true, 32, "PCIe 4.0 x16", 15, false},
    {"a100-40gb", "A100 SXM 40GB", 40, 1555, 312, 0, 624, true, 300, "NVLink 3", 8, false},
    {"a100-80gb", "A100 SXM 80GB", 80, 2039, 312, 0, 624, true, 300, "NVLink 3", 8, false},
    {"h100-pcie", "H100 PCIe 80GB", 80, 2000, 756, 1513, 1513, true, 64, "PCIe 5.0 x16", 15, false},
    {"h100-sxm", "H100 SXM 80GB", 80, 3350, 989.4, 1978.9, 1978.9, true, 450, "NVLink 4", 8, false},
    {"h200", "H200 SXM 141GB", 141, 4800, 989.4, 1978.9, 1978.9, true, 450, "NVLink 4", 8, false},
    {"b200", "B200 180GB (HGX)", 180, 7700, 2250, 4500, 4500, true, 900, "NVLink 5", 8, true},
};

struct Alias {
  const char* alias;
  const char* key;
};
const Alias kAliases[] = {
    {"4090", "rtx-4090"},  {"geforcertx4090", "rtx-4090"}, {"v100", "v100-32gb"},
    {"a100", "a100-80gb"}, {"a10080gbsxm", "a100-80gb"},   {"h100", "h100-sxm"},
    {"h200sxm", "h200"},   {"h200141gb", "h200"},          {"b200180gb", "b200"},
};

// Lowercase without spaces, '-' and '_'.
std::string normalise(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' || c == '-' || c == '_') continue;
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

bool finite_non_negative(double x) {
  return std::isfinite(x) && x >= 0;
}

}  // namespace

GpuTable GpuTable::builtin() {
  GpuTable t;
  t.entries_.assign(std::begin(kBuiltin), std::end(kBuiltin));
  return t;
}

std::string GpuTable::key_list() const {
  std::string out;
  for (const GpuSpec& g : entries_) out += (out.empty() ? "" : ", ") + g.key;
  return out + ", custom";
}

Expected<GpuSpec> GpuTable::find(const std::string& name) const {
  const std::string n = normalise(name);
  if (n == "custom") {
    GpuSpec g;
    g.key = "custom";
    g.name = "custom";
    g.link = "custom";
    return g;
  }
  for (const GpuSpec& g : entries_) {
    if (normalise(g.key) == n || normalise(g.name) == n) return g;
  }
  for (const Alias& a : kAliases) {
    if (n != a.alias) continue;
    for (const GpuSpec& g : entries_) {
      if (g.key == a.key) return g;
    }
  }
  return not_found("unknown GPU '" + name + "' (known: " + key_list() + "; add one with --gpu-file)");
}

Status GpuTable::merge_json(const std::string& json_text, const std::string& origin) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("GPU file '" + origin + "' is not valid JSON");
  if (j.is_object()) j = nlohmann::json::array({j});
  if (!j.is_array()) return invalid_argument("GPU file '" + origin + "' must hold an object or an array of objects");
  std::vector<GpuSpec> merged = entries_;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    const std::string where = "GPU file '" + origin + "' entry " + std::to_string(i);
    if (!e.is_object()) return invalid_argument(where + " is not an object");
    if (!e.contains("key") || !e["key"].is_string() || e["key"].get<std::string>().empty()) {
      return invalid_argument(where + ": \"key\" (a non-empty string) is required");
    }
    const std::string key = e["key"].get<std::string>();
    GpuSpec g;
    size_t slot = merged.size();
    for (size_t k = 0; k < merged.size(); ++k) {
      if (normalise(merged[k].key) == normalise(key)) {
        g = merged[k];
        slot = k;
      }
    }
    g.key = key;
    if (g.name.empty()) g.name = key;
    for (const auto& [field, value] : e.items()) {
      auto number = [&](double& out) -> Status {
        if (!value.is_number()) return invalid_argument(where + ": \"" + field + "\" is not a number");
        out = value.get<double>();
        if (!finite_non_negative(out)) return invalid_argument(where + ": \"" + field + "\" must be finite and >= 0");
        return Status::Ok();
      };
      auto text = [&](std::string& out) -> Status {
        if (!value.is_string()) return invalid_argument(where + ": \"" + field + "\" is not a string");
        out = value.get<std::string>();
        return Status::Ok();
      };
      if (field == "key") continue;
      if (field == "name") {
        OSP_RETURN_IF_ERROR(text(g.name));
      } else if (field == "memory_gb") {
        OSP_RETURN_IF_ERROR(number(g.memory_gib));
      } else if (field == "bandwidth_gbs") {
        OSP_RETURN_IF_ERROR(number(g.bandwidth_gbs));
      } else if (field == "tflops_bf16" || field == "tflops_fp16") {
        OSP_RETURN_IF_ERROR(number(g.tflops_16));
      } else if (field == "tflops_fp8") {
        OSP_RETURN_IF_ERROR(number(g.tflops_fp8));
      } else if (field == "tops_int8") {
        OSP_RETURN_IF_ERROR(number(g.tops_int8));
      } else if (field == "link_gbs") {
        OSP_RETURN_IF_ERROR(number(g.link_gbs));
      } else if (field == "link_latency_us") {
        OSP_RETURN_IF_ERROR(number(g.link_latency_us));
      } else if (field == "link") {
        OSP_RETURN_IF_ERROR(text(g.link));
      } else if (field == "bf16") {
        if (!value.is_boolean()) return invalid_argument(where + ": \"bf16\" is not a boolean");
        g.bf16 = value.get<bool>();
      } else if (field == "approximate") {
        if (!value.is_boolean()) return invalid_argument(where + ": \"approximate\" is not a boolean");
        g.approximate = value.get<bool>();
      } else {
        return invalid_argument(where + ": unknown field \"" + field + "\"");
      }
    }
    OSP_RETURN_IF_ERROR(validate_gpu(g));
    if (slot == merged.size()) {
      merged.push_back(g);
    } else {
      merged[slot] = g;
    }
  }
  entries_ = std::move(merged);
  return Status::Ok();
}

Status validate_gpu(const GpuSpec& g) {
  const std::string who = "GPU '" + g.key + "'";
  const std::pair<const char*, double> figures[] = {{"memory (--mem-gb)", g.memory_gib},
                                                    {"bandwidth (--bw-gbs)", g.bandwidth_gbs},
                                                    {"16-bit rate (--tflops-bf16)", g.tflops_16},
                                                    {"FP8 rate (--tflops-fp8)", g.tflops_fp8},
                                                    {"INT8 rate (--tops-int8)", g.tops_int8},
                                                    {"link bandwidth (--link-gbs)", g.link_gbs},
                                                    {"link latency (--allreduce-latency-us)", g.link_latency_us}};
  for (const auto& [what, v] : figures) {
    if (!finite_non_negative(v)) return invalid_argument(who + ": " + what + " must be finite and >= 0");
  }
  if (g.memory_gib <= 0) return invalid_argument(who + ": memory must be positive (--mem-gb)");
  if (g.bandwidth_gbs <= 0) return invalid_argument(who + ": memory bandwidth must be positive (--bw-gbs)");
  if (g.tflops_16 <= 0) return invalid_argument(who + ": the 16-bit rate must be positive (--tflops-bf16)");
  return Status::Ok();
}

Expected<GpuSpec> apply_overrides(GpuSpec g, const GpuOverrides& o) {
  auto set = [](double& field, const std::optional<double>& v) {
    if (v) field = *v;
  };
  set(g.memory_gib, o.memory_gib);
  set(g.bandwidth_gbs, o.bandwidth_gbs);
  set(g.tflops_16, o.tflops_16);
  set(g.tflops_fp8, o.tflops_fp8);
  set(g.tops_int8, o.tops_int8);
  set(g.link_gbs, o.link_gbs);
  set(g.link_latency_us, o.link_latency_us);
  if (o.any() && g.key != "custom") g.name += " (overridden)";
  OSP_RETURN_IF_ERROR(validate_gpu(g));
  return g;
}

}  // namespace osprey::plan
