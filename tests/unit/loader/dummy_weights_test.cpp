// read_dummy_config (config sources and errors) and dummy_fill (ranges, seeds).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "loader/dummy_weights.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;

class DummyConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("osprey_dummy_cfg_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_F(DummyConfigTest, ReadsAFileOrAFolderWithConfigJson) {
  std::ofstream(dir_ / "config.json") << R"({"model_type": "llama"})";
  for (const fs::path& p : {dir_, dir_ / "config.json"}) {
    auto c = read_dummy_config(p.string());
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->json, R"({"model_type": "llama"})");
    EXPECT_EQ(fs::path(c->origin), dir_ / "config.json");
  }
}

TEST_F(DummyConfigTest, MissingOrEmptyConfigsAreClearErrors) {
  auto none = read_dummy_config((dir_ / "absent").string());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("bundled config name"), std::string::npos);

  auto folder = read_dummy_config(dir_.string());  // no config.json inside
  ASSERT_FALSE(folder.ok());
  EXPECT_EQ(folder.status().code(), StatusCode::kNotFound);

  std::ofstream(dir_ / "empty.json").flush();
  auto empty = read_dummy_config((dir_ / "empty.json").string());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
}

TEST(DummyFillTest, RangesBySuffixAndSeedsByNameAndModelSeed) {
  const float a = kDummyStd * std::sqrt(3.0f);
  const DummyFill w = dummy_fill("model.layers.3.mlp.down_proj.weight", 0);
  EXPECT_FLOAT_EQ(w.lo, -a);
  EXPECT_FLOAT_EQ(w.hi, a);
  const DummyFill n = dummy_fill("model.norm.weight", 0);
  EXPECT_EQ(n.lo, 1.0f);
  EXPECT_EQ(n.hi, 1.0f);
  const DummyFill qn = dummy_fill("model.layers.0.self_attn.q_norm.weight", 0);
  EXPECT_EQ(qn.lo, 1.0f);
  const DummyFill b = dummy_fill("model.layers.0.self_attn.k_proj.bias", 0);
  EXPECT_FLOAT_EQ(b.lo, -0.01f);
  EXPECT_FLOAT_EQ(b.hi, 0.01f);
  // Deterministic, and different per name and per model seed.
  EXPECT_EQ(w.seed, dummy_fill("model.layers.3.mlp.down_proj.weight", 0).seed);
  EXPECT_NE(w.seed, dummy_fill("model.layers.4.mlp.down_proj.weight", 0).seed);
  EXPECT_NE(w.seed, dummy_fill("model.layers.3.mlp.down_proj.weight", 1).seed);
}

}  // namespace
}  // namespace osprey
