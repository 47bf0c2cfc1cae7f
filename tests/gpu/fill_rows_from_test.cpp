// fill_rows_from on CUDA against the CPU backend: only the rows with an index
// >= 0 are written (the others keep their contents), I32 token ids as the
// engine's token fills use them, float rows, and rows of an odd byte width.
#include <random>

#include "gpu_test_util.h"

namespace osprey::gpu_test {
namespace {

class FillRowsFromTest : public GpuTest {};

// x [m, d] and out [n, d] of dtype t with `bytes` per row; src [n] (-1: keep).
void check_fill(ops::Backend& gpu, ops::Backend& cpu, DType t, int64_t m, int64_t n, int64_t d,
                const std::vector<int32_t>& src, uint32_t seed) {
  const int64_t rb = dtype_row_bytes(t, d);
  std::mt19937 rng(seed);
  std::vector<uint8_t> x(static_cast<size_t>(m * rb)), out(static_cast<size_t>(std::max<int64_t>(n, 1) * rb));
  for (auto& b : x) b = static_cast<uint8_t>(rng());
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> ref = out;
  Tensor cx(x.data(), t, {m, d}), co(ref.data(), t, {n, d});
  cpu.fill_rows_from(cx, src.data(), static_cast<int>(n), co);
  // The reference itself: filled rows copied, the rest untouched.
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* want =
        src[static_cast<size_t>(r)] >= 0 ? x.data() + src[static_cast<size_t>(r)] * rb : out.data() + r * rb;
    ASSERT_EQ(0, std::memcmp(ref.data() + r * rb, want, static_cast<size_t>(rb))) << "cpu row " << r;
  }
  DeviceMem gx = upload(gpu, x), go = upload(gpu, out), gs = upload(gpu, src);
  Tensor tx(gx.get(), t, {m, d}, Device::kCuda), to(go.get(), t, {n, d}, Device::kCuda);
  gpu.fill_rows_from(tx, gs.as<int32_t>(), static_cast<int>(n), to);
  const auto got = download<uint8_t>(gpu, go, out.size());
  for (int64_t r = 0; r < n; ++r)
    EXPECT_EQ(0, std::memcmp(got.data() + r * rb, ref.data() + r * rb, static_cast<size_t>(rb)))
        << dtype_name(t) << " d=" << d << " row " << r << " (src " << src[static_cast<size_t>(r)] << ")";
}

TEST_F(FillRowsFromTest, TokenIdsOnlyFilledRowsWritten) {
  // The engine's shape: sampled ids [M, 1] into token_ids [T, 1].
  check_fill(gpu(), cpu(), DType::kI32, 64, 0, 1, {}, 1);
  check_fill(gpu(), cpu(), DType::kI32, 64, 1, 1, {-1}, 2);
  check_fill(gpu(), cpu(), DType::kI32, 64, 1, 1, {63}, 3);
  check_fill(gpu(), cpu(), DType::kI32, 64, 5, 1, {3, -1, -1, 0, 3}, 4);
  std::mt19937 rng(9);
  for (int64_t n : {7, 256, 2048}) {
    std::vector<int32_t> src(static_cast<size_t>(n));
    for (auto& s : src) s = rng() % 3 == 0 ? -1 : static_cast<int32_t>(rng() % 512);
    check_fill(gpu(), cpu(), DType::kI32, 512, n, 1, src, static_cast<uint32_t>(n));
  }
}

TEST_F(FillRowsFromTest, WideAndOddRows) {
  const std::vector<int32_t> src = {4, -1, 0, 9, -1, 4};
  check_fill(gpu(), cpu(), DType::kF32, 10, 6, 77, src, 11);
  check_fill(gpu(), cpu(), DType::kBF16, 10, 6, 4096, src, 12);
  check_fill(gpu(), cpu(), DType::kQ8_0, 10, 6, 32, src, 13);  // 34-byte rows: byte copies
}

TEST_F(FillRowsFromTest, AllRowsKeptWhenNoneFilled) {
  check_fill(gpu(), cpu(), DType::kF32, 3, 33, 16, std::vector<int32_t>(33, -1), 21);
}

}  // namespace
}  // namespace osprey::gpu_test
