// FP8 weights on the CUDA backend (ops/backend.h, "FP8 weights"):
// quantize_weight_fp8 against the host recipe bit for bit (codes and
// scale); matmul and matmul_add on F8_E4M3 weights against a double
// reference of the same quantised operands (the input quantised by the
// host recipe too; one row: the FP8 GEMV on the 16-bit row), eager and
// replayed from a captured graph on new inputs (the input's scale is
// computed on the device per call); and the errors for what the path does
// not take.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>

#include "gpu_test_util.h"

namespace osprey::gpu_test {
namespace {

class Fp8MatmulTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (HasFatalFailure()) return;
    if (!gpu().supports_fp8_weights(DType::kBF16)) GTEST_SKIP() << "no FP8 tensor cores on this GPU";
  }
};

// The host recipe (Backend::quantize_weight_fp8's default) of BF16 values v
// [rows, cols]: codes and scale.
struct HostFp8 {
  std::vector<uint8_t> bytes;  // fp8_weight_bytes
  float scale = 0;
};
HostFp8 host_fp8(ops::Backend& cpu, const std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
  HostFp8 h;
  h.bytes.assign(static_cast<size_t>(fp8_weight_bytes(rows, cols)), 0);
  Tensor w(const_cast<uint16_t*>(v.data()), DType::kBF16, {rows, cols});
  Tensor q(h.bytes.data(), DType::kF8E4M3, {rows, cols});
  EXPECT_TRUE(cpu.quantize_weight_fp8(w, q).ok());
  std::memcpy(&h.scale, h.bytes.data() + fp8_scale_offset(rows, cols), sizeof(float));
  return h;
}

// Device F8 weight [m, k] quantised on the GPU from BF16 values.
DeviceMem device_fp8(ops::Backend& be, const std::vector<uint16_t>& w16, int64_t m, int64_t k) {
  DeviceMem w = upload(be, w16);
  DeviceMem q(be, static_cast<size_t>(fp8_weight_bytes(m, k)));
  Tensor wt(w.get(), DType::kBF16, {m, k}, Device::kCuda);
  Tensor qt(q.get(), DType::kF8E4M3, {m, k}, Device::kCuda);
  EXPECT_TRUE(be.quantize_weight_fp8(wt, qt).ok());
  return q;
}

TEST_F(Fp8MatmulTest, WeightQuantisationMatchesTheHostRecipeBitForBit) {
  for (auto [m, k, seed] : {std::tuple{96, 256, 1u}, std::tuple{4096, 512, 2u}, std::tuple{16, 16, 3u}}) {
    auto vals = random_floats(static_cast<size_t>(m * k), seed, -0.07f, 0.05f);
    for (size_t i = 0; i < vals.size(); i += 17) vals[i] = 0.0f;
    vals[vals.size() / 3] = 1e-6f;  // far below one step: rounds to a (signed) zero or a subnormal code
    const auto w16 = to_bf16(vals);
    const HostFp8 want = host_fp8(cpu(), w16, m, k);
    DeviceMem q = device_fp8(gpu(), w16, m, k);
    const auto got = download<uint8_t>(gpu(), q, static_cast<size_t>(fp8_weight_bytes(m, k)));
    float s = 0;
    std::memcpy(&s, got.data() + fp8_scale_offset(m, k), sizeof(float));
    EXPECT_EQ(s, want.scale) << m << "x" << k;
    size_t diff = 0;
    for (int64_t i = 0; i < m * k; ++i) diff += got[static_cast<size_t>(i)] != want.bytes[static_cast<size_t>(i)];
    EXPECT_EQ(diff, 0u) << m << "x" << k << ": codes that differ from the host recipe";
  }
  // All zeros: scale 1, zero codes.
  const std::vector<uint16_t> zeros(16 * 32, 0);
  DeviceMem q = device_fp8(gpu(), zeros, 16, 32);
  const auto got = download<uint8_t>(gpu(), q, static_cast<size_t>(fp8_weight_bytes(16, 32)));
  float s = 0;
  std::memcpy(&s, got.data() + fp8_scale_offset(16, 32), sizeof(float));
  EXPECT_EQ(s, 1.0f);
  for (int i = 0; i < 16 * 32; ++i) ASSERT_EQ(got[static_cast<size_t>(i)] & 0x7f, 0) << i;
}

// out = (e4m3(x) . e4m3(w)) * sx * sw (+ residual) in double, from the host
// recipe's codes of x [n, k] and w [m, k] (both BF16 values); with
// quantize_x false (one row: the FP8 GEMV) x's own values and sx = 1.
std::vector<double> fp8_reference(ops::Backend& cpu, const std::vector<uint16_t>& x16, const std::vector<uint16_t>& w16,
                                  int64_t n, int64_t m, int64_t k, const std::vector<float>* residual,
                                  bool quantize_x = true) {
  HostFp8 xq = host_fp8(cpu, x16, n, k);
  const HostFp8 wq = host_fp8(cpu, w16, m, k);
  std::vector<double> xd(static_cast<size_t>(n * k)), wd(static_cast<size_t>(m * k));
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = quantize_x ? f8e4m3_to_f32(xq.bytes[i]) : bf16_to_f32(x16[i]);
  if (!quantize_x) xq.scale = 1.0f;
  for (size_t i = 0; i < wd.size(); ++i) wd[i] = f8e4m3_to_f32(wq.bytes[i]);
  std::vector<double> ref(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < k; ++c) acc += xd[static_cast<size_t>(i * k + c)] * wd[static_cast<size_t>(j * k + c)];
      double v = acc * xq.scale * wq.scale;
      if (residual) v += (*residual)[static_cast<size_t>(i * m + j)];
      ref[static_cast<size_t>(i * m + j)] = v;
    }
  }
  return ref;
}

// BF16 output of an fp32-accumulated FP8 product: the rounding to BF16
// (2^-9 relative) dominates; NMSE ~ (2^-9)^2 / 3.
constexpr double kFp8Nmse = 2e-5;
constexpr double kFp8MaxRel = 1e-2;

TEST_F(Fp8MatmulTest, MatmulAndMatmulAddMatchTheQuantisedReference) {
  uint32_t seed = 50;
  for (int64_t n : {1, 3, 16, 100, 300}) {
    for (auto [m, k] : {std::pair<int64_t, int64_t>{256, 512}, {96, 1024}}) {
      const auto w16 = to_bf16(random_floats(static_cast<size_t>(m * k), seed++, -0.05f, 0.05f));
      auto xs = random_floats(static_cast<size_t>(n * k), seed++, -2.0f, 2.0f);
      xs[0] = 7.5f;  // an outlier sets the input's scale
      const auto x16 = to_bf16(xs);
      DeviceMem wq = device_fp8(gpu(), w16, m, k);
      DeviceMem x = upload(gpu(), x16);
      DeviceMem out(gpu(), static_cast<size_t>(n * m) * 2);
      Tensor xt(x.get(), DType::kBF16, {n, k}, Device::kCuda), wt(wq.get(), DType::kF8E4M3, {m, k}, Device::kCuda);
      Tensor ot(out.get(), DType::kBF16, {n, m}, Device::kCuda);
      gpu().matmul(xt, wt, Tensor(), ot);
      const auto got = from_bf16(download<uint16_t>(gpu(), out, static_cast<size_t>(n * m)));
      // One row takes the FP8 GEMV, which multiplies the unquantised 16-bit row.
      const bool qx = n > 1;
      const auto ref = fp8_reference(cpu(), x16, w16, n, m, k, nullptr, qx);
      const std::string tag = "n=" + std::to_string(n) + " m=" + std::to_string(m) + " k=" + std::to_string(k);
      expect_close(got, ref, kFp8Nmse, kFp8MaxRel, "matmul " + tag);

      // matmul_add: the residual (BF16) plus the product, in place.
      const auto r16 = to_bf16(random_floats(static_cast<size_t>(n * m), seed++, -1.0f, 1.0f));
      const auto r = from_bf16(r16);
      DeviceMem res = upload(gpu(), r16);
      Tensor rt(res.get(), DType::kBF16, {n, m}, Device::kCuda), scratch;
      gpu().matmul_add(xt, wt, rt, scratch);
      const auto got_add = from_bf16(download<uint16_t>(gpu(), res, static_cast<size_t>(n * m)));
      expect_close(got_add, fp8_reference(cpu(), x16, w16, n, m, k, &r, qx), kFp8Nmse, kFp8MaxRel,
                   "matmul_add " + tag);
    }
  }
}

// A captured graph recomputes the input's scale at every replay: new inputs
// of another magnitude give what an eager call gives on them.
TEST_F(Fp8MatmulTest, GraphReplayQuantisesEachNewInput) {
  if (!gpu().supports_graphs()) GTEST_SKIP() << "no graphs";
  const int64_t n = 24, m = 128, k = 256;
  const auto w16 = to_bf16(random_floats(static_cast<size_t>(m * k), 7, -0.05f, 0.05f));
  DeviceMem wq = device_fp8(gpu(), w16, m, k);
  DeviceMem x(gpu(), static_cast<size_t>(n * k) * 2), out(gpu(), static_cast<size_t>(n * m) * 2);
  Tensor xt(x.get(), DType::kBF16, {n, k}, Device::kCuda), wt(wq.get(), DType::kF8E4M3, {m, k}, Device::kCuda);
  Tensor ot(out.get(), DType::kBF16, {n, m}, Device::kCuda);
  auto put = [&](float amp, uint32_t seed) {
    const auto v = to_bf16(random_floats(static_cast<size_t>(n * k), seed, -amp, amp));
    gpu().copy_to_device(x.get(), v.data(), v.size() * 2);
    return v;
  };
  put(1.0f, 1);
  gpu().matmul(xt, wt, Tensor(), ot);  // eager first: plans and scratch settle outside the capture
  gpu().synchronize();
  gpu().begin_capture();
  gpu().matmul(xt, wt, Tensor(), ot);
  auto graph = gpu().end_capture();
  ASSERT_NE(graph, nullptr);
  for (auto [amp, seed] : {std::pair{0.01f, 2u}, std::pair{30.0f, 3u}, std::pair{1.0f, 4u}}) {
    const auto v = put(amp, seed);
    graph->launch();
    const auto replayed = download<uint16_t>(gpu(), out, static_cast<size_t>(n * m));
    gpu().matmul(xt, wt, Tensor(), ot);
    const auto eager = download<uint16_t>(gpu(), out, static_cast<size_t>(n * m));
    EXPECT_EQ(replayed, eager) << "amplitude " << amp;
    expect_close(from_bf16(replayed), fp8_reference(cpu(), v, w16, n, m, k, nullptr), kFp8Nmse, kFp8MaxRel,
                 "replay at amplitude " + std::to_string(amp));
  }
}

TEST_F(Fp8MatmulTest, RejectsWhatThePathDoesNotTake) {
  // The child re-runs the test in a fresh process (no CUDA context across fork).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int64_t m = 32, k = 64;
  const auto w16 = to_bf16(random_floats(static_cast<size_t>(m * k), 9));
  DeviceMem wq = device_fp8(gpu(), w16, m, k);
  Tensor wt(wq.get(), DType::kF8E4M3, {m, k}, Device::kCuda);
  DeviceMem x(gpu(), 4 * k * 4), out(gpu(), 4 * m * 4);
  Tensor x32(x.get(), DType::kF32, {4, k}, Device::kCuda), o32(out.get(), DType::kF32, {4, m}, Device::kCuda);
  EXPECT_DEATH(gpu().matmul(x32, wt, Tensor(), o32), "BF16 or F16 activations");
  // A non-finite weight is an error at conversion (returned, no abort).
  for (float v : {INFINITY, -INFINITY, NAN}) {
    auto bad = random_floats(static_cast<size_t>(m * k), 10);
    bad[static_cast<size_t>(m * k) - 5] = v;
    DeviceMem w = upload(gpu(), to_bf16(bad));
    DeviceMem q(gpu(), static_cast<size_t>(fp8_weight_bytes(m, k)));
    Tensor bw(w.get(), DType::kBF16, {m, k}, Device::kCuda);
    Tensor bq(q.get(), DType::kF8E4M3, {m, k}, Device::kCuda);
    const Status st = gpu().quantize_weight_fp8(bw, bq);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << v;
    EXPECT_NE(st.message().find("non-finite"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace osprey::gpu_test
