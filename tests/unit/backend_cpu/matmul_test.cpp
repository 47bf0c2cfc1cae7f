// matmul against a double-precision reference on the exactly dequantised
// weights, for every weight dtype, GEMV and panel paths, bias on and off.
#include <gtest/gtest.h>

#include "test_util.h"

namespace osprey::test {
namespace {

class MatmulTest : public testing::TestWithParam<BackendVariant> {};

struct Shape {
  int64_t n, m, k;
};

// Runs out = x @ w^T (+bias) on the backend and compares with the reference.
void check_matmul(cpu::CpuBackend& be, DType t, Shape s, bool with_bias, uint32_t seed, double rel) {
  const auto xs = random_floats(static_cast<size_t>(s.n * s.k), seed);
  const auto ws = random_floats(static_cast<size_t>(s.m * s.k), seed + 1);
  const auto bs = random_floats(static_cast<size_t>(s.m), seed + 2);
  auto packed = pack(t, ws, s.m, s.k);
  const auto wd = unpack(t, packed, s.m, s.k);
  std::vector<double> ref(static_cast<size_t>(s.n * s.m));
  for (int64_t i = 0; i < s.n; ++i) {
    for (int64_t j = 0; j < s.m; ++j) {
      double acc = with_bias ? bs[static_cast<size_t>(j)] : 0.0;
      for (int64_t c = 0; c < s.k; ++c)
        acc += static_cast<double>(xs[static_cast<size_t>(i * s.k + c)]) * wd[static_cast<size_t>(j * s.k + c)];
      ref[static_cast<size_t>(i * s.m + j)] = acc;
    }
  }
  std::vector<float> out(static_cast<size_t>(s.n * s.m), -7.0f);
  auto x = const_cast<float*>(xs.data());
  Tensor xt(x, DType::kF32, {s.n, s.k});
  Tensor wt(packed.data(), t, {s.m, s.k});
  Tensor bt = with_bias ? Tensor(const_cast<float*>(bs.data()), DType::kF32, {s.m}) : Tensor();
  Tensor ot(out.data(), DType::kF32, {s.n, s.m});
  be.matmul(xt, wt, bt, ot);
  expect_close(out, ref, rel,
               std::string(dtype_name(t)) + " n=" + std::to_string(s.n) + " m=" + std::to_string(s.m) +
                   " k=" + std::to_string(s.k) + (with_bias ? " bias" : ""));
}

constexpr DType kAllWeightTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1};

TEST_P(MatmulTest, AllDtypesDefaultPaths) {
  auto be = make_backend(GetParam());
  uint32_t seed = 100;
  for (DType t : kAllWeightTypes) {
    for (Shape s : {Shape{1, 37, 64}, Shape{1, 576, 576}, Shape{2, 19, 160}, Shape{3, 50, 96}, Shape{4, 33, 32},
                    Shape{5, 17, 128}, Shape{37, 45, 192}, Shape{37, 16, 1536}, Shape{128, 70, 64}}) {
      for (bool bias : {false, true}) check_matmul(*be, t, s, bias, seed++, 1e-5);
    }
  }
}

TEST_P(MatmulTest, PlainDtypesOddK) {
  auto be = make_backend(GetParam());
  uint32_t seed = 300;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Shape s :
         {Shape{1, 7, 1}, Shape{1, 9, 7}, Shape{2, 5, 45}, Shape{3, 13, 21}, Shape{37, 11, 45}, Shape{9, 3, 17}}) {
      for (bool bias : {false, true}) check_matmul(*be, t, s, bias, seed++, 1e-5);
    }
  }
}

// Forces every row count through the GEMV kernels and through the panel
// kernels with odd panel sizes, so both paths see remainders.
TEST_P(MatmulTest, ForcedPaths) {
  auto be = make_backend(GetParam());
  uint32_t seed = 500;
  for (int gemv_max : {0, 64}) {
    be->set_gemv_max_rows(gemv_max);
    for (int panel : {1, 5, 16}) {
      be->set_panel_rows(panel);
      for (DType t : kAllWeightTypes) {
        for (Shape s : {Shape{1, 23, 64}, Shape{6, 9, 96}, Shape{37, 21, 32}})
          check_matmul(*be, t, s, true, seed++, 1e-5);
      }
    }
  }
}

// Batched-decode row counts through the panel kernels: every remainder of
// the activation-row tiling (AVX2 groups of 3, AVX-512 groups of 6) and
// panels whose row count is not a multiple of the 4-row tile.
TEST_P(MatmulTest, PanelRowRemainders) {
  auto be = make_backend(GetParam());
  be->set_gemv_max_rows(0);
  uint32_t seed = 700;
  for (DType t : {DType::kQ4_1, DType::kQ8_0, DType::kF32}) {
    for (int64_t n = 1; n <= 13; ++n) check_matmul(*be, t, Shape{n, 22, 96}, n % 2 == 0, seed++, 1e-5);
    check_matmul(*be, t, Shape{32, 48, 576}, false, seed++, 1e-5);
  }
}

TEST_P(MatmulTest, LongRowsRelativeTolerance) {
  auto be = make_backend(GetParam());
  uint32_t seed = 900;
  for (DType t : {DType::kQ4_1, DType::kQ8_0, DType::kF32}) {
    check_matmul(*be, t, Shape{1, 64, 4096}, false, seed++, 2e-5);
    check_matmul(*be, t, Shape{20, 24, 4096}, false, seed++, 2e-5);
  }
}

TEST_P(MatmulTest, ZeroRowsIsANoOp) {
  auto be = make_backend(GetParam());
  std::vector<float> w(32 * 4, 1.0f);
  Tensor xt(w.data(), DType::kF32, {0, 32});
  Tensor wt(w.data(), DType::kF32, {4, 32});
  Tensor ot(w.data(), DType::kF32, {0, 4});
  be->matmul(xt, wt, Tensor(), ot);
  EXPECT_EQ(w[0], 1.0f);
}

INSTANTIATE_TEST_SUITE_P(Variants, MatmulTest, testing::ValuesIn(all_variants()), variant_name);

// The AVX2 and scalar kernels agree closely with each other on the same inputs.
TEST(MatmulCrossIsa, Avx2MatchesScalar) {
  if (cpu::avx2_kernels() == nullptr) GTEST_SKIP() << "CPU without AVX2";
  auto scalar = make_backend({cpu::Isa::kScalar, 1});
  auto avx2 = make_backend({cpu::Isa::kAvx2, 2});
  const int64_t n = 3, m = 41, k = 576;
  const auto xs = random_floats(static_cast<size_t>(n * k), 7);
  const auto ws = random_floats(static_cast<size_t>(m * k), 8);
  for (DType t : kAllWeightTypes) {
    auto packed = pack(t, ws, m, k);
    std::vector<float> a(static_cast<size_t>(n * m)), b(static_cast<size_t>(n * m));
    Tensor xt(const_cast<float*>(xs.data()), DType::kF32, {n, k});
    Tensor wt(packed.data(), t, {m, k});
    Tensor at(a.data(), DType::kF32, {n, m}), bt(b.data(), DType::kF32, {n, m});
    scalar->matmul(xt, wt, Tensor(), at);
    avx2->matmul(xt, wt, Tensor(), bt);
    std::vector<double> ad(a.begin(), a.end());
    expect_close(b, ad, 1e-5, std::string("avx2 vs scalar ") + std::string(dtype_name(t)));
    if (cpu::avx512_kernels() != nullptr) {
      auto avx512 = make_backend({cpu::Isa::kAvx512, 2});
      std::vector<float> c(static_cast<size_t>(n * m));
      Tensor ct(c.data(), DType::kF32, {n, m});
      avx512->matmul(xt, wt, Tensor(), ct);
      expect_close(c, ad, 1e-5, std::string("avx512 vs scalar ") + std::string(dtype_name(t)));
    }
  }
}

}  // namespace
}  // namespace osprey::test
