// The engine over the default model with 8-bit activations
// (EngineConfig::quantize_activations): the integer matmul kernels are the
// same for every batch size, so each request's greedy output in a batch of
// mixed-length concurrent requests equals its output alone in that mode.
// Skipped-as-failure when the model file is absent, like engine_model_test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "osprey/engine.h"

namespace osprey {
namespace {

std::string model_path() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

constexpr int kMaxTokens = 12;

std::vector<std::string> prompts() {
  const std::string shared = "You are a helpful assistant. Answer briefly and clearly, in plain English. ";
  return {
      shared + "Tell me about the history of the printing press.",
      "Why is the sky blue?",
      shared + "How do bees make honey? Tell me about the water cycle too, and about volcanoes.",
      "Explain the rules of chess. Please also consider how to bake bread in detail, and the moon landing.",
      "Hi",
      shared + "Tell me about the moon landing. Tell me about volcanoes. Tell me about the rules of chess.",
  };
}

EngineConfig q8_config() {
  EngineConfig c;
  c.model_path = model_path();
  c.num_threads = 2;
  c.quantize_activations = true;
  c.kv_cache_bytes = int64_t{64} << 20;
  c.max_num_batched_tokens = 512;
  c.max_model_len = 1024;
  return c;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = kMaxTokens;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> collect(const std::shared_ptr<RequestStream>& s) {
  std::vector<int32_t> ids;
  while (auto out = s->next())
    for (auto& o : out->outputs) ids.insert(ids.end(), o.token_ids.begin(), o.token_ids.end());
  return ids;
}

TEST(EngineQ8ModelTest, BatchMatchesAloneWithQuantizedActivations) {
  ASSERT_TRUE(std::filesystem::exists(model_path())) << "model not found: " << model_path()
                                                     << " (run scripts/fetch_model.sh)";
  const auto ps = prompts();
  std::vector<std::vector<int32_t>> alone;
  {
    EngineConfig c = q8_config();
    c.enable_prefix_caching = false;
    auto e = Engine::create(c);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    for (const auto& text : ps) {
      Request r;
      r.prompt = text;
      r.params = greedy();
      auto s = (*e)->submit(r);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      alone.push_back(collect(*s));
    }
  }
  auto e = Engine::create(q8_config());
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& text : ps) {
    Request r;
    r.prompt = text;
    r.params = greedy();
    auto s = (*e)->submit(r);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const auto got = collect(streams[i]);
    EXPECT_EQ(got.size(), static_cast<size_t>(kMaxTokens)) << "request " << i;
    EXPECT_EQ(got, alone[i]) << "request " << i;
  }
}

}  // namespace
}  // namespace osprey
