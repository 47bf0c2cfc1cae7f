// CUDA matmul against a double-precision reference on the exactly
// dequantised weights: every weight dtype, the GEMV, cuBLAS and dequantised
// panel paths (row counts either side of each threshold), bias on and off,
// odd k and unaligned activations.
#include "gpu_test_util.h"

namespace osprey::gpu_test {
namespace {

struct Shape {
  int64_t n, m, k;
};

// NMSE bounds by path: fp32 throughout, or activations rounded to 16 bits.
constexpr double kFp32Nmse = 1e-11;
constexpr double kF16ActNmse = 1e-6;   // 11-bit mantissa: ~(2^-11)^2 / 3 per product
constexpr double kBf16ActNmse = 3e-5;  // 8-bit mantissa

std::string shape_tag(DType t, Shape s, bool bias, int64_t x_offset) {
  return std::string(dtype_name(t)) + " n=" + std::to_string(s.n) + " m=" + std::to_string(s.m) +
         " k=" + std::to_string(s.k) + (bias ? " bias" : "") + (x_offset ? " unaligned x" : "");
}

// x_offset > 0 places x that many floats into its buffer (unaligned rows).
void check_matmul(ops::Backend& be, DType t, Shape s, bool with_bias, uint32_t seed, double max_nmse,
                  int64_t x_offset = 0) {
  const auto xs = random_floats(static_cast<size_t>(s.n * s.k + x_offset), seed);
  const auto ws = random_floats(static_cast<size_t>(s.m * s.k), seed + 1);
  const auto bs = random_floats(static_cast<size_t>(s.m), seed + 2);
  const auto packed = pack(t, ws, s.m, s.k);
  const auto wd = unpack(t, packed, s.m, s.k);
  std::vector<double> ref(static_cast<size_t>(s.n * s.m));
  for (int64_t i = 0; i < s.n; ++i) {
    for (int64_t j = 0; j < s.m; ++j) {
      double acc = with_bias ? bs[static_cast<size_t>(j)] : 0.0;
      for (int64_t c = 0; c < s.k; ++c) {
        acc +=
            static_cast<double>(xs[static_cast<size_t>(x_offset + i * s.k + c)]) * wd[static_cast<size_t>(j * s.k + c)];
      }
      ref[static_cast<size_t>(i * s.m + j)] = acc;
    }
  }
  DeviceMem gx = upload(be, xs), gw = upload(be, packed), gb = upload(be, bs);
  DeviceMem go(be, static_cast<size_t>(std::max<int64_t>(1, s.n * s.m)) * 4);
  Tensor xt(gx.as<float>() + x_offset, DType::kF32, {s.n, s.k}, Device::kCuda);
  Tensor wt(gw.get(), t, {s.m, s.k}, Device::kCuda);
  Tensor bt = with_bias ? Tensor(gb.get(), DType::kF32, {s.m}, Device::kCuda) : Tensor();
  Tensor ot(go.get(), DType::kF32, {s.n, s.m}, Device::kCuda);
  be.matmul(xt, wt, bt, ot);
  const auto out = download<float>(be, go, static_cast<size_t>(s.n * s.m));
  const ErrorStats e = error_stats(out.data(), ref.data(), out.size());
  EXPECT_LE(e.nmse, max_nmse) << shape_tag(t, s, with_bias, x_offset) << " max rel " << e.max_rel;
}

constexpr DType kAllTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1};

double nmse_bound(DType t, int64_t n, bool exact) {
  // F16/BF16 with more than 8 rows go through cuBLAS on converted activations.
  if (!exact && n > 8 && t == DType::kF16) return kF16ActNmse;
  if (!exact && n > 8 && t == DType::kBF16) return kBf16ActNmse;
  return kFp32Nmse;
}

class MatmulTest : public GpuTest {};

TEST_F(MatmulTest, AllDtypesAcrossPathThresholds) {
  uint32_t seed = 1000;
  for (DType t : kAllTypes) {
    for (int64_t n : {1, 2, 7, 8, 9, 16, 31, 32, 33, 70}) {
      for (Shape mk : {Shape{0, 37, 64}, Shape{0, 576, 576}, Shape{0, 19, 160}, Shape{0, 256, 1536}}) {
        const Shape s{n, mk.m, mk.k};
        for (bool bias : {false, true}) check_matmul(gpu(), t, s, bias, seed += 3, nmse_bound(t, n, false));
      }
    }
  }
}

TEST_F(MatmulTest, DenseOddKAndUnalignedActivations) {
  uint32_t seed = 2000;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Shape s : {Shape{1, 7, 1}, Shape{1, 9, 7}, Shape{2, 5, 45}, Shape{3, 13, 21}, Shape{9, 11, 45},
                    Shape{40, 3, 17}, Shape{8, 33, 100}}) {
      for (bool bias : {false, true}) check_matmul(gpu(), t, s, bias, seed += 3, nmse_bound(t, s.n, false));
    }
  }
  // Activations one float off 16-byte alignment: the scalar GEMV paths.
  for (DType t : kAllTypes) {
    for (int64_t n : {1, 5, 40}) check_matmul(gpu(), t, Shape{n, 29, 96}, true, seed += 3, nmse_bound(t, n, false), 1);
  }
}

TEST_F(MatmulTest, LongRows) {
  uint32_t seed = 3000;
  for (DType t : kAllTypes) {
    check_matmul(gpu(), t, Shape{1, 64, 4096}, false, seed += 3, nmse_bound(t, 1, false));
    check_matmul(gpu(), t, Shape{4, 48, 14336}, false, seed += 3, nmse_bound(t, 4, false));
    check_matmul(gpu(), t, Shape{100, 24, 4096}, true, seed += 3, nmse_bound(t, 100, false));
  }
}

TEST_F(MatmulTest, ZeroRowsIsANoOp) {
  DeviceMem w(gpu(), 4 * 32 * 4), o(gpu(), 64);
  std::vector<float> sentinel(16, 3.0f);
  gpu().copy_to_device(o.get(), sentinel.data(), 64);
  Tensor xt(w.get(), DType::kF32, {0, 32}, Device::kCuda), wt(w.get(), DType::kF32, {4, 32}, Device::kCuda);
  Tensor ot(o.get(), DType::kF32, {0, 4}, Device::kCuda);
  gpu().matmul(xt, wt, Tensor(), ot);
  EXPECT_EQ(download<float>(gpu(), o, 16), sentinel);
}

// Panels of a large weight: more rows than fit one 64 MiB panel at this k.
TEST_F(MatmulTest, QuantisedPanelsCoverEveryRow) {
  check_matmul(gpu(), DType::kQ4_1, Shape{40, 4200, 4096}, true, 4000, kFp32Nmse);
}

class MatmulExactTest : public GpuTest {
 protected:
  cuda::CudaBackendOptions gpu_options() const override {
    cuda::CudaBackendOptions o;
    o.exact_fp32_matmul = true;
    return o;
  }
};

TEST_F(MatmulExactTest, HalfWeightsInFp32) {
  uint32_t seed = 5000;
  for (DType t : {DType::kF16, DType::kBF16}) {
    for (int64_t n : {9, 33, 70}) {
      for (bool bias : {false, true}) check_matmul(gpu(), t, Shape{n, 77, 576}, bias, seed += 3, kFp32Nmse);
    }
  }
}

}  // namespace
}  // namespace osprey::gpu_test
