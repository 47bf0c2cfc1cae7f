// quantize_row / dequantize_row: round trip within each format's step size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
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

// ---- F8_E4M3 -----------------------------------------------------------------

// Re-rounding codes to a larger common scale (FP8 checkpoints' fused and
// per-row-scaled matrices): every code of the format under ratios 1, 1/2
// (exact while the value stays normal) and 0.3 (within half a step of the
// value), per row and for all rows, in place too.
TEST(F8E4M3, RescaleRowsToACommonScale) {
  const int64_t cols = 254;  // every code but the two NaNs
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) != 0x7f) codes.push_back(static_cast<uint8_t>(c));
  }
  ASSERT_EQ(static_cast<int64_t>(codes.size()), cols);
  std::vector<uint8_t> src;
  for (int r = 0; r < 3; ++r) src.insert(src.end(), codes.begin(), codes.end());
  const float scales[3] = {2.0f, 1.0f, 0.6f};  // to_scale 2: ratios 1, 1/2, 0.3
  auto half_step = [](double t) {
    const double a = std::fabs(t);
    return a < std::ldexp(1.0, -6) ? std::ldexp(1.0, -10)
                                   : std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 4);
  };
  for (bool in_place : {false, true}) {
    std::vector<uint8_t> dst(src.size(), 0xaa);
    if (in_place) dst = src;
    f8e4m3_rescale_rows(in_place ? dst.data() : src.data(), 3, cols, scales, true, 2.0f, dst.data());
    for (int64_t i = 0; i < cols; ++i) {
      const auto u = static_cast<size_t>(i);
      const double v = f8e4m3_to_f32(codes[u]);
      ASSERT_EQ(dst[u], codes[u]) << "ratio 1, code " << int{codes[u]};
      const double half = f8e4m3_to_f32(dst[u + cols]);
      if (std::fabs(v / 2) >= std::ldexp(1.0, -6) || v == 0) {
        ASSERT_EQ(half, v / 2) << "ratio 1/2, code " << int{codes[u]};
      } else {
        ASSERT_LE(std::fabs(half - v / 2), half_step(v / 2)) << "ratio 1/2, code " << int{codes[u]};
      }
      const double t = v * static_cast<double>(0.6f / 2.0f);
      ASSERT_LE(std::fabs(f8e4m3_to_f32(dst[u + 2 * cols]) - t), half_step(t) * 1.0001)
          << "ratio 0.3, code " << int{codes[u]};
    }
  }
  // One scale for all rows.
  std::vector<uint8_t> dst(src.size());
  f8e4m3_rescale_rows(src.data(), 3, cols, scales + 1, false, 2.0f, dst.data());
  for (size_t i = 0; i < src.size(); ++i) {
    const double v = f8e4m3_to_f32(src[i]);
    if (std::fabs(v / 2) >= std::ldexp(1.0, -6)) {
      ASSERT_EQ(f8e4m3_to_f32(dst[i]), v / 2) << i;
    }
  }
}

TEST(F8E4M3, DecodesTheFormat) {
  EXPECT_EQ(f8e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(f8e4m3_to_f32(0x80)));
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(f8e4m3_to_f32(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x39), 1.125f);
  EXPECT_EQ(f8e4m3_to_f32(0xb8), -1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x70), 128.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), kF8E4M3Max);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xff)));
  EXPECT_EQ(f8e4m3_to_f32(0x78), 256.0f);  // exponent 15 is finite in E4M3 (only mantissa 7 is NaN)
}

// Every finite code encodes back to itself.
TEST(F8E4M3, RoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

// Against a search over the decode table: the nearest finite value, ties to
// the even code; magnitudes above 448 saturate; NaN -> 0x7f.
TEST(F8E4M3, RoundsToNearestEvenAndSaturates) {
  auto reference = [](float x) -> uint8_t {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const float a = std::fabs(x);
    if (a >= 448.0f) return sign | 0x7e;
    int best = 0;
    for (int c = 1; c <= 0x7e; ++c) {
      const float dc = std::fabs(f8e4m3_to_f32(static_cast<uint8_t>(c)) - a);
      const float db = std::fabs(f8e4m3_to_f32(static_cast<uint8_t>(best)) - a);
      if (dc < db || (dc == db && (c & 1) == 0)) best = c;
    }
    return sign | static_cast<uint8_t>(best);
  };
  // Every midpoint between neighbouring codes, and just either side of it.
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = f8e4m3_to_f32(static_cast<uint8_t>(c)), hi = f8e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f), -mid}) {
      EXPECT_EQ(f32_to_f8e4m3(x), reference(x)) << "x = " << x;
    }
    EXPECT_EQ(f32_to_f8e4m3(mid), (c % 2 == 0) ? c : c + 1) << "tie between codes " << c << " and " << c + 1;
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-500.0f, 500.0f);
  std::uniform_real_distribution<float> small(-0.05f, 0.05f);
  for (int i = 0; i < 20000; ++i) {
    const float x = i % 2 ? u(rng) : small(rng);
    ASSERT_EQ(f32_to_f8e4m3(x), reference(x)) << "x = " << x;
  }
  EXPECT_EQ(f32_to_f8e4m3(449.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
}

TEST(F8E4M3, RowHelpersAndWeightLayout) {
  const std::vector<float> x = {0.0f, 1.0f, -2.5f, 448.0f, 1000.0f, 0.001f, -0.3f, 17.0f};
  std::vector<uint8_t> q(x.size());
  quantize_row(DType::kF8E4M3, x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  dequantize_row(DType::kF8E4M3, q.data(), y.data(), static_cast<int64_t>(x.size()));
  const std::vector<float> want = {0.0f, 1.0f, -2.5f, 448.0f, 448.0f, 0.001953125f, -0.3125f, 16.0f};
  EXPECT_EQ(y, want);
  EXPECT_EQ(dtype_row_bytes(DType::kF8E4M3, 4096), 4096);
  EXPECT_FALSE(dtype_is_quantized(DType::kF8E4M3));
  EXPECT_EQ(dtype_name(DType::kF8E4M3), "F8_E4M3");
  EXPECT_FALSE(dtype_from_name("F8_E4M3").has_value());  // not accepted from files
  EXPECT_EQ(fp8_scale_offset(3, 5), 256);
  EXPECT_EQ(fp8_scale_offset(4096, 4096), 4096 * 4096);
  EXPECT_EQ(fp8_weight_bytes(4096, 4096), 4096 * 4096 + 256);
}

// int8_row_quantize (INT8 KV pages): s = amax / 127, q = x / s to the
// nearest integer with ties to even, |x - s q| <= s / 2, the largest
// magnitude at +-127; zero rows give s = 0; a NaN or infinity makes the
// whole row NaN on reading (s NaN, q 0).
TEST(I8Row, QuantizesWithTheRowsOwnScale) {
  {
    const std::vector<float> x = {127.0f, 63.5f, -0.5f, 1.5f, 0.0f, -127.0f, 2.5f, -64.5f};
    std::vector<int8_t> q(x.size(), 99);
    EXPECT_EQ(int8_row_quantize(x.data(), static_cast<int64_t>(x.size()), q.data()), 1.0f);
    const std::vector<int8_t> want = {127, 64, 0, 2, 0, -127, 2, -64};  // ties to even
    EXPECT_EQ(q, want);
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 130;
    const float mag = std::ldexp(1.0f, trial % 40 - 20);
    std::uniform_real_distribution<float> d(-mag, mag);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = d(rng);
    std::vector<int8_t> q(x.size());
    const float s = int8_row_quantize(x.data(), n, q.data());
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    ASSERT_EQ(s, amax / 127.0f);
    int top = 0;
    for (int i = 0; i < n; ++i) {
      const float xi = x[static_cast<size_t>(i)];
      const int qi = q[static_cast<size_t>(i)];
      ASSERT_GE(qi, -127);
      ASSERT_EQ(static_cast<float>(qi), std::nearbyint(xi / s)) << i;
      ASSERT_LE(std::fabs(xi - s * static_cast<float>(qi)), 0.5f * s * (1.0f + 1e-5f)) << i;
      top = std::max(top, std::abs(qi));
    }
    EXPECT_EQ(top, kI8RowMax);
  }
  std::vector<float> zeros(16, 0.0f);
  std::vector<int8_t> q(16, 5);
  EXPECT_EQ(int8_row_quantize(zeros.data(), 16, q.data()), 0.0f);
  EXPECT_EQ(q, std::vector<int8_t>(16, 0));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = {1.0f, 2.0f, bad, 3.0f};
    std::vector<int8_t> r(4, 5);
    EXPECT_TRUE(std::isnan(int8_row_quantize(x.data(), 4, r.data())));
    EXPECT_EQ(r, std::vector<int8_t>(4, 0));
  }
  // The plain I8 row helpers: values as integers, no scale.
  const std::vector<float> v = {0.4f, -1.6f, 300.0f, -300.0f, 2.5f};
  std::vector<int8_t> c(v.size());
  quantize_row(DType::kI8, v.data(), c.data(), static_cast<int64_t>(v.size()));
  std::vector<float> back(v.size());
  dequantize_row(DType::kI8, c.data(), back.data(), static_cast<int64_t>(v.size()));
  EXPECT_EQ(back, (std::vector<float>{0.0f, -2.0f, 127.0f, -127.0f, 2.0f}));
  EXPECT_EQ(dtype_row_bytes(DType::kI8, 128), 128);
  EXPECT_EQ(dtype_name(DType::kI8), "I8");
  EXPECT_FALSE(dtype_from_name("I8").has_value());  // not accepted from files
}

}  // namespace
}  // namespace osprey
