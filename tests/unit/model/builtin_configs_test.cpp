#include "model/builtin_configs.h"

#include <gtest/gtest.h>

#include "model/model_config.h"

namespace osprey {
namespace {

TEST(BuiltinConfigs, EveryConfigParsesAndValidates) {
  const auto names = builtin_model_config_names();
  ASSERT_GE(names.size(), 4u);
  for (const auto& name : names) {
    auto text = builtin_model_config(name);
    ASSERT_TRUE(text.has_value()) << name;
    auto c = model_config_from_hf_json(std::string(*text), name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().message();
    EXPECT_TRUE(c->validate().ok()) << name;
  }
}

TEST(BuiltinConfigs, PublishedParameterCounts) {
  auto params = [](const char* name) {
    auto c = model_config_from_hf_json(std::string(*builtin_model_config(name)), name);
    EXPECT_TRUE(c.ok());
    return static_cast<double>(c->num_parameters());
  };
  EXPECT_NEAR(params("llama-3-8b") / 1e9, 8.03, 0.01);
  EXPECT_NEAR(params("llama-3-70b") / 1e9, 70.55, 0.05);
  EXPECT_NEAR(params("qwen2.5-7b") / 1e9, 7.62, 0.01);  // incl. qkv biases
  EXPECT_NEAR(params("mistral-7b") / 1e9, 7.24, 0.01);
  EXPECT_NEAR(params("llama-3.2-1b") / 1e9, 1.24, 0.01);
  EXPECT_NEAR(params("smollm2-135m") / 1e6, 134.5, 0.5);
}

TEST(BuiltinConfigs, LookupIsCaseInsensitiveAndRejectsUnknown) {
  EXPECT_TRUE(builtin_model_config("Llama-3-8B").has_value());
  EXPECT_FALSE(builtin_model_config("llama-3-8").has_value());
  EXPECT_FALSE(builtin_model_config("").has_value());
  auto c = model_config_from_hf_json(std::string(*builtin_model_config("mistral-7b")), "m");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->architecture, "mistral");
  auto q = model_config_from_hf_json(std::string(*builtin_model_config("qwen2.5-7b")), "q");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(q->head_dim, 128);
}

}  // namespace
}  // namespace osprey
