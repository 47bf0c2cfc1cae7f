// CUDA matmul against a double-precision reference on the exactly
// dequantised weights: every weight dtype, the GEMV, cuBLAS and dequantised
// panel paths (row counts either side of each threshold), bias on and off,
// odd k and unaligned activations; and the batch-1 decode chain queued back
// to back (programmatic dependent launch) against the same ops serialised.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>

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

// The batch-1 staged quantised GEMV (q4gemv1_kernel) at shapes its
// persistent grid and segment ring meet only in real models: several rows
// a warp (m above 16 warps x the SM count), rows of several segments (k >
// 4096: 2 and 4 segments for Q4, 4 and 7 for Q8_0, the last a partial
// group of warps), one row; with a bias.
TEST_F(MatmulTest, StagedQuantGemvManyRowsAndSegments) {
  uint32_t seed = 3500;
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0}) {
    check_matmul(gpu(), t, Shape{1, 5003, 8192}, true, seed += 3, kFp32Nmse);
    check_matmul(gpu(), t, Shape{1, 300, 14336}, false, seed += 3, kFp32Nmse);
    check_matmul(gpu(), t, Shape{1, 1, 256}, true, seed += 3, kFp32Nmse);
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

// launch_dequant_rows (the quantised panels of the batched path): every
// quantised dtype into F32, BF16 and F16 panels, against the core
// reference dequantize_row. Q8_0 / Q4_0 values are one product (d * q), so
// F32 must match bit for bit; Q4_1's d * q + m may be one fused
// multiply-add on the device (1 ulp). The 16-bit panels must be the F32
// panel rounded (round to nearest even). Rows of 33 blocks, an odd count,
// and a row count that leaves a partial last warp.
TEST_F(MatmulTest, DequantRowsMatchReference) {
  const int64_t rows = 37, k = 33 * 32;
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    const auto packed = pack(t, random_floats(static_cast<size_t>(rows * k), 7100, -3.0f, 3.0f), rows, k);
    const auto ref = unpack(t, packed, rows, k);
    DeviceMem gw = upload(gpu(), packed);
    DeviceMem g32(gpu(), static_cast<size_t>(rows * k) * 4), g16(gpu(), static_cast<size_t>(rows * k) * 2);
    gpu().synchronize();
    cuda::launch_dequant_rows(t, gw.get(), dtype_row_bytes(t, k), rows, k, g32.as<float>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto f32 = download<float>(gpu(), g32, static_cast<size_t>(rows * k));
    int64_t off = 0;
    for (size_t i = 0; i < f32.size(); ++i) {
      const double tol = t == DType::kQ4_1 ? std::abs(ref[i]) * 1.2e-7 + 1e-30 : 0.0;
      if (std::abs(static_cast<double>(f32[i]) - ref[i]) > tol && off++ < 5) {
        ADD_FAILURE() << dtype_name(t) << " element " << i << ": " << f32[i] << " vs " << ref[i];
      }
    }
    EXPECT_EQ(off, 0) << dtype_name(t) << " F32 panel";
    for (DType ot : {DType::kBF16, DType::kF16}) {
      cuda::launch_dequant_rows(t, gw.get(), dtype_row_bytes(t, k), rows, k, ot, g16.get(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto h = download<uint16_t>(gpu(), g16, static_cast<size_t>(rows * k));
      const auto want = ot == DType::kBF16 ? to_bf16(f32) : to_f16(f32);
      EXPECT_EQ(h, want) << dtype_name(t) << " -> " << dtype_name(ot);
    }
  }
}

// The batch-1 decode chain (norm -> GEMV -> SiLU-and-mul -> GEMV -> add +
// norm ...) in BF16, queued back to back (where the card allows, each kernel
// starts under programmatic dependent launch before the previous one ends,
// pdl.cuh) and replayed as a CUDA graph, against the same ops with the
// stream drained after each one: bit for bit. Twice: with the gate/up GEMV
// and silu_mul as two ops, and as the fused matmul_silu_mul (one kernel at
// one row). Intermediates are poisoned (bf16 NaN) before every run, so a
// kernel that read its input before its producer finished would show.
TEST_F(MatmulTest, DecodeChainQueuedEqualsSerialised) {
  const int64_t d = 2048, f = 4096;
  const int layers = 4;
  const auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
    return out;
  };
  const auto x0 = to_bf16(random_floats(static_cast<size_t>(d), 6000, -2.0f, 2.0f));
  DeviceMem gwgu = upload(gpu(), pack(DType::kBF16, random_floats(static_cast<size_t>(2 * f * d), 6001, -0.05f, 0.05f),
                                      2 * f, d));
  DeviceMem gwd =
      upload(gpu(), pack(DType::kBF16, random_floats(static_cast<size_t>(d * f), 6002, -0.05f, 0.05f), d, f));
  DeviceMem gnorm = upload(gpu(), random_floats(static_cast<size_t>(d), 6003, 0.5f, 1.5f));
  DeviceMem gresid(gpu(), static_cast<size_t>(d) * 2), gnormed(gpu(), static_cast<size_t>(d) * 2),
      ggu(gpu(), static_cast<size_t>(2 * f) * 2), gact(gpu(), static_cast<size_t>(f) * 2),
      gproj(gpu(), static_cast<size_t>(d) * 2);
  Tensor resid = dev_tensor(gresid, DType::kBF16, {1, d}), normed = dev_tensor(gnormed, DType::kBF16, {1, d});
  Tensor gu = dev_tensor(ggu, DType::kBF16, {1, 2 * f}), act = dev_tensor(gact, DType::kBF16, {1, f});
  Tensor proj = dev_tensor(gproj, DType::kBF16, {1, d});
  Tensor wgu = dev_tensor(gwgu, DType::kBF16, {2 * f, d}), wd = dev_tensor(gwd, DType::kBF16, {d, f});
  Tensor wn = dev_tensor(gnorm, DType::kF32, {d});

  const std::vector<uint16_t> poison(static_cast<size_t>(2 * f), 0xffff);  // bf16 NaN
  auto reset = [&] {
    gpu().copy_to_device(gresid.get(), x0.data(), x0.size() * 2);
    for (DeviceMem* m : {&gnormed, &ggu, &gact, &gproj}) gpu().copy_to_device(m->get(), poison.data(), m->bytes());
    gpu().synchronize();
  };
  for (bool fused : {false, true}) {
    const std::string what = fused ? "matmul_silu_mul: " : "matmul + silu_mul: ";
    // serial: drain the stream after every op (no two kernels can overlap).
    auto chain = [&](bool serial) {
      auto step = [&] {
        if (serial) gpu().synchronize();
      };
      for (int l = 0; l < layers; ++l) {
        if (l == 0) {
          gpu().rms_norm(resid, wn, 1e-5f, normed);
        } else {
          gpu().add_rms_norm(resid, proj, wn, 1e-5f, normed);
        }
        step();
        if (fused) {
          gpu().matmul_silu_mul(normed, wgu, gu, act);
        } else {
          gpu().matmul(normed, wgu, Tensor(), gu);
          step();
          gpu().silu_mul(gu, act);
        }
        step();
        gpu().matmul(act, wd, Tensor(), proj);
        step();
      }
      gpu().add(resid, proj);
    };
    reset();
    chain(true);
    const auto want = download<uint16_t>(gpu(), gresid, static_cast<size_t>(d));
    int finite = 0;
    for (uint16_t v : want) finite += std::isfinite(bf16_to_f32(v)) ? 1 : 0;
    ASSERT_EQ(finite, d) << what << "the serialised chain must give finite values";
    for (int rep = 0; rep < 5; ++rep) {
      reset();
      chain(false);
      EXPECT_EQ(download<uint16_t>(gpu(), gresid, static_cast<size_t>(d)), want) << what << "queued run " << rep;
    }
    if (gpu().supports_graphs()) {
      reset();
      gpu().begin_capture();
      chain(false);
      auto graph = gpu().end_capture();
      ASSERT_NE(graph, nullptr);
      for (int rep = 0; rep < 5; ++rep) {
        reset();
        graph->launch();
        EXPECT_EQ(download<uint16_t>(gpu(), gresid, static_cast<size_t>(d)), want) << what << "graph replay " << rep;
      }
    }
  }
}

// BF16 activations through cuBLASLt with autotuned plans (gemm/matmul.cpp):
// a shape's first call times the heuristic's candidates and keeps the
// fastest; other n of the same bucket (each n up to 8, multiple of 8 up to
// 512, of 64 up to 2048, power of two above) reuse the winner; a shape first seen inside graph capture
// keeps the heuristic's choice. Every such plan must compute the same product: against a float64 reference on the
// bf16 values, repeated calls bit for bit, and a graph replay equal to the
// eager call of its shape.
TEST_F(MatmulTest, TuningRowsAreOnePerBucket) {
  // The engine warms each of these before serving: every n above the GEMV's
  // row limit (CudaBackendOptions::gemv_max_rows, 1 by default;
  // OSPREY_GEMV_MAX_ROWS overrides it) up to 8, multiples of 8 from 16 to
  // 512, of 64 to 2048, then powers of two; the last is max_rows itself.
  const char* env = std::getenv("OSPREY_GEMV_MAX_ROWS");
  const int64_t limit = env != nullptr ? std::atoi(env) : 0;  // 0 or unset: the option's 1
  const int64_t first = (limit >= 1 ? limit : 1) + 1;
  std::vector<int64_t> small;
  for (int64_t n = first; n <= 8; ++n) small.push_back(n);
  std::vector<int64_t> want = small;
  for (int64_t n = 16; n <= 512; n += 8) want.push_back(n);
  for (int64_t n = 576; n <= 2048; n += 64) want.push_back(n);
  want.push_back(4096);
  want.push_back(8192);
  EXPECT_EQ(gpu().matmul_tuning_rows(8192), want);
  const std::vector<int64_t> r = gpu().matmul_tuning_rows(3000);
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r.back(), 3000);  // bucket 4096, cut at max_rows
  EXPECT_EQ(r[r.size() - 2], 2048);
  EXPECT_TRUE(gpu().matmul_tuning_rows(first - 1).empty());  // GEMV rows only: nothing to tune
  std::vector<int64_t> to15 = small, to20 = small;
  to15.push_back(15);
  to20.insert(to20.end(), {16, 20});
  EXPECT_EQ(gpu().matmul_tuning_rows(15), to15);
  EXPECT_EQ(gpu().matmul_tuning_rows(20), to20);
}

TEST_F(MatmulTest, Bf16AutotunedPlansMatchReference) {
  const int64_t m = 384, k = 512;
  const auto wf = random_floats(static_cast<size_t>(m * k), 7001);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  DeviceMem gw = upload(gpu(), wb);
  Tensor wt(gw.get(), DType::kBF16, {m, k}, Device::kCuda);
  uint32_t seed = 7100;
  // n: below the tuning threshold, a bucket's first and second shapes (also
  // above 256: 298 and 300 share the bucket 304), large. From 100 on each
  // bucket's tuning also times the picks of the buckets already tuned within
  // a factor of two (100's at 128, 100's and 128's at 65, 600's at 1000, 1000's at 2048): each
  // must give the same product at an n it did not win at.
  for (int64_t n : {12, 100, 128, 65, 298, 300, 600, 1000, 2048}) {
    for (DType ot : {DType::kBF16, DType::kF32}) {
      const auto xf = random_floats(static_cast<size_t>(n * k), seed += 2);
      std::vector<uint16_t> xb(xf.size());
      for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
      std::vector<double> ref(static_cast<size_t>(n * m));
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < k; ++c) {
            acc += double{bf16_to_f32(xb[static_cast<size_t>(i * k + c)])} *
                   bf16_to_f32(wb[static_cast<size_t>(j * k + c)]);
          }
          ref[static_cast<size_t>(i * m + j)] = acc;
        }
      }
      const size_t oes = ot == DType::kF32 ? 4 : 2;
      DeviceMem gx = upload(gpu(), xb), go(gpu(), static_cast<size_t>(n * m) * oes);
      Tensor xt(gx.get(), DType::kBF16, {n, k}, Device::kCuda), out(go.get(), ot, {n, m}, Device::kCuda);
      auto result = [&] {
        std::vector<float> f(static_cast<size_t>(n * m));
        if (ot == DType::kF32) return download<float>(gpu(), go, f.size());
        const auto b = download<uint16_t>(gpu(), go, f.size());
        for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(b[i]);
        return f;
      };
      const std::string what = "n=" + std::to_string(n) + " out " + std::string(dtype_name(ot));
      gpu().matmul(xt, wt, Tensor(), out);
      const auto first = result();
      const ErrorStats e = error_stats(first.data(), ref.data(), first.size());
      EXPECT_LE(e.nmse, ot == DType::kF32 ? 1e-10 : 1e-5) << what << " max rel " << e.max_rel;
      gpu().matmul(xt, wt, Tensor(), out);
      EXPECT_EQ(result(), first) << what << ": second call differs";
    }
  }
  // A new shape whose first call is captured: not timed, still correct, and
  // the eager call afterwards uses the same plan (same bits).
  if (gpu().supports_graphs()) {
    const int64_t n = 77;
    const auto xf = random_floats(static_cast<size_t>(n * k), 7200);
    std::vector<uint16_t> xb(xf.size());
    for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
    DeviceMem gx = upload(gpu(), xb), go(gpu(), static_cast<size_t>(n * m) * 4);
    Tensor xt(gx.get(), DType::kBF16, {n, k}, Device::kCuda), out(go.get(), DType::kF32, {n, m}, Device::kCuda);
    gpu().begin_capture();
    gpu().matmul(xt, wt, Tensor(), out);
    auto graph = gpu().end_capture();
    ASSERT_NE(graph, nullptr);
    const std::vector<float> poison(static_cast<size_t>(n * m), NAN);  // unwritten elements fail
    gpu().copy_to_device(go.get(), poison.data(), poison.size() * 4);
    graph->launch();
    gpu().synchronize();
    const auto replayed = download<float>(gpu(), go, static_cast<size_t>(n * m));
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < k; ++c) {
          acc += double{bf16_to_f32(xb[static_cast<size_t>(i * k + c)])} *
                 bf16_to_f32(wb[static_cast<size_t>(j * k + c)]);
        }
        const double d = replayed[static_cast<size_t>(i * m + j)] - acc;
        num += std::isfinite(d) ? d * d : INFINITY;
        den += acc * acc;
      }
    }
    EXPECT_LE(num / den, 1e-10) << "captured first call";
    gpu().matmul(xt, wt, Tensor(), out);
    EXPECT_EQ(download<float>(gpu(), go, static_cast<size_t>(n * m)), replayed) << "eager after capture";
  }
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
