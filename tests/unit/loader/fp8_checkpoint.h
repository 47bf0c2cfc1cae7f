// FP8 checkpoints for tests, made from a float Hugging Face folder as FP8
// quantisation tools write them: each layer projection "<prefix>.weight" as
// F8_E4M3 codes with one scale per matrix in "<prefix>.weight_scale" (F32,
// amax / 448, codes rounded to nearest even), every other tensor as it was;
// and, for comparison, the same checkpoint with those projections
// dequantised to F32 (code * scale). Variants write the scale layouts osprey
// refuses.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "loader/weights.h"

namespace osprey::testing {

enum class Fp8Scales {
  kScalar,      // weight_scale of shape [] (the common layout)
  kOneElement,  // shape [1]
  kPerChannel,  // [rows, 1]: one scale a row (amax of the row / 448)
  kPerBlock,    // weight_scale [rows / 32, cols / 32]: one a 32 x 32 block (compressed-tensors' block strategy)
  kBlockInv,    // weight_scale_inv [rows / 16, cols / 16] only: one a 16 x 16 block (DeepSeek's layout)
  kBadGrid,     // weight_scale_inv [3, 5], which no block grid over the matrix has: refused
  kMissing,     // no scale tensor: refused
  kNonFinite,   // the first projection's scale is +inf: refused
};

struct StEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// Writes a safetensors file of the entries in order (header padded to 8 bytes).
inline void write_safetensors(const std::filesystem::path& file, const std::vector<StEntry>& entries) {
  nlohmann::json h = nlohmann::json::object();
  std::vector<uint8_t> data;
  for (const StEntry& e : entries) {
    h[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                 {"shape", e.shape},
                 {"data_offsets", {data.size(), data.size() + e.data.size()}}};
    data.insert(data.end(), e.data.begin(), e.data.end());
  }
  std::string header = h.dump();
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream out(file, std::ios::binary);
  const uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

inline bool is_layer_projection(const std::string& name) {
  for (const char* s : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                        "up_proj.weight", "down_proj.weight"}) {
    const std::string suffix = s;
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        name.rfind("model.layers.", 0) == 0)
      return true;
  }
  return false;
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Writes the FP8 checkpoint of src (a folder with config.json and one
// model.safetensors) to fp8_dir and, if dequant_dir is not empty, its
// dequantised twin there. False (with a gtest-free reason in *why) on a
// read failure.
inline bool make_fp8_checkpoint(const std::filesystem::path& src, const std::filesystem::path& fp8_dir,
                                const std::filesystem::path& dequant_dir, Fp8Scales scales, std::string* why) {
  auto w = load_weights(src.string());
  if (!w.ok()) {
    *why = w.status().to_string();
    return false;
  }
  std::vector<StEntry> fp8, deq;
  bool first = true;
  for (const auto& [name, t] : w->tensors) {
    std::vector<uint8_t> raw(static_cast<const uint8_t*>(t.data()), static_cast<const uint8_t*>(t.data()) + t.nbytes());
    const std::vector<int64_t> shape(t.shape(), t.shape() + t.ndim());
    if (!is_layer_projection(name)) {
      fp8.push_back({name, t.dtype(), shape, raw});
      deq.push_back({name, t.dtype(), shape, raw});
      continue;
    }
    const int64_t n = t.numel(), rows = t.dim(0), cols = t.dim(1);
    std::vector<float> v(static_cast<size_t>(n));
    dequantize_row(t.dtype(), t.data(), v.data(), n);
    // One amax for the matrix, one a row (kPerChannel) or one a block x
    // block tile (kPerBlock, kBlockInv): scale amax / 448, codes of w * 448 /
    // amax.
    const bool per_row = scales == Fp8Scales::kPerChannel;
    const int64_t block = scales == Fp8Scales::kPerBlock ? 32 : scales == Fp8Scales::kBlockInv ? 16 : 0;
    const int64_t grid_cols = block > 0 ? (cols + block - 1) / block : 1;
    const int64_t groups = per_row ? rows : block > 0 ? (rows + block - 1) / block * grid_cols : 1;
    auto group_of = [&](int64_t i) -> size_t {
      if (per_row) return static_cast<size_t>(i / cols);
      if (block > 0) return static_cast<size_t>((i / cols) / block * grid_cols + (i % cols) / block);
      return 0;
    };
    std::vector<float> amax(static_cast<size_t>(groups), 0.0f);
    for (int64_t i = 0; i < n; ++i)
      amax[group_of(i)] = std::max(amax[group_of(i)], std::fabs(v[static_cast<size_t>(i)]));
    std::vector<float> row_scale(amax.size()), row_inv(amax.size());
    for (size_t g = 0; g < amax.size(); ++g) {
      row_scale[g] = amax[g] > 0.0f ? amax[g] / kF8E4M3Max : 1.0f;
      row_inv[g] = amax[g] > 0.0f ? kF8E4M3Max / amax[g] : 1.0f;
    }
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    std::vector<float> back(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const size_t g = group_of(i);
      codes[static_cast<size_t>(i)] = f32_to_f8e4m3(v[static_cast<size_t>(i)] * row_inv[g]);
      back[static_cast<size_t>(i)] = f8e4m3_to_f32(codes[static_cast<size_t>(i)]) * row_scale[g];
    }
    const float scale = row_scale[0];
    fp8.push_back({name, DType::kF8E4M3, shape, codes});
    deq.push_back({name, DType::kF32, shape, bytes_of(back)});
    const std::string prefix = name.substr(0, name.size() - 7);  // less ".weight"
    const float s = scales == Fp8Scales::kNonFinite && first ? INFINITY : scale;
    first = false;
    // The block scales' grid, under prefix + suffix.
    auto push_block_scales = [&](const char* suffix) {
      fp8.push_back({prefix + suffix, DType::kF32, {(rows + block - 1) / block, grid_cols}, bytes_of(row_scale)});
    };
    switch (scales) {
      case Fp8Scales::kScalar:
      case Fp8Scales::kNonFinite:
        fp8.push_back({prefix + ".weight_scale", DType::kF32, {}, bytes_of(std::vector<float>{s})});
        break;
      case Fp8Scales::kOneElement:
        fp8.push_back({prefix + ".weight_scale", DType::kF32, {1}, bytes_of(std::vector<float>{s})});
        break;
      case Fp8Scales::kPerChannel:
        fp8.push_back({prefix + ".weight_scale", DType::kF32, {rows, 1}, bytes_of(row_scale)});
        break;
      case Fp8Scales::kPerBlock:
        push_block_scales(".weight_scale");
        break;
      case Fp8Scales::kBlockInv:
        push_block_scales(".weight_scale_inv");
        break;
      case Fp8Scales::kBadGrid:
        fp8.push_back({prefix + ".weight_scale_inv", DType::kF32, {3, 5}, bytes_of(std::vector<float>(15, s))});
        break;
      case Fp8Scales::kMissing:
        break;
    }
    fp8.push_back({prefix + ".input_scale", DType::kF32, {}, bytes_of(std::vector<float>{1.0f})});  // ignored
  }
  std::ifstream in(src / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  std::filesystem::create_directories(fp8_dir);
  std::ofstream(fp8_dir / "config.json") << config.dump(2);
  write_safetensors(fp8_dir / "model.safetensors", fp8);
  if (!dequant_dir.empty()) {
    config.erase("quantization_config");
    std::filesystem::create_directories(dequant_dir);
    std::ofstream(dequant_dir / "config.json") << config.dump(2);
    write_safetensors(dequant_dir / "model.safetensors", deq);
  }
  return true;
}

}  // namespace osprey::testing
