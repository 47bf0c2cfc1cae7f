// The default model (SmolLM2-135M-Instruct Q4_1 GGUF) against Hugging Face
// transformers reading the same file (tests/model/make_default_reference.py):
// prompt ids from osprey's tokenizer and chat template, the logits of the last
// prompt position, and 64 greedy tokens (at least 48 must agree; a later
// divergence is reported with the reference's top-2 margin there).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/tokenizer_loader.h"
#include "model/model.h"
#include "osprey/model_info.h"
#include "sequence_runner.h"
#include "tokenizer/chat_template.h"

namespace osprey {
namespace {

const std::string kRefDir = std::string(OSPREY_SOURCE_DIR) + "/tests/model/";

class DefaultModelParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto path = resolve_model_path("default");
    ASSERT_TRUE(path.ok()) << path.status().to_string();
    backend_ = ops::make_cpu_backend(0).release();
    auto model = Model::load(*path, *backend_);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(model).value().release();
    auto tok = load_tokenizer_for_model(*model_);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = std::move(tok).value().release();
    std::ifstream in(kRefDir + "default_reference.json");
    ASSERT_TRUE(in.good());
    ref_ = new nlohmann::ordered_json(nlohmann::ordered_json::parse(in));
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete tokenizer_;
    delete model_;
    delete backend_;
  }
  static ops::Backend* backend_;
  static Model* model_;
  static Tokenizer* tokenizer_;
  static nlohmann::ordered_json* ref_;
};
ops::Backend* DefaultModelParity::backend_ = nullptr;
Model* DefaultModelParity::model_ = nullptr;
Tokenizer* DefaultModelParity::tokenizer_ = nullptr;
nlohmann::ordered_json* DefaultModelParity::ref_ = nullptr;

TEST_F(DefaultModelParity, PromptsRenderAndTokenizeLikeTransformers) {
  ASSERT_GE((*ref_)["prompts"].size(), 5u);
  auto tmpl = ChatTemplate::compile(tokenizer_->chat_template());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  for (const auto& p : (*ref_)["prompts"]) {
    const std::string text = p["text"].get<std::string>();
    if (p["kind"] == "chat") {
      nlohmann::ordered_json ctx = {{"messages", p["messages"]},
                                    {"add_generation_prompt", true},
                                    {"bos_token", tokenizer_->bos_token()},
                                    {"eos_token", tokenizer_->eos_token()}};
      auto rendered = tmpl->render(ctx);
      ASSERT_TRUE(rendered.ok()) << rendered.status().to_string();
      EXPECT_EQ(*rendered, text) << p["name"];
    }
    EXPECT_EQ(tokenizer_->encode(text, false), p["ids"].get<std::vector<int32_t>>()) << p["name"];
    EXPECT_EQ(tokenizer_->encode(text, true), p["ids"].get<std::vector<int32_t>>()) << p["name"] << " (no BOS added)";
  }
}

TEST_F(DefaultModelParity, LastPromptLogitsAndGreedyTokens) {
  const int vocab = model_->config().vocab_size;
  std::ifstream bin(kRefDir + "default_reference_logits.f32", std::ios::binary);
  ASSERT_TRUE(bin.good());
  const size_t num_prompts = (*ref_)["prompts"].size();
  std::vector<float> ref_logits(num_prompts * static_cast<size_t>(vocab));  // little-endian host assumed
  bin.read(reinterpret_cast<char*>(ref_logits.data()), static_cast<std::streamsize>(ref_logits.size() * 4));
  ASSERT_EQ(bin.gcount(), static_cast<std::streamsize>(ref_logits.size() * 4));

  for (const auto& p : (*ref_)["prompts"]) {
    const std::string name = p["name"].get<std::string>();
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> greedy = p["greedy"].get<std::vector<int32_t>>();
    const std::vector<double> margins = p["greedy_margins"].get<std::vector<double>>();
    const size_t row = p["last_logits"]["offset"].get<size_t>();

    testing::SequenceRunner runner(*model_, static_cast<int>(ids.size() + greedy.size()) + 1);
    std::vector<float> logits = runner.feed(ids, false);
    ASSERT_EQ(logits.size(), static_cast<size_t>(vocab));
    double max_abs = 0, max_diff = 0;
    for (int i = 0; i < vocab; ++i) {
      const double r = ref_logits[row * vocab + i];
      max_abs = std::max(max_abs, std::fabs(r));
      max_diff = std::max(max_diff, std::fabs(r - logits[i]));
    }
    std::printf("[default model] %-14s %3zu prompt tokens: last-position logits max |diff| %.3g (max |logit| %.3g)\n",
                name.c_str(), ids.size(), max_diff, max_abs);
    EXPECT_LE(max_diff, 1e-3 * max_abs) << name;

    std::vector<int32_t> ours;
    for (size_t s = 0; s < greedy.size(); ++s) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ours.push_back(next);
      // Teacher-force the reference token so a late near-tie does not hide later checks.
      if (s + 1 < greedy.size()) logits = runner.feed({greedy[s]}, false);
    }
    size_t agree = 0;
    while (agree < greedy.size() && ours[agree] == greedy[agree]) ++agree;
    std::printf("[default model] %-14s greedy: %zu/%zu leading tokens identical", name.c_str(), agree, greedy.size());
    if (agree < greedy.size()) std::printf(" (reference top-2 margin there: %.4f)", margins[agree]);
    std::printf("\n");
    EXPECT_GE(agree, 48u) << name;
    // Every disagreement, even after the first, must be a near-tie in the reference.
    for (size_t s = 0; s < greedy.size(); ++s) {
      if (ours[s] != greedy[s]) {
        EXPECT_LT(margins[s], 0.05) << name << " step " << s;
      }
    }
  }
}

}  // namespace
}  // namespace osprey
