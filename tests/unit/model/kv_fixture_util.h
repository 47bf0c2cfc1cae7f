// Helpers of the KV page dtype tests (fp8_kv_test.cpp, int8_kv_test.cpp):
// the committed fixtures, a model loaded with a KV page dtype, and the NMSE
// of its logits against a fixture prompt's transformers reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "sequence_runner.h"

namespace osprey::testing {

// Logit error bounds of FP8 K and V pages (each value within 2^-4 relative
// of itself, scale 1) over these fixtures (hidden 64, 2 layers, random
// weights), measured here (2026-11-28): the worst prompt of each fixture
// at NMSE 0.0023 - 0.0071, greedy divergences at reference top-2 margins up
// to 0.03 of max |logit|. A wrong scale or layout gives NMSE ~1. A greedy
// divergence is accepted where the reference's top-2 margin is at most
// kFp8KvMargin of max |logit|.
inline constexpr double kFp8KvNmse = 1.5e-2;
inline constexpr double kFp8KvMargin = 0.05;

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

// One fixture's prompts (its expected.json) through `model`: each prompt's
// logit NMSE at most nmse_bound and above 0 for prompts of more than one
// token (a KV page dtype that rounds cannot be exact), and greedy decoding
// equal to the reference's until a step where the reference's top-2 margin
// is at most margin_fraction of its largest |logit| (a near tie), where
// they may part. Returns the worst NMSE. `what` names the setting in
// messages.
inline double check_fixture_prompts(Model& model, const std::string& fixture, double nmse_bound, double margin_fraction,
                                    const std::string& what) {
  const nlohmann::json expected = read_json(fixture_dir(fixture) + "/expected.json");
  double worst = 0;
  for (const auto& p : expected["prompts"]) {
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(p["logits"].size(), p["logits_positions"].size());
    const double nmse = logits_nmse(model, p);
    worst = std::max(worst, nmse);
    EXPECT_LE(nmse, nmse_bound) << fixture << ", " << what << ", prompt of " << ids.size() << " tokens";
    if (ids.size() > 1) {
      EXPECT_GT(nmse, 0.0) << what << " round K and V: the logits cannot be exact";
    }
    const std::vector<int32_t> ref_greedy = p["greedy"].get<std::vector<int32_t>>();
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    const double max_abs = p["greedy_logits_max_abs"].get<double>();
    SequenceRunner gen(model, static_cast<int>(ids.size() + ref_greedy.size()) + 1);
    const std::vector<int32_t> got = gen.greedy(ids, static_cast<int>(ref_greedy.size()));
    EXPECT_EQ(got.size(), ref_greedy.size());
    size_t k = 0;
    while (k < got.size() && k < ref_greedy.size() && got[k] == ref_greedy[k]) ++k;
    if (k < got.size() && k < ref_greedy.size()) {
      EXPECT_LE(margins[k], margin_fraction * max_abs) << fixture << ", " << what << ": greedy diverges at token " << k
                                                       << " of " << got.size() << " without a near tie";
      std::printf("%s, %s, prompt of %zu tokens: greedy diverges at token %zu (reference margin %.3g of max |logit|)\n",
                  fixture.c_str(), what.c_str(), ids.size(), k, margins[k] / max_abs);
    }
  }
  return worst;
}

}  // namespace osprey::testing
