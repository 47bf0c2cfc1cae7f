// Row-wise ops against double-precision references: embedding, norms, add,
// rope, silu_mul, gather_rows, and backend memory.
#include <gtest/gtest.h>

#include "ops/rope_freq.h"
#include "test_util.h"

namespace osprey::test {
namespace {

class OpsTest : public testing::TestWithParam<BackendVariant> {};

TEST_P(OpsTest, EmbeddingAllDtypes) {
  auto be = make_backend(GetParam());
  const int64_t vocab = 50, d = 96;
  const auto table = random_floats(static_cast<size_t>(vocab * d), 1);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17, 25, 8};
  const int64_t n = static_cast<int64_t>(ids.size());
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    auto packed = pack(t, table, vocab, d);
    const auto deq = unpack(t, packed, vocab, d);
    std::vector<double> ref;
    for (int32_t id : ids) ref.insert(ref.end(), deq.begin() + id * d, deq.begin() + (id + 1) * d);
    std::vector<float> out(static_cast<size_t>(n * d));
    Tensor tt(packed.data(), t, {vocab, d});
    Tensor ot(out.data(), DType::kF32, {n, d});
    be->embedding(tt, ids.data(), ot);
    expect_close(out, ref, 1e-6, std::string("embedding ") + std::string(dtype_name(t)));
  }
}

std::vector<double> ref_rms_norm(const std::vector<float>& x, const std::vector<float>& w, int64_t d, float eps) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / static_cast<size_t>(d); ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[r * d + i]) * x[r * d + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t i = 0; i < d; ++i) out[r * d + i] = x[r * d + i] * inv * w[static_cast<size_t>(i)];
  }
  return out;
}

TEST_P(OpsTest, RmsNorm) {
  auto be = make_backend(GetParam());
  for (int64_t n : {1, 37, 300}) {
    for (int64_t d : {1, 7, 576, 1000}) {
      const auto x = random_floats(static_cast<size_t>(n * d), 10 + static_cast<uint32_t>(n + d), -3.0f, 3.0f);
      const auto w = random_floats(static_cast<size_t>(d), 11, 0.5f, 1.5f);
      std::vector<float> out(x.size());
      Tensor xt(const_cast<float*>(x.data()), DType::kF32, {n, d});
      Tensor wt(const_cast<float*>(w.data()), DType::kF32, {d});
      Tensor ot(out.data(), DType::kF32, {n, d});
      be->rms_norm(xt, wt, 1e-5f, ot);
      expect_close(out, ref_rms_norm(x, w, d, 1e-5f), 2e-6, "rms_norm d=" + std::to_string(d));
    }
  }
}

TEST_P(OpsTest, AddRmsNorm) {
  auto be = make_backend(GetParam());
  for (int64_t n : {1, 37}) {
    const int64_t d = 576;
    auto res = random_floats(static_cast<size_t>(n * d), 20, -2.0f, 2.0f);
    const auto x = random_floats(static_cast<size_t>(n * d), 21, -2.0f, 2.0f);
    const auto w = random_floats(static_cast<size_t>(d), 22, 0.5f, 1.5f);
    std::vector<float> sum(res.size());
    std::vector<double> sum_ref(res.size());
    for (size_t i = 0; i < res.size(); ++i) {
      sum[i] = res[i] + x[i];
      sum_ref[i] = static_cast<double>(res[i]) + x[i];
    }
    std::vector<float> out(res.size());
    Tensor rt(res.data(), DType::kF32, {n, d});
    Tensor xt(const_cast<float*>(x.data()), DType::kF32, {n, d});
    Tensor wt(const_cast<float*>(w.data()), DType::kF32, {d});
    Tensor ot(out.data(), DType::kF32, {n, d});
    be->add_rms_norm(rt, xt, wt, 1e-6f, ot);
    expect_close(res, sum_ref, 1e-7, "add_rms_norm residual");
    expect_close(out, ref_rms_norm(sum, w, d, 1e-6f), 2e-6, "add_rms_norm out");
  }
}

TEST_P(OpsTest, Add) {
  auto be = make_backend(GetParam());
  for (int64_t n : {1, 37, 200}) {
    const int64_t d = 333;
    auto x = random_floats(static_cast<size_t>(n * d), 30);
    const auto y = random_floats(static_cast<size_t>(n * d), 31);
    std::vector<double> ref(x.size());
    for (size_t i = 0; i < x.size(); ++i) ref[i] = static_cast<double>(x[i]) + y[i];
    Tensor xt(x.data(), DType::kF32, {n, d});
    Tensor yt(const_cast<float*>(y.data()), DType::kF32, {n, d});
    be->add(xt, yt);
    expect_close(x, ref, 1e-7, "add");
  }
}

TEST_P(OpsTest, HeadRmsNorm) {
  auto be = make_backend(GetParam());
  const int64_t n = 37, heads = 5, hd = 64;
  auto x = random_floats(static_cast<size_t>(n * heads * hd), 40, -4.0f, 4.0f);
  const auto w = random_floats(static_cast<size_t>(hd), 41, 0.5f, 1.5f);
  const auto ref = ref_rms_norm(x, w, hd, 1e-6f);
  Tensor xt(x.data(), DType::kF32, {n, heads, hd});
  Tensor wt(const_cast<float*>(w.data()), DType::kF32, {hd});
  be->head_rms_norm(xt, wt, 1e-6f);
  expect_close(x, ref, 2e-6, "head_rms_norm");
}

// Reference: HF rotate_half layout; freqs = float(pos) * inv_freq in fp32
// (as torch does), then cos/sin and the rotation in double.
void ref_rope(std::vector<double>& out, const std::vector<float>& x, int64_t n, int64_t h, int64_t hd,
              const std::vector<int32_t>& pos, const std::vector<float>& inv_freq, int rd, float scaling) {
  out.assign(x.begin(), x.end());
  const int half = rd / 2;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < h; ++j) {
      const float* xi = x.data() + (t * h + j) * hd;
      double* o = out.data() + (t * h + j) * hd;
      for (int i = 0; i < half; ++i) {
        const float f = static_cast<float>(pos[static_cast<size_t>(t)]) * inv_freq[static_cast<size_t>(i)];
        const double c = std::cos(static_cast<double>(f)) * scaling;
        const double s = std::sin(static_cast<double>(f)) * scaling;
        o[i] = xi[i] * c - static_cast<double>(xi[i + half]) * s;
        o[i + half] = xi[i + half] * c + static_cast<double>(xi[i]) * s;
      }
    }
  }
}

TEST_P(OpsTest, Rope) {
  auto be = make_backend(GetParam());
  struct Case {
    int64_t n, hq, hk, hd;
    int rd;
    float scaling;
  };
  for (Case c : {Case{1, 9, 3, 64, 64, 1.0f}, Case{37, 4, 1, 128, 128, 1.0f}, Case{5, 2, 2, 80, 32, 1.25f},
                 Case{3, 3, 1, 6, 6, 1.0f}}) {
    std::vector<int32_t> pos(static_cast<size_t>(c.n));
    for (int64_t t = 0; t < c.n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>((t * 977) % 9000);
    const auto inv = ops::make_rope_inv_freq(10000.0f, c.rd, ops::RopeScalingParams{});
    ASSERT_EQ(inv.size(), static_cast<size_t>(c.rd / 2));
    auto q = random_floats(static_cast<size_t>(c.n * c.hq * c.hd), 50);
    auto k = random_floats(static_cast<size_t>(c.n * c.hk * c.hd), 51);
    std::vector<double> qref, kref;
    ref_rope(qref, q, c.n, c.hq, c.hd, pos, inv, c.rd, c.scaling);
    ref_rope(kref, k, c.n, c.hk, c.hd, pos, inv, c.rd, c.scaling);
    Tensor qt(q.data(), DType::kF32, {c.n, c.hq, c.hd});
    Tensor kt(k.data(), DType::kF32, {c.n, c.hk, c.hd});
    ops::RopeTable table{inv.data(), c.rd, c.scaling};
    be->rope(qt, kt, pos.data(), table);
    expect_close(q, qref, 2e-6, "rope q hd=" + std::to_string(c.hd));
    expect_close(k, kref, 2e-6, "rope k hd=" + std::to_string(c.hd));
  }
}

TEST_P(OpsTest, SiluMul) {
  auto be = make_backend(GetParam());
  for (int64_t n : {1, 37}) {
    for (int64_t f : {1, 13, 1536}) {
      auto gu = random_floats(static_cast<size_t>(n * 2 * f), 60, -12.0f, 12.0f);
      gu[0] = -100.0f;  // saturating inputs
      if (gu.size() > 1) gu[1] = 95.0f;
      std::vector<double> ref(static_cast<size_t>(n * f));
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < f; ++j) {
          const double g = gu[static_cast<size_t>(i * 2 * f + j)];
          ref[static_cast<size_t>(i * f + j)] = g / (1.0 + std::exp(-g)) * gu[static_cast<size_t>(i * 2 * f + f + j)];
        }
      }
      std::vector<float> out(static_cast<size_t>(n * f));
      Tensor gt(gu.data(), DType::kF32, {n, 2 * f});
      Tensor ot(out.data(), DType::kF32, {n, f});
      be->silu_mul(gt, ot);
      expect_close(out, ref, 2e-6, "silu_mul f=" + std::to_string(f));
    }
  }
}

TEST_P(OpsTest, GatherRows) {
  auto be = make_backend(GetParam());
  const int64_t n = 10, d = 7;
  const auto x = random_floats(static_cast<size_t>(n * d), 70);
  const std::vector<int32_t> rows = {9, 0, 4, 4};
  std::vector<float> out(rows.size() * d);
  Tensor xt(const_cast<float*>(x.data()), DType::kF32, {n, d});
  Tensor ot(out.data(), DType::kF32, {static_cast<int64_t>(rows.size()), d});
  be->gather_rows(xt, rows.data(), static_cast<int>(rows.size()), ot);
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out[r * d + c], x[rows[r] * d + c]);
}

TEST_P(OpsTest, AllocIsZeroedAlignedAndCopies) {
  auto be = make_backend(GetParam());
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, size_t{1} << 20}) {
    auto* p = static_cast<uint8_t*>(be->alloc(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], 0) << i;
    std::vector<uint8_t> src(bytes, 0xab), back(bytes, 0);
    be->copy_to_device(p, src.data(), bytes);
    be->copy_to_host(back.data(), p, bytes);
    EXPECT_EQ(src, back);
    be->free(p);
  }
  be->synchronize();
  EXPECT_EQ(be->device(), Device::kCpu);
}

INSTANTIATE_TEST_SUITE_P(Variants, OpsTest, testing::ValuesIn(all_variants()), variant_name);

}  // namespace
}  // namespace osprey::test
