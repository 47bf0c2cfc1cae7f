// The RMSNorm folded into the GEMV on CUDA (Backend::rms_norm_matmul and
// rms_norm_matmul_silu_mul; gemm/gemv.cu launch_gemv_rms_norm*): at GEMV
// rows of 16-bit activations and weights (n <= 8 here: the fixture sets
// CudaBackendOptions::gemv_max_rows = 8; the default backend takes n = 1), out = dot(xn, w row) (+ bias) with
// xn = x * inv_rms(x) * g rounded to the activation dtype (as rms_norm
// writes it; the kernel stages it in shared memory) and the normed scratch
// left unwritten.
//  - Against a float64 reference of rsqrt(mean(x^2) + eps) * (x * g) @ w^T
//    (+ bias): BF16 and F16, n = 1..8, Llama-3-8B shapes (qkv 6144 x 4096,
//    a 1024 x 4096 projection, gate/up 28672 x 4096) and a small k, with and
//    without bias; and bit for bit rms_norm then matmul at k <= 4096 (the
//    same operations in the same order as rms_norm_x8_kernel and the GEMV).
//  - The SiLU variant: one kernel at n = 1 (gate_up unwritten), the GEMV
//    into gate_up then silu_mul at n = 3; reference and two-op result.
//  - Shapes and weights it does not fold (more rows, quantised weights, the
//    option off): bit for bit rms_norm then the projection.
//  - A decode chain (folded norm after a PDL-launched matmul_add GEMV that
//    writes its input), queued and as a CUDA graph, bit for bit the ops
//    serialised; outputs and scratch NaN-poisoned before each run.
//  - Model::forward with the fold on (the default) against it off
//    (CudaBackendOptions::fused_norm = false): logits within 16-bit rounding.
// Operand values are bf16 numbers of magnitude >= 2^-10 (or 0), exact in F16
// and BF16 alike, so one float64 reference serves every dtype pair.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "batch_runner.h"
#include "model/model.h"

namespace osprey::gpu_test {
namespace {

constexpr float kEps = 1e-5f;

bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "0";
}

// The fold is expected (not switched off by the environment) for one-kernel checks.
bool fold_expected() { return !env_off("OSPREY_FUSED_NORM"); }
// The batch-1 E4M3 kernels (launch_gemv_fp8 and the fold on E4M3 rows) are on.
bool fp8_gemv_expected() {
  return !env_off("OSPREY_FP8_GEMV");
}

// count bf16 values in [lo, hi) with |v| >= 2^-10 (smaller ones 0), as bf16 bits.
std::vector<uint16_t> exact_bits(size_t count, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<uint16_t> out(count);
  for (auto& b : out) {
    float v = dist(rng);
    if (std::fabs(v) < 1.0f / 1024) v = 0.0f;
    b = f32_to_bf16(v);
  }
  return out;
}

// bf16 bits (exact values) as t's 16-bit encoding.
std::vector<uint16_t> as16(DType t, const std::vector<uint16_t>& bf) {
  if (t == DType::kBF16) return bf;
  std::vector<uint16_t> out(bf.size());
  for (size_t i = 0; i < bf.size(); ++i) out[i] = f32_to_fp16(bf16_to_f32(bf[i]));
  return out;
}

std::vector<double> decode16(DType t, const std::vector<uint16_t>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = t == DType::kF16 ? fp16_to_f32(v[i]) : bf16_to_f32(v[i]);
  return out;
}

double round_to(DType t, double v) {
  const float f = static_cast<float>(v);
  return t == DType::kF16 ? fp16_to_f32(f32_to_fp16(f)) : bf16_to_f32(f32_to_bf16(f));
}

struct Tol {
  double nmse, max_rel;
};
// Normed row and output rounded to the activation dtype (fp32 sums).
Tol ref_tol(DType act) { return act == DType::kBF16 ? Tol{3e-5, 2e-2} : Tol{2e-6, 5e-3}; }
// Against the two ops: their normed row rounded to the activation dtype too.
Tol two_op_tol(DType act) { return act == DType::kBF16 ? Tol{2e-4, 4e-2} : Tol{2e-5, 1e-2}; }

// Host operands of one shape and their float64 products:
// dot[i * m + j] = sum_c x[i, c] g[c] w[j, c], inv[i] = 1 / sqrt(mean(x_i^2) + eps).
struct Operands {
  int64_t m = 0, k = 0, max_n = 0;
  std::vector<uint16_t> x, w;  // bf16 bits, exact in F16
  std::vector<float> g, bias;
  std::vector<double> dot, inv;
};

Operands make_operands(int64_t m, int64_t k, int64_t max_n, uint32_t seed) {
  Operands o;
  o.m = m, o.k = k, o.max_n = max_n;
  o.x = exact_bits(static_cast<size_t>(max_n * k), seed, -2.0f, 2.0f);
  // Rows of different scales (exact: powers of two), so inv differs per row.
  for (int64_t i = 0; i < max_n; ++i)
    for (int64_t c = 0; c < k; ++c) {
      uint16_t& b = o.x[static_cast<size_t>(i * k + c)];
      b = f32_to_bf16(bf16_to_f32(b) * std::ldexp(1.0f, static_cast<int>(i % 3) - 1));
    }
  o.w = exact_bits(static_cast<size_t>(m * k), seed + 1, -0.1f, 0.1f);
  o.g = random_floats(static_cast<size_t>(k), seed + 2, 0.5f, 1.5f);
  o.bias = random_floats(static_cast<size_t>(m), seed + 3, -0.5f, 0.5f);
  const std::vector<double> xd = decode16(DType::kBF16, o.x);
  std::vector<double> xg(xd.size());
  o.inv.resize(static_cast<size_t>(max_n));
  for (int64_t i = 0; i < max_n; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < k; ++c) {
      const double v = xd[static_cast<size_t>(i * k + c)];
      ss += v * v;
      xg[static_cast<size_t>(i * k + c)] = v * o.g[static_cast<size_t>(c)];
    }
    o.inv[static_cast<size_t>(i)] = 1.0 / std::sqrt(ss / static_cast<double>(k) + double{kEps});
  }
  o.dot.resize(static_cast<size_t>(max_n * m));
  std::vector<double> wr(static_cast<size_t>(k));
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t c = 0; c < k; ++c) wr[static_cast<size_t>(c)] = bf16_to_f32(o.w[static_cast<size_t>(j * k + c)]);
    for (int64_t i = 0; i < max_n; ++i) {
      const double* xr = xg.data() + i * k;
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += xr[c] * wr[static_cast<size_t>(c)];
      o.dot[static_cast<size_t>(i * m + j)] = s;
    }
  }
  return o;
}

class NormMatmulTest : public GpuTest {
 protected:
  // The GEMV (and its norm fold) up to 8 rows: the default backend takes it
  // at one row only (CudaBackendOptions::gemv_max_rows), the kernels take 8.
  cuda::CudaBackendOptions gpu_options() const override {
    cuda::CudaBackendOptions o;
    o.gemv_max_rows = 8;
    return o;
  }
  // rms_norm_matmul of o's first n rows (act activations, wt weights) against
  // the reference and against rms_norm + matmul.
  void check(const Operands& o, DType act, DType wt, int64_t n, bool with_bias) {
    const int64_t m = o.m, k = o.k;
    const std::string what = std::string(dtype_name(act)) + " x " + std::string(dtype_name(wt)) +
                             " n=" + std::to_string(n) + " m=" + std::to_string(m) + " k=" + std::to_string(k) +
                             (with_bias ? " +bias" : "");
    const std::vector<uint16_t> xs(o.x.begin(), o.x.begin() + static_cast<ptrdiff_t>(n * k));
    DeviceMem gx = upload(gpu(), as16(act, xs)), gg = upload(gpu(), o.g), gb = upload(gpu(), o.bias);
    const std::vector<uint16_t> poison_out(static_cast<size_t>(n * m), 0xffff);  // NaN in F16 and BF16
    const std::vector<uint16_t> poison_normed(static_cast<size_t>(n * k), 0xffff);
    DeviceMem gout = upload(gpu(), poison_out), gnormed = upload(gpu(), poison_normed);
    DeviceMem gout2 = upload(gpu(), poison_out), gnormed2 = upload(gpu(), poison_normed);
    Tensor x = dev_tensor(gx, act, {n, k}), g = dev_tensor(gg, DType::kF32, {k});
    Tensor w = dev_tensor(*w_, wt, {m, k});
    Tensor bias = with_bias ? dev_tensor(gb, DType::kF32, {m}) : Tensor();
    Tensor out = dev_tensor(gout, act, {n, m}), normed = dev_tensor(gnormed, act, {n, k});
    Tensor out2 = dev_tensor(gout2, act, {n, m}), normed2 = dev_tensor(gnormed2, act, {n, k});
    EXPECT_TRUE(gpu().fuses_rms_norm_matmul(n, act) || !fold_expected()) << what;
    // E4M3 weights fold at one row (launch_gemv_fp8's batch); at more rows
    // the two ops run (cuBLASLt's FP8 GEMM, which quantises x too).
    const bool fp8 = wt == DType::kF8E4M3;
    const bool folds = fold_expected() && (!fp8 || (n == 1 && fp8_gemv_expected()));
    gpu().rms_norm_matmul(x, g, kEps, w, bias, normed, out);
    gpu().rms_norm(x, g, kEps, normed2);
    gpu().matmul(normed2, w, bias, out2);
    const auto got = decode16(act, download<uint16_t>(gpu(), gout, poison_out.size()));
    const auto two = decode16(act, download<uint16_t>(gpu(), gout2, poison_out.size()));
    if (folds) {
      EXPECT_EQ(download<uint16_t>(gpu(), gnormed, poison_normed.size()), poison_normed)
          << what << ": normed written (not folded)";
    } else if (fp8) {
      EXPECT_EQ(download<uint16_t>(gpu(), gnormed, poison_normed.size()),
                download<uint16_t>(gpu(), gnormed2, poison_normed.size()))
          << what << ": the two ops' normed row";
    }
    std::vector<double> ref(static_cast<size_t>(n * m));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j)
        ref[static_cast<size_t>(i * m + j)] = o.inv[static_cast<size_t>(i)] * o.dot[static_cast<size_t>(i * m + j)] +
                                              (with_bias ? double{o.bias[static_cast<size_t>(j)]} : 0.0);
    const Tol t = ref_tol(act), t2 = two_op_tol(act);
    // (FP8 beyond one row: x quantised too, ~2^-4 relative a product; the
    // FP8 GEMM's own test checks those against their reference.)
    if (!fp8 || folds) expect_close(got, ref, t.nmse, t.max_rel, what + " vs float64");
    expect_close(got, two, t2.nmse, t2.max_rel, what + " vs rms_norm + matmul");
    // k <= 4096: the staged row is rms_norm_x8_kernel's (one 8-element chunk
    // a thread, the same reduction tree) and the dots are the GEMV's.
    if ((fold_expected() && k <= 4096) || (fp8 && !folds)) {
      EXPECT_EQ(got, two) << what << ": not bit for bit rms_norm + matmul";
    }
  }

  // rms_norm_matmul_silu_mul of o's first n rows, o.m = 2 f rows (gate then up).
  void check_silu(const Operands& o, DType act, DType wt, int64_t n) {
    const int64_t f = o.m / 2, k = o.k;
    const std::string what = std::string(dtype_name(act)) + " x " + std::string(dtype_name(wt)) +
                             " silu n=" + std::to_string(n) + " f=" + std::to_string(f) + " k=" + std::to_string(k);
    const std::vector<uint16_t> xs(o.x.begin(), o.x.begin() + static_cast<ptrdiff_t>(n * k));
    DeviceMem gx = upload(gpu(), as16(act, xs)), gg = upload(gpu(), o.g);
    const std::vector<uint16_t> poison_out(static_cast<size_t>(n * f), 0xffff);
    const std::vector<uint16_t> poison_gu(static_cast<size_t>(n * 2 * f), 0xffff);
    const std::vector<uint16_t> poison_normed(static_cast<size_t>(n * k), 0xffff);
    DeviceMem gout = upload(gpu(), poison_out), ggu = upload(gpu(), poison_gu), gn = upload(gpu(), poison_normed);
    DeviceMem gout2 = upload(gpu(), poison_out), ggu2 = upload(gpu(), poison_gu), gn2 = upload(gpu(), poison_normed);
    Tensor x = dev_tensor(gx, act, {n, k}), g = dev_tensor(gg, DType::kF32, {k});
    Tensor w = dev_tensor(*w_, wt, {2 * f, k});
    Tensor out = dev_tensor(gout, act, {n, f}), gu = dev_tensor(ggu, act, {n, 2 * f});
    Tensor normed = dev_tensor(gn, act, {n, k});
    Tensor out2 = dev_tensor(gout2, act, {n, f}), gu2 = dev_tensor(ggu2, act, {n, 2 * f});
    Tensor normed2 = dev_tensor(gn2, act, {n, k});
    const bool fp8 = wt == DType::kF8E4M3;
    ASSERT_TRUE(!fp8 || n == 1) << what << ": the FP8 fold is one row's";
    gpu().rms_norm_matmul_silu_mul(x, g, kEps, w, normed, gu, out);
    gpu().rms_norm(x, g, kEps, normed2);
    gpu().matmul_silu_mul(normed2, w, gu2, out2);
    const auto got = decode16(act, download<uint16_t>(gpu(), gout, poison_out.size()));
    const auto two = decode16(act, download<uint16_t>(gpu(), gout2, poison_out.size()));
    if (fold_expected() && (!fp8 || fp8_gemv_expected())) {
      EXPECT_EQ(download<uint16_t>(gpu(), gn, poison_normed.size()), poison_normed) << what << ": normed written";
      if (n == 1 && !env_off("OSPREY_FUSED_SILU")) {
        EXPECT_EQ(download<uint16_t>(gpu(), ggu, poison_gu.size()), poison_gu) << what << ": gate_up written";
      }
    }
    std::vector<double> ref(static_cast<size_t>(n * f));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < f; ++j) {
        const double inv = o.inv[static_cast<size_t>(i)];
        const double gate = round_to(act, inv * o.dot[static_cast<size_t>(i * 2 * f + j)]);
        const double up = round_to(act, inv * o.dot[static_cast<size_t>(i * 2 * f + f + j)]);
        ref[static_cast<size_t>(i * f + j)] = gate / (1.0 + std::exp(-gate)) * up;
      }
    const bool bf16 = act == DType::kBF16;
    // bf16: the normed row's rounding (as rms_norm) gives ~2e-5 here (numpy model of the kernel).
    // (E4M3 weights: 6.07e-5 measured at BF16, f = 48, H100: the bound has
    // the same source, few samples.)
    const double nmse = bf16 ? (fp8 ? 1e-4 : 6e-5) : 1e-6;
    if (!fp8 || fp8_gemv_expected()) expect_close(got, ref, nmse, bf16 ? 1.6e-2 : 2e-3, what + " vs float64");
    const Tol t2 = two_op_tol(act);
    expect_close(got, two, t2.nmse, t2.max_rel, what + " vs rms_norm + matmul_silu_mul");
    if (fold_expected() && k <= 4096) {
      EXPECT_EQ(got, two) << what << ": not bit for bit the two ops";
    }
  }

  // Uploads o's weights as wt (kept in w_ for check / check_silu).
  void upload_weights(const Operands& o, DType wt) {
    w_.reset();
    w_ = std::make_unique<DeviceMem>(upload(gpu(), as16(wt, o.w)));
  }

  // o's BF16 weights quantised to F8_E4M3 on the device (kept in w_), and
  // o with dot recomputed from the codes times the scale: the reference of
  // check / check_silu on those weights.
  Operands upload_fp8_weights(const Operands& o) {
    const int64_t m = o.m, k = o.k;
    DeviceMem w16 = upload(gpu(), o.w);
    w_.reset();
    w_ = std::make_unique<DeviceMem>(gpu(), static_cast<size_t>(fp8_weight_bytes(m, k)));
    Tensor wt = dev_tensor(w16, DType::kBF16, {m, k}), qt = dev_tensor(*w_, DType::kF8E4M3, {m, k});
    EXPECT_TRUE(gpu().quantize_weight_fp8(wt, qt).ok());
    const auto q = download<uint8_t>(gpu(), *w_, static_cast<size_t>(fp8_weight_bytes(m, k)));
    float scale = 0;
    std::memcpy(&scale, q.data() + fp8_scale_offset(m, k), sizeof(scale));
    Operands oq = o;
    std::vector<double> wr(static_cast<size_t>(k)), xg(static_cast<size_t>(k));
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t c = 0; c < k; ++c)
        wr[static_cast<size_t>(c)] = double{f8e4m3_to_f32(q[static_cast<size_t>(j * k + c)])} * scale;
      for (int64_t i = 0; i < o.max_n; ++i) {
        double acc = 0;
        for (int64_t c = 0; c < k; ++c)
          acc += double{bf16_to_f32(o.x[static_cast<size_t>(i * k + c)])} * o.g[static_cast<size_t>(c)] *
                 wr[static_cast<size_t>(c)];
        oq.dot[static_cast<size_t>(i * m + j)] = acc;
      }
    }
    return oq;
  }

  // The decode chain of DecodeChainQueuedEqualsSerialised, on BF16 weights or
  // (fp8) their F8_E4M3 conversions, at 1, 4 and 8 rows (fp8: 1 and 4).
  void decode_chain(bool fp8) {
    ASSERT_TRUE(gpu().supports_graphs());
    const int64_t d = 1024, f = 2048;
    const int layers = 3;
    uint32_t seed = 23000;
    DeviceMem gw1 = upload(gpu(), to_bf16(random_floats(static_cast<size_t>(d * d), seed += 3, -0.05f, 0.05f)));
    DeviceMem gb1 = upload(gpu(), random_floats(static_cast<size_t>(d), seed += 3, -0.5f, 0.5f));
    DeviceMem gwo = upload(gpu(), to_bf16(random_floats(static_cast<size_t>(d * d), seed += 3, -0.05f, 0.05f)));
    DeviceMem gwgu = upload(gpu(), to_bf16(random_floats(static_cast<size_t>(2 * f * d), seed += 3, -0.05f, 0.05f)));
    DeviceMem gwd = upload(gpu(), to_bf16(random_floats(static_cast<size_t>(d * f), seed += 3, -0.05f, 0.05f)));
    DeviceMem gn1 = upload(gpu(), random_floats(static_cast<size_t>(d), seed += 3, 0.5f, 1.5f));
    DeviceMem gn2 = upload(gpu(), random_floats(static_cast<size_t>(d), seed += 3, 0.5f, 1.5f));
    std::vector<std::unique_ptr<DeviceMem>> q;  // the F8 copies
    auto weight = [&](DeviceMem& m16, int64_t rows, int64_t cols) {
      const Tensor w16 = dev_tensor(m16, DType::kBF16, {rows, cols});
      if (!fp8) return w16;
      q.push_back(std::make_unique<DeviceMem>(gpu(), static_cast<size_t>(fp8_weight_bytes(rows, cols))));
      Tensor w8 = dev_tensor(*q.back(), DType::kF8E4M3, {rows, cols});
      EXPECT_TRUE(gpu().quantize_weight_fp8(w16, w8).ok());
      return w8;
    };
    const Tensor w1 = weight(gw1, d, d), b1 = dev_tensor(gb1, DType::kF32, {d});
    const Tensor wo = weight(gwo, d, d), wgu = weight(gwgu, 2 * f, d);
    const Tensor wd = weight(gwd, d, f);
    const Tensor wn1 = dev_tensor(gn1, DType::kF32, {d}), wn2 = dev_tensor(gn2, DType::kF32, {d});
    for (int64_t n : {1, 4, 8}) {
      if (fp8 && n == 8) continue;
      const std::string what = std::string(fp8 ? "F8_E4M3 " : "") + "n=" + std::to_string(n) + ": ";
      const auto x0 = to_bf16(random_floats(static_cast<size_t>(n * d), seed += 3, -2.0f, 2.0f));
      DeviceMem gresid(gpu(), static_cast<size_t>(n * d) * 2), gnormed(gpu(), static_cast<size_t>(n * d) * 2),
          gt(gpu(), static_cast<size_t>(n * d) * 2), gproj(gpu(), static_cast<size_t>(n * d) * 2),
          ggu(gpu(), static_cast<size_t>(n * 2 * f) * 2), gact(gpu(), static_cast<size_t>(n * f) * 2);
      Tensor resid = dev_tensor(gresid, DType::kBF16, {n, d}), normed = dev_tensor(gnormed, DType::kBF16, {n, d});
      Tensor t = dev_tensor(gt, DType::kBF16, {n, d}), proj = dev_tensor(gproj, DType::kBF16, {n, d});
      Tensor gu = dev_tensor(ggu, DType::kBF16, {n, 2 * f}), act = dev_tensor(gact, DType::kBF16, {n, f});
      const std::vector<uint16_t> poison(static_cast<size_t>(n * 2 * f), 0xffff);  // bf16 NaN
      auto reset = [&] {
        gpu().copy_to_device(gresid.get(), x0.data(), x0.size() * 2);
        for (DeviceMem* m : {&gnormed, &gt, &gproj, &ggu, &gact})
          gpu().copy_to_device(m->get(), poison.data(), m->bytes());
        gpu().synchronize();
      };
      auto chain = [&](bool serial) {
        auto step = [&] {
          if (serial) gpu().synchronize();
        };
        for (int l = 0; l < layers; ++l) {
          gpu().rms_norm_matmul(resid, wn1, kEps, w1, b1, normed, t);
          step();
          gpu().matmul_add(t, wo, resid, proj);
          step();
          gpu().rms_norm_matmul_silu_mul(resid, wn2, kEps, wgu, normed, gu, act);
          step();
          gpu().matmul_add(act, wd, resid, proj);
          step();
        }
      };
      auto read = [&] { return download<uint16_t>(gpu(), gresid, static_cast<size_t>(n * d)); };
      expect_chain_queued_and_graph_equal_serialised(gpu(), reset, chain, read, x0, what);
    }
  }

  std::unique_ptr<DeviceMem> w_;
};

TEST_F(NormMatmulTest, CapabilityFollowsRowsAndDtype) {
  EXPECT_EQ(gpu().fuses_rms_norm_matmul(1, DType::kBF16), fold_expected());
  EXPECT_EQ(gpu().fuses_rms_norm_matmul(8, DType::kF16), fold_expected());
  EXPECT_FALSE(gpu().fuses_rms_norm_matmul(9, DType::kBF16));  // GEMM rows
  EXPECT_FALSE(gpu().fuses_rms_norm_matmul(1, DType::kF32));   // the exact fp32 mode keeps its sequence
  cuda::CudaBackendOptions off;
  off.fused_norm = false;
  auto be_off = cuda::make_cuda_backend(off);
  ASSERT_NE(be_off, nullptr);
  EXPECT_FALSE(be_off->fuses_rms_norm_matmul(1, DType::kBF16));
  // The default backend: the GEMV (so the fold) at one row only, unless
  // OSPREY_GEMV_MAX_ROWS says otherwise.
  if (std::getenv("OSPREY_GEMV_MAX_ROWS") == nullptr) {
    auto be_default = cuda::make_cuda_backend({});
    ASSERT_NE(be_default, nullptr);
    EXPECT_EQ(be_default->fuses_rms_norm_matmul(1, DType::kBF16), fold_expected());
    EXPECT_FALSE(be_default->fuses_rms_norm_matmul(2, DType::kBF16));
  }
}

TEST_F(NormMatmulTest, MatchesFloat64ReferenceSmallAndLlamaShapes) {
  uint32_t seed = 21000;
  struct Shape {
    int64_t m, k;
    bool all_n;  // n = 1..8, else n = 1 and 8
  };
  const Shape shapes[] = {{40, 72, true}, {1024, 4096, true}, {6144, 4096, true}, {28672, 4096, false}};
  for (const Shape& sh : shapes) {
    const Operands o = make_operands(sh.m, sh.k, 8, seed += 10);
    for (DType act : {DType::kBF16, DType::kF16}) {
      // The serving case (weights of the activation dtype); the small shape also crosses them.
      for (DType wt : {DType::kBF16, DType::kF16}) {
        if (wt != act && sh.k != 72) continue;
        upload_weights(o, wt);
        for (int64_t n = 1; n <= 8; ++n) {
          if (!sh.all_n && n != 1 && n != 8) continue;
          check(o, act, wt, n, true);
          if (n == 1 || n == 5) check(o, act, wt, n, false);
        }
        // 28672 x 4096 is Llama-3-8B's gate/up: f = 14336.
        if (sh.m % 2 == 0) {
          check_silu(o, act, wt, 1);
          if (sh.all_n) check_silu(o, act, wt, 3);
        }
      }
    }
  }
}

// F8_E4M3 weights (--quantization fp8): at one row the fold (and the SiLU
// variant) is one kernel, bit for bit rms_norm + launch_gemv_fp8 (+
// silu_mul) at k <= 4096 and near the float64 reference of the codes times
// the scale; at 3 rows the two ops run (normed written). Llama-3-8B's qkv,
// o-sized and gate/up shapes, a small one, and k = 8192 (more than the
// pre-loaded chunks, the staged row over two passes).
TEST_F(NormMatmulTest, Fp8WeightsFoldAtOneRow) {
  if (!gpu().supports_fp8_weights(DType::kBF16)) GTEST_SKIP() << "no FP8 tensor cores on this GPU";
  uint32_t seed = 24000;
  struct Shape {
    int64_t m, k;
  };
  for (const Shape& sh : {Shape{96, 256}, Shape{1024, 4096}, Shape{6144, 4096}, Shape{28672, 4096}, Shape{80, 8192}}) {
    const Operands o = make_operands(sh.m, sh.k, 3, seed += 10);
    const Operands oq = upload_fp8_weights(o);
    for (DType act : {DType::kBF16, DType::kF16}) {
      check(oq, act, DType::kF8E4M3, 1, true);
      check(oq, act, DType::kF8E4M3, 1, false);
      if (sh.m <= 6144) check(oq, act, DType::kF8E4M3, 3, true);
      check_silu(oq, act, DType::kF8E4M3, 1);
    }
  }
}

// Quantised weights, more rows than the GEMV takes, the option off: the two
// ops run, bit for bit.
TEST_F(NormMatmulTest, UnfoldedCasesAreTheTwoOps) {
  const int64_t m = 96, k = 256;
  cuda::CudaBackendOptions off;
  off.fused_norm = false;
  auto be_off = cuda::make_cuda_backend(off);
  ASSERT_NE(be_off, nullptr);
  struct Case {
    ops::Backend* be;
    DType wt;
    int64_t n;
  };
  const Case cases[] = {{&gpu(), DType::kQ8_0, 1}, {&gpu(), DType::kBF16, 12}, {be_off.get(), DType::kBF16, 2}};
  uint32_t seed = 22000;
  for (const Case& c : cases) {
    ops::Backend& be = *c.be;
    const std::string what = std::string(dtype_name(c.wt)) + " n=" + std::to_string(c.n) +
                             (c.be == &gpu() ? "" : " option off");
    const auto xb = to_bf16(random_floats(static_cast<size_t>(c.n * k), seed += 5, -2.0f, 2.0f));
    const auto wb = pack(c.wt, random_floats(static_cast<size_t>(m * k), seed += 5, -0.1f, 0.1f), m, k);
    DeviceMem gx = upload(be, xb), gw = upload(be, wb);
    DeviceMem gg = upload(be, random_floats(static_cast<size_t>(k), seed += 5, 0.5f, 1.5f));
    DeviceMem gout(be, static_cast<size_t>(c.n * m) * 2), gn(be, static_cast<size_t>(c.n * k) * 2);
    DeviceMem gout2(be, static_cast<size_t>(c.n * m) * 2), gn2(be, static_cast<size_t>(c.n * k) * 2);
    DeviceMem gact(be, static_cast<size_t>(c.n * m / 2) * 2), ggu(be, static_cast<size_t>(c.n * m) * 2);
    DeviceMem gact2(be, static_cast<size_t>(c.n * m / 2) * 2), ggu2(be, static_cast<size_t>(c.n * m) * 2);
    Tensor x = dev_tensor(gx, DType::kBF16, {c.n, k}), w = dev_tensor(gw, c.wt, {m, k});
    Tensor g = dev_tensor(gg, DType::kF32, {k});
    Tensor out = dev_tensor(gout, DType::kBF16, {c.n, m}), normed = dev_tensor(gn, DType::kBF16, {c.n, k});
    Tensor out2 = dev_tensor(gout2, DType::kBF16, {c.n, m}), normed2 = dev_tensor(gn2, DType::kBF16, {c.n, k});
    Tensor act = dev_tensor(gact, DType::kBF16, {c.n, m / 2}), gu = dev_tensor(ggu, DType::kBF16, {c.n, m});
    Tensor act2 = dev_tensor(gact2, DType::kBF16, {c.n, m / 2}), gu2 = dev_tensor(ggu2, DType::kBF16, {c.n, m});
    be.rms_norm_matmul(x, g, kEps, w, Tensor(), normed, out);
    be.rms_norm(x, g, kEps, normed2);
    be.matmul(normed2, w, Tensor(), out2);
    EXPECT_EQ(download<uint16_t>(be, gout, static_cast<size_t>(c.n * m)),
              download<uint16_t>(be, gout2, static_cast<size_t>(c.n * m)))
        << what;
    EXPECT_EQ(download<uint16_t>(be, gn, static_cast<size_t>(c.n * k)),
              download<uint16_t>(be, gn2, static_cast<size_t>(c.n * k)))
        << what << ": normed";
    be.rms_norm_matmul_silu_mul(x, g, kEps, w, normed, gu, act);
    be.matmul_silu_mul(normed2, w, gu2, act2);
    EXPECT_EQ(download<uint16_t>(be, gact, static_cast<size_t>(c.n * m / 2)),
              download<uint16_t>(be, gact2, static_cast<size_t>(c.n * m / 2)))
        << what << ": silu";
  }
}

// A decode chain per layer: rms_norm_matmul (qkv-like, with bias), matmul_add
// into the residual, rms_norm_matmul_silu_mul, matmul_add. Each matmul_add is
// a PDL GEMV writing the residual the next folded norm reads after its
// pdl_wait. Queued back to back and as a graph: bit for bit the ops
// serialised (stream drained after each).
TEST_F(NormMatmulTest, DecodeChainQueuedEqualsSerialised) {
  if (!fold_expected()) GTEST_SKIP() << "OSPREY_FUSED_NORM=0 turns the fold off";
  decode_chain(false);
}

// The same chain on F8_E4M3 weights: the E4M3 folds and GEMVs at one row,
// cuBLASLt's FP8 GEMMs (with their input quantisation) at 4.
TEST_F(NormMatmulTest, Fp8DecodeChainQueuedEqualsSerialised) {
  if (!fold_expected()) GTEST_SKIP() << "OSPREY_FUSED_NORM=0 turns the fold off";
  if (!gpu().supports_fp8_weights(DType::kBF16)) GTEST_SKIP() << "no FP8 tensor cores on this GPU";
  decode_chain(true);
}

// Model::forward with the fold (the default at 16-bit activations) against
// fused_norm = false, same weights, both with the GEMV up to 8 rows
// (gemv_max_rows): a prefill step (GEMM rows: no fold) then decode steps of
// two sequences (GEMV rows: folded); llama (no bias) and qwen2 (qkv bias).
// Logits close (the fold rounds the normed rows as the two ops do; the
// tolerance leaves room for another reduction order).
TEST(NormMatmulModel, FoldedNormForwardMatchesUnfolded) {
  ASSERT_GT(cuda::device_count(), 0);
  if (!fold_expected()) GTEST_SKIP() << "OSPREY_FUSED_NORM=0 turns the fold off";
  if (env_off("OSPREY_FUSED_RESIDUAL")) GTEST_SKIP() << "the fold runs with the fused residual only";
  cuda::CudaBackendOptions on, off;
  on.gemv_max_rows = off.gemv_max_rows = 8;
  off.fused_norm = false;
  auto be_on = cuda::make_cuda_backend(on), be_off = cuda::make_cuda_backend(off);
  ASSERT_NE(be_on, nullptr);
  ASSERT_NE(be_off, nullptr);
  for (const char* fixture : {"llama", "qwen2"}) {
    const std::string path = std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/" + fixture;
    for (const char* dtype : {"bfloat16", "float16"}) {
      const bool bf16 = std::string(dtype) == "bfloat16";
      ModelLoadOptions o;
      o.dtype = dtype;
      auto m_on = Model::load(path, *be_on, o), m_off = Model::load(path, *be_off, o);
      ASSERT_TRUE(m_on.ok()) << m_on.status().to_string();
      ASSERT_TRUE(m_off.ok()) << m_off.status().to_string();
      expect_fused_forward_matches(**m_on, **m_off, bf16 ? 1e-3 : 5e-5, std::string(fixture) + " " + dtype);
    }
  }
}

// The norm weights folded into w_qkv / w_gate_up (folds_norms, the default
// at BF16) against folded_norm = false, same weights: the prompt step (GEMM
// rows: the products of the raw residual, scaled by the ops reading them)
// and decode steps of two sequences: GEMM rows at the default GEMV limit
// (one row: the scaled ops again), GEMV rows with gemv_max_rows = 8
// (rms_norm_matmul* with the unit norm weight). Every fixture folds at BF16
// (qwen2's qkv bias added after the row scale); F16 activations do not.
TEST(NormFoldModel, FoldedWeightsForwardMatchesUnfolded) {
  ASSERT_GT(cuda::device_count(), 0);
  if (env_off("OSPREY_FOLDED_NORM")) GTEST_SKIP() << "OSPREY_FOLDED_NORM=0 turns the fold off";
  if (env_off("OSPREY_FUSED_RESIDUAL")) GTEST_SKIP() << "the fold runs with the fused residual only";
  for (int gemv_rows : {1, 8}) {
    cuda::CudaBackendOptions on, off;
    on.gemv_max_rows = off.gemv_max_rows = gemv_rows;
    off.folded_norm = false;
    auto be_on = cuda::make_cuda_backend(on), be_off = cuda::make_cuda_backend(off);
    ASSERT_NE(be_on, nullptr);
    ASSERT_NE(be_off, nullptr);
    for (const char* fixture : {"llama", "qwen2", "qwen3", "mistral"}) {
      const std::string path = std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/" + fixture;
      for (const char* dtype : {"bfloat16", "float16"}) {
        const bool bf16 = std::string(dtype) == "bfloat16";
        const std::string tag = std::string(fixture) + " " + dtype + " gemv_max_rows " + std::to_string(gemv_rows);
        ModelLoadOptions o;
        o.dtype = dtype;
        auto m_on = Model::load(path, *be_on, o), m_off = Model::load(path, *be_off, o);
        ASSERT_TRUE(m_on.ok()) << m_on.status().to_string();
        ASSERT_TRUE(m_off.ok()) << m_off.status().to_string();
        EXPECT_EQ((*m_on)->norms_folded(), bf16) << tag;
        EXPECT_FALSE((*m_off)->norms_folded()) << tag;
        expect_fused_forward_matches(**m_on, **m_off, bf16 ? 1e-3 : 5e-5, tag);
      }
    }
  }
}

}  // namespace
}  // namespace osprey::gpu_test
