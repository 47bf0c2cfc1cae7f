// quantize_row / dequantize_row: round trip within each format's step size.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace osprey {
namespace {

TEST(Quantize, RoundTripWithinHalfAStep) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-3.0f, 2.0f);
  const int64_t cols = 96;
  std::vector<float> x(cols), y(cols);
  for (auto& v : x) v = dist(rng);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    std::vector<uint8_t> packed(static_cast<size_t>(dtype_row_bytes(t, cols)));
    quantize_row(t, x.data(), packed.data(), cols);
    dequantize_row(t, packed.data(), y.data(), cols);
    for (int64_t b = 0; b < cols / kQuantBlock; ++b) {
      float mn = x[b * 32], mx = x[b * 32], amax = 0;
      for (int j = 0; j < 32; ++j) {
        mn = std::min(mn, x[b * 32 + j]);
        mx = std::max(mx, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      float tol = 0;  // F32 is exact
      if (t == DType::kF16) tol = amax * 1e-3f;
      if (t == DType::kBF16) tol = amax * 8e-3f;
      if (t == DType::kQ8_0) tol = amax / 127.0f * 0.5f + amax * 1e-3f;  // + fp16 scale rounding
      if (t == DType::kQ4_0) tol = amax / 8.0f * 0.5f + amax * 1e-2f;
      if (t == DType::kQ4_1) tol = (mx - mn) / 15.0f * 0.5f + amax * 1e-2f;
      for (int j = 0; j < 32; ++j) {
        EXPECT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), tol) << dtype_name(t) << " element " << b * 32 + j;
      }
    }
  }
}

TEST(Quantize, ZeroBlockStaysZero) {
  std::vector<float> x(32, 0.0f), y(32, 1.0f);
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    std::vector<uint8_t> packed(static_cast<size_t>(dtype_row_bytes(t, 32)));
    quantize_row(t, x.data(), packed.data(), 32);
    dequantize_row(t, packed.data(), y.data(), 32);
    for (float v : y) EXPECT_EQ(v, 0.0f) << dtype_name(t);
  }
}

}  // namespace
}  // namespace osprey
