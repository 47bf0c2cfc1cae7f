// Parity with Hugging Face transformers on the committed tiny fixtures
// (tests/fixtures/make_fixtures.py): fp32 logits of every prompt position and
// 32 greedy tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "sequence_runner.h"

namespace osprey {
namespace {

std::string fixture_dir(const std::string& name) { return std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/" + name; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

class FixtureParity : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureParity, LogitsAndGreedyMatchTransformers) {
  const std::string dir = fixture_dir(GetParam());
  auto backend = ops::make_cpu_backend(2);
  auto model = Model::load(dir, *backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const nlohmann::json expected = read_json(dir + "/expected.json");
  ASSERT_FALSE(expected["prompts"].empty());
  const int vocab = (*model)->config().vocab_size;
  for (const auto& p : expected["prompts"]) {
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    const auto& ref_logits = p["logits"];
    ASSERT_EQ(ref_logits.size(), ids.size());
    {
      testing::SequenceRunner runner(**model, static_cast<int>(ids.size()) + 40);
      const std::vector<float> logits = runner.feed(ids, true);
      ASSERT_EQ(logits.size(), ids.size() * static_cast<size_t>(vocab));
      double max_abs = 0, max_diff = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        const auto& row = ref_logits[t];
        ASSERT_EQ(row.size(), static_cast<size_t>(vocab));
        for (int i = 0; i < vocab; ++i) {
          const double r = row[static_cast<size_t>(i)].get<double>();
          max_abs = std::max(max_abs, std::fabs(r));
          max_diff = std::max(max_diff, std::fabs(r - logits[t * vocab + i]));
        }
      }
      EXPECT_LE(max_diff, 1e-4 * max_abs) << GetParam() << " prompt of " << ids.size()
                                           << " tokens: max |diff| " << max_diff << ", max |logit| " << max_abs;
    }
    const std::vector<int32_t> ref_greedy = p["greedy"].get<std::vector<int32_t>>();
    testing::SequenceRunner runner(**model, static_cast<int>(ids.size() + ref_greedy.size()) + 1);
    EXPECT_EQ(runner.greedy(ids, static_cast<int>(ref_greedy.size())), ref_greedy)
        << GetParam() << " prompt of " << ids.size() << " tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureParity,
                         ::testing::Values("llama", "llama_gqa", "llama_mqa", "mistral", "qwen2", "qwen3",
                                           "llama_bf16", "llama_f16", "llama_sharded"));

}  // namespace
}  // namespace osprey
