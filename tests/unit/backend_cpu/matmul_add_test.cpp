// ops::Backend::matmul_add's default (the CPU backend does not fuse it):
// residual += x @ w^T equals matmul into scratch then add, bit for bit, for
// dense and quantised weights on every instruction set, and the CPU backend
// reports no fusion, so the model keeps its matmul + add_rms_norm sequence.
#include <gtest/gtest.h>

#include "test_util.h"

namespace osprey::test {
namespace {

class MatmulAddTest : public testing::TestWithParam<BackendVariant> {};

TEST_P(MatmulAddTest, DefaultEqualsMatmulThenAdd) {
  auto be = make_backend(GetParam());
  uint32_t seed = 500;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_1}) {
    for (int64_t n : {1, 3, 17}) {
      const int64_t m = 40, k = 96;
      const auto xs = random_floats(static_cast<size_t>(n * k), seed += 3);
      auto packed = pack(t, random_floats(static_cast<size_t>(m * k), seed += 3), m, k);
      const auto r0 = random_floats(static_cast<size_t>(n * m), seed += 3, -2.0f, 2.0f);
      std::vector<float> x = xs, want = r0, prod(static_cast<size_t>(n * m)), got = r0,
                         scratch(static_cast<size_t>(n * m), -9.0f);
      Tensor xt(x.data(), DType::kF32, {n, k}), wt(packed.data(), t, {m, k});
      Tensor pt(prod.data(), DType::kF32, {n, m}), wantt(want.data(), DType::kF32, {n, m});
      be->matmul(xt, wt, Tensor(), pt);
      be->add(wantt, pt);
      Tensor gt(got.data(), DType::kF32, {n, m}), st(scratch.data(), DType::kF32, {n, m});
      be->matmul_add(xt, wt, gt, st);
      const std::string what = std::string(dtype_name(t)) + " n=" + std::to_string(n);
      EXPECT_EQ(got, want) << what;
      EXPECT_EQ(scratch, prod) << what << ": the default writes the product to scratch";
      EXPECT_NE(got, r0) << what;
    }
  }
}

TEST_P(MatmulAddTest, CpuBackendReportsNoFusion) {
  auto be = make_backend(GetParam());
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) EXPECT_FALSE(be->fuses_matmul_add(t)) << dtype_name(t);
}

INSTANTIATE_TEST_SUITE_P(Variants, MatmulAddTest, testing::ValuesIn(all_variants()), variant_name);

}  // namespace
}  // namespace osprey::test
