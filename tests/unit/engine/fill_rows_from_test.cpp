// ops::Backend::fill_rows_from on the CPU backend: the op that writes the
// sampled ids of step N into step N + 1's token ids (asynchronous scheduling,
// ModelExecutor): only rows with an index >= 0 are written.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ops/backend.h"

namespace osprey {
namespace {

TEST(FillRowsFrom, WritesOnlyFilledRows) {
  auto be = ops::make_cpu_backend(1);
  std::vector<int32_t> sampled = {70, 71, 72, 73};
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> src = {-1, 3, -1, 0, 0, -1};
  Tensor x(sampled.data(), DType::kI32, {4, 1}), out(tokens.data(), DType::kI32, {6, 1});
  be->fill_rows_from(x, src.data(), 6, out);
  EXPECT_EQ(tokens, (std::vector<int32_t>{1, 73, 3, 70, 70, 6}));
  // num_rows limits the rows looked at.
  const std::vector<int32_t> src2 = {2, 2, 2, 2, 2, 2};
  be->fill_rows_from(x, src2.data(), 2, out);
  EXPECT_EQ(tokens, (std::vector<int32_t>{72, 72, 3, 70, 70, 6}));
  be->fill_rows_from(x, src2.data(), 0, out);
  EXPECT_EQ(tokens, (std::vector<int32_t>{72, 72, 3, 70, 70, 6}));
}

TEST(FillRowsFrom, RandomWideRowsMatchReference) {
  auto be = ops::make_cpu_backend(1);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t m = 1 + rng() % 9, n = rng() % 12, d = 1 + rng() % 40;
    std::vector<float> x(static_cast<size_t>(m * d)), out(static_cast<size_t>(std::max<int64_t>(n, 1) * d));
    for (auto& v : x) v = static_cast<float>(rng() % 1000);
    for (auto& v : out) v = -static_cast<float>(rng() % 1000);
    std::vector<int32_t> src(static_cast<size_t>(n));
    for (auto& s : src) s = rng() % 2 ? -1 : static_cast<int32_t>(rng() % m);
    std::vector<float> ref = out;
    for (int64_t r = 0; r < n; ++r)
      if (src[r] >= 0) std::memcpy(&ref[r * d], &x[src[r] * d], d * sizeof(float));
    Tensor tx(x.data(), DType::kF32, {m, d}), to(out.data(), DType::kF32, {n, d});
    be->fill_rows_from(tx, src.data(), static_cast<int>(n), to);
    EXPECT_EQ(out, ref) << "trial " << trial;
  }
}

TEST(FillRowsFromDeathTest, RejectsOverlapAndBadRows) {
  auto be = ops::make_cpu_backend(1);
  std::vector<int32_t> buf(8, 0);
  const std::vector<int32_t> src = {0, 5};
  Tensor x(buf.data(), DType::kI32, {4, 1}), out(buf.data() + 2, DType::kI32, {2, 1});
  EXPECT_DEATH(be->fill_rows_from(x, src.data(), 2, out), "overlap");
  Tensor x2(buf.data(), DType::kI32, {4, 1}), out2(buf.data() + 4, DType::kI32, {2, 1});
  EXPECT_DEATH(be->fill_rows_from(x2, src.data(), 2, out2), "out of range");
}

}  // namespace
}  // namespace osprey
