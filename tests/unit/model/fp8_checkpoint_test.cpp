// FP8 checkpoints (F8_E4M3 projections with a weight_scale of one value a
// matrix, one a row or one a block, or a block-wise weight_scale_inv) on the
// CPU: dequantised at load (code * scale, F32), so the logits equal those of
// the same checkpoint with the projections stored dequantised, bit for bit;
// the scale layouts osprey does not load are refused by name.
// (On the GPU the projections stay FP8: tests/gpu/model_parity_test.cpp.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "../loader/fp8_checkpoint.h"
#include "model/model.h"
#include "ops/backend.h"
#include "sequence_runner.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;

class Fp8CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("osprey_fp8ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    backend_ = ops::make_cpu_backend(2);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string source() const { return std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/llama_bf16"; }
  std::vector<float> logits(Model& m, const std::vector<int32_t>& ids) {
    testing::SequenceRunner run(m, 48);
    return run.feed(ids, true);
  }

  fs::path dir_;
  std::unique_ptr<ops::Backend> backend_;
};

const std::vector<int32_t> kIds = {5, 77, 301, 12, 9, 450, 33, 2, 160, 88, 17};

TEST_F(Fp8CheckpointTest, CpuLogitsEqualTheDequantisedCheckpoint) {
  for (auto scales : {testing::Fp8Scales::kScalar, testing::Fp8Scales::kOneElement, testing::Fp8Scales::kPerChannel,
                      testing::Fp8Scales::kPerBlock, testing::Fp8Scales::kBlockInv}) {
    fs::remove_all(dir_);
    std::string why;
    ASSERT_TRUE(testing::make_fp8_checkpoint(source(), dir_ / "fp8", dir_ / "deq", scales, &why)) << why;
    auto fp8 = Model::load((dir_ / "fp8").string(), *backend_);
    ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
    auto deq = Model::load((dir_ / "deq").string(), *backend_);
    ASSERT_TRUE(deq.ok()) << deq.status().to_string();
    bool has_f8 = false;
    for (const auto& [name, count] : (*fp8)->weight_dtype_counts()) has_f8 |= name == "F8_E4M3" && count == 14;
    EXPECT_TRUE(has_f8) << "2 layers x 7 projections stored as F8_E4M3";
    const auto a = logits(**fp8, kIds), b = logits(**deq, kIds);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(a, b) << "the FP8 checkpoint is not its dequantised twin (layout " << static_cast<int>(scales) << ")";
    // The quantisation is real and small: against the BF16 original.
    auto orig = Model::load(source(), *backend_);
    ASSERT_TRUE(orig.ok()) << orig.status().to_string();
    const auto c = logits(**orig, kIds);
    double num = 0, den = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      num += (a[i] - c[i]) * (a[i] - c[i]);
      den += c[i] * c[i];
    }
    EXPECT_GT(num, 0.0);
    EXPECT_LT(num / den, 2e-2) << "NMSE against the BF16 weights";
  }
}

TEST_F(Fp8CheckpointTest, RefusesOtherScaleLayoutsByName) {
  struct Case {
    testing::Fp8Scales scales;
    const char* message;
  };
  for (const Case& c :
       {Case{testing::Fp8Scales::kBadGrid, "weight_scale_inv' has shape [3, 5] for a [64, 64] F8_E4M3 matrix"},
        Case{testing::Fp8Scales::kMissing, "has no weight_scale (or weight_scale_inv) tensor"},
        Case{testing::Fp8Scales::kNonFinite, "expected finite positive scales"}}) {
    fs::remove_all(dir_);
    std::string why;
    ASSERT_TRUE(testing::make_fp8_checkpoint(source(), dir_, "", c.scales, &why)) << why;
    auto m = Model::load(dir_.string(), *backend_);
    ASSERT_FALSE(m.ok()) << c.message;
    EXPECT_EQ(m.status().code(), StatusCode::kCorrupt) << m.status().to_string();
    EXPECT_NE(m.status().message().find(c.message), std::string::npos) << m.status().to_string();
  }
}

}  // namespace
}  // namespace osprey
