// Helpers of the KV page dtype tests (fp8_kv_test.cpp, int8_kv_test.cpp):
// the committed fixtures, a model loaded with a KV page dtype, and the NMSE
// of its logits against a fixture prompt's transformers reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "sequence_runner.h"

namespace osprey::testing {

inline std::string fixture_dir(const std::string& name) {
  return std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/" + name;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

// The model at dir on be with KV pages of `kv` (ModelLoadOptions::kv_cache_dtype).
inline Expected<std::unique_ptr<Model>> load_with_kv(const std::string& dir, ops::Backend& be, const std::string& kv) {
  ModelLoadOptions o;
  o.kv_cache_dtype = kv;
  return Model::load(dir, be, o);
}

// NMSE of the model's logits at the fixture prompt's reference positions
// against its reference logits (1e30, with a failure, on a malformed prompt).
inline double logits_nmse(Model& model, const nlohmann::json& prompt) {
  const std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
  const auto positions = prompt["logits_positions"].get<std::vector<size_t>>();
  const auto& ref_logits = prompt["logits"];
  const int vocab = model.config().vocab_size;
  SequenceRunner runner(model, static_cast<int>(ids.size()) + 1);
  const std::vector<float> logits = runner.feed(ids, true);
  EXPECT_EQ(logits.size(), ids.size() * static_cast<size_t>(vocab));
  if (logits.size() != ids.size() * static_cast<size_t>(vocab)) return 1e30;
  double err = 0, norm = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    EXPECT_LT(positions[i], ids.size());
    if (positions[i] >= ids.size()) return 1e30;
    for (int v = 0; v < vocab; ++v) {
      const double r = ref_logits[i][static_cast<size_t>(v)].get<double>();
      const double d = logits[positions[i] * static_cast<size_t>(vocab) + static_cast<size_t>(v)] - r;
      err += d * d;
      norm += r * r;
    }
  }
  return err / std::max(norm, 1e-30);
}

}  // namespace osprey::testing
