// The CUDA side of the RMSNorm folding (ops/backend.h, "RMSNorm weights
// folded into the projections"): scale_columns bit for bit against the host
// default (Backend::scale_columns on the CPU backend), rms_scaled_silu_mul
// against a host reference, rms_scaled_qkv_rope_kv_write against
// qkv_rope_kv_write of rows scaled on the host (both kernel paths), and the
// folds_norms switch.
//
// The row-scale inputs x hold values m * 2^s (integers |m| <= 15, one s per
// row, d <= 8192): every partial sum of squares is a multiple of 4^s below
// 2^24 * 4^s, so the fp32 sum is exact in any order and the GPU's block
// reduction gives the host's inv = 1 / sqrt(ss / d + eps) bit for bit (IEEE
// division and square root on both sides). The scaled values, rounded to the
// activation dtype, are then the same on both sides too: what is left to
// differ is expf (SiLU) alone, and nothing at all for the qkv path, which
// therefore must match bit for bit. Rows with s = 6 (|x| up to 960) show
// the scale at work on large residuals; one row is all zeros (inv =
// 1 / sqrt(eps)).
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "gpu_test_util.h"
#include "ops/rope_freq.h"

namespace osprey::gpu_test {
namespace {

constexpr float kXEps = 1e-5f;

size_t act_size(DType t) { return t == DType::kF32 ? 4 : 2; }

float round_act(DType t, float v) {
  switch (t) {
    case DType::kBF16:
      return bf16_to_f32(f32_to_bf16(v));
    case DType::kF16:
      return fp16_to_f32(f32_to_fp16(v));
    default:
      return v;
  }
}

// v stored as dtype t (F32, F16 or BF16, round to nearest even): the bytes,
// a device copy, and back to floats.
std::vector<uint8_t> act_bytes(DType t, const std::vector<float>& v) {
  return pack(t, v, 1, static_cast<int64_t>(v.size()));
}
DeviceMem upload_act(ops::Backend& be, DType t, const std::vector<float>& v) {
  const auto b = act_bytes(t, v);
  return upload_bytes(be, b.data(), b.size());
}
std::vector<float> act_floats(DType t, const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / act_size(t));
  dequantize_row(t, b.data(), v.data(), static_cast<int64_t>(v.size()));
  return v;
}

// One unit in the last place of dtype t at magnitude |v| (the subnormal
// step at the bottom of the range).
double ulp_of(DType t, double v) {
  const int mant = t == DType::kBF16 ? 7 : (t == DType::kF16 ? 10 : 23);
  const double min_ulp = std::ldexp(1.0, t == DType::kF16 ? -24 : (t == DType::kBF16 ? -133 : -149));
  if (v == 0.0) return min_ulp;
  int e = 0;
  (void)std::frexp(std::fabs(v), &e);  // |v| in [2^(e - 1), 2^e)
  return std::max(std::ldexp(1.0, e - 1 - mant), min_ulp);
}

// x [n, d]: row t holds m * 2^s with integers m in [-15, 15] and s =
// kShifts[t % 4] (row 3 all zeros); see the top of the file. rms[t]: the
// row's RMS (0 for the zero row).
constexpr int kShifts[4] = {-5, 0, 6, 3};
std::vector<float> exact_rows(int64_t n, int64_t d, uint32_t seed, std::vector<float>* rms) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> m(-15, 15);
  std::vector<float> x(static_cast<size_t>(n * d));
  rms->assign(static_cast<size_t>(n), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    if (t == 3) continue;
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      const float v = std::ldexp(static_cast<float>(m(rng)), kShifts[t % 4]);
      x[static_cast<size_t>(t * d + i)] = v;
      ss += static_cast<double>(v) * v;
    }
    (*rms)[static_cast<size_t>(t)] = static_cast<float>(std::sqrt(ss / static_cast<double>(d)));
  }
  return x;
}

// inv_t as the host default (ops/norm_fold.cpp) computes it: a sequential
// fp32 sum, exact for exact_rows.
std::vector<float> host_inv_rms(const std::vector<float>& x, int64_t n, int64_t d, float eps) {
  std::vector<float> inv(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    float ss = 0.0f;
    for (int64_t i = 0; i < d; ++i) {
      const float v = x[static_cast<size_t>(t * d + i)];
      ss += v * v;
    }
    inv[static_cast<size_t>(t)] = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  }
  return inv;
}

// [n, cols] values of the size a projection of the raw residual gives:
// uniform in [-2, 2] times the row's RMS (2e-3 for the zero row), rounded
// to t.
std::vector<float> raw_product(DType t, int64_t n, int64_t cols, const std::vector<float>& rms, uint32_t seed) {
  std::vector<float> v = random_floats(static_cast<size_t>(n * cols), seed, -2.0f, 2.0f);
  for (int64_t r = 0; r < n; ++r) {
    const float s = rms[static_cast<size_t>(r)] > 0.0f ? rms[static_cast<size_t>(r)] : 1e-3f;
    for (int64_t i = 0; i < cols; ++i) {
      float& e = v[static_cast<size_t>(r * cols + i)];
      e = round_act(t, e * s);
    }
  }
  return v;
}

class NormFold : public GpuTest {};

// ---- folds_norms -----------------------------------------------------------------

TEST_F(NormFold, FoldsNormsForBf16Only) {
  const char* env = std::getenv("OSPREY_FOLDED_NORM");
  const bool env_off = env != nullptr && std::strcmp(env, "0") == 0;
  EXPECT_EQ(gpu().folds_norms(DType::kBF16), !env_off) << "OSPREY_FOLDED_NORM=" << (env ? env : "(unset)");
  EXPECT_FALSE(gpu().folds_norms(DType::kF16));
  EXPECT_FALSE(gpu().folds_norms(DType::kF32));
  cuda::CudaBackendOptions o;
  o.folded_norm = false;
  auto off = cuda::make_cuda_backend(o);
  ASSERT_NE(off, nullptr);
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) EXPECT_FALSE(off->folds_norms(t)) << dtype_name(t);
  EXPECT_FALSE(cpu().folds_norms(DType::kF32));
}

// ---- scale_columns ---------------------------------------------------------------

// Every dtype and odd shapes, 16-byte aligned (the vectorised path where k %
// 8 == 0) and one element off (the scalar path): the bytes of the host
// default, bit for bit. The scale has zeros, negatives and large values.
TEST_F(NormFold, ScaleColumnsMatchesHostBitForBit) {
  struct Shape {
    int64_t m, k;
  };
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Shape sh : {Shape{37, 100}, Shape{3, 4096}, Shape{5, 13}, Shape{1, 8}, Shape{64, 2048}}) {
      for (int64_t offset : {0, 1}) {
        const int64_t count = sh.m * sh.k;
        const auto w = random_floats(static_cast<size_t>(count), 30 + static_cast<uint32_t>(sh.k), -2.0f, 2.0f);
        auto s = random_floats(static_cast<size_t>(sh.k), 31, 0.05f, 3.0f);
        s[0] = 0.0f;
        if (sh.k > 2) s[2] = -1.5f;
        if (sh.k > 5) s[5] = 37.0f;
        // Host default on the CPU backend.
        std::vector<uint8_t> want = act_bytes(t, w);
        std::vector<float> hs = s;
        Tensor hw(want.data(), t, {sh.m, sh.k});
        cpu().scale_columns(hw, Tensor(hs.data(), DType::kF32, {sh.k}));
        // GPU, w starting `offset` elements into its buffer.
        std::vector<uint8_t> padded(static_cast<size_t>(offset) * act_size(t), 0);
        const auto wb = act_bytes(t, w);
        padded.insert(padded.end(), wb.begin(), wb.end());
        auto gw = upload_bytes(gpu(), padded.data(), padded.size());
        auto gs = upload(gpu(), s);
        Tensor dw(static_cast<char*>(gw.get()) + offset * static_cast<int64_t>(act_size(t)), t, {sh.m, sh.k},
                  Device::kCuda);
        gpu().scale_columns(dw, dev_tensor(gs, DType::kF32, {sh.k}));
        auto got = download<uint8_t>(gpu(), gw, padded.size());
        got.erase(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(offset * static_cast<int64_t>(act_size(t))));
        const std::string what = std::string(dtype_name(t)) + " " + std::to_string(sh.m) + "x" +
                                 std::to_string(sh.k) + " offset " + std::to_string(offset);
        ASSERT_EQ(got.size(), want.size()) << what;
        EXPECT_TRUE(got == want) << what;
        EXPECT_FALSE(want == wb) << what << ": the scale must change w";
      }
    }
  }
}

// ---- rms_scaled_silu_mul --------------------------------------------------------

// out[t, j] = silu(g) * u, g and u the gate/up values times inv_t rounded to
// t; the product in fp32 as the kernel computes it, rounded once.
std::vector<float> host_rms_scaled_silu_mul(DType t, const std::vector<float>& gate_up, const std::vector<float>& inv,
                                            int64_t n, int64_t f) {
  std::vector<float> out(static_cast<size_t>(n * f));
  for (int64_t r = 0; r < n; ++r) {
    const float s = inv[static_cast<size_t>(r)];
    for (int64_t j = 0; j < f; ++j) {
      const float g = round_act(t, gate_up[static_cast<size_t>(r * 2 * f + j)] * s);
      const float u = round_act(t, gate_up[static_cast<size_t>(r * 2 * f + f + j)] * s);
      out[static_cast<size_t>(r * f + j)] = round_act(t, g / (1.0f + std::exp(-g)) * u);
    }
  }
  return out;
}

// Runs the op on device copies of x [n, d] (starting x_offset elements into
// its buffer) and gate_up [n, 2 f]; checks against the host reference. Only
// expf differs: 16-bit outputs within 1 ulp and at least 99% bit-equal,
// F32 within 8 ulps.
void check_silu(ops::Backend& gpu, DType t, int64_t n, int64_t f, int64_t d, int64_t x_offset,
                const std::string& what) {
  std::vector<float> rms;
  const auto x = exact_rows(n, d, 40 + static_cast<uint32_t>(n + f), &rms);
  const auto gate_up = raw_product(t, n, 2 * f, rms, 41 + static_cast<uint32_t>(n * 3 + f));
  const auto want = host_rms_scaled_silu_mul(t, gate_up, host_inv_rms(x, n, d, kXEps), n, f);

  std::vector<float> xp(static_cast<size_t>(x_offset), 0.0f);
  xp.insert(xp.end(), x.begin(), x.end());
  auto gx = upload_act(gpu, t, xp);
  auto gg = upload_act(gpu, t, gate_up);
  DeviceMem go(gpu, static_cast<size_t>(n * f) * act_size(t));
  const Tensor dx(static_cast<char*>(gx.get()) + x_offset * static_cast<int64_t>(act_size(t)), t, {n, d},
                  Device::kCuda);
  Tensor dout = dev_tensor(go, t, {n, f});
  gpu.rms_scaled_silu_mul(dx, kXEps, dev_tensor(gg, t, {n, 2 * f}), dout);
  const auto got = act_floats(t, download<uint8_t>(gpu, go, static_cast<size_t>(n * f) * act_size(t)));

  ASSERT_EQ(got.size(), want.size()) << what;
  const double ulps = t == DType::kF32 ? 8.0 : 1.0;
  size_t equal = 0, bad = 0, nonzero = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    equal += g == w ? 1 : 0;
    nonzero += w != 0.0 ? 1 : 0;
    if (!(std::fabs(g - w) <= ulps * ulp_of(t, std::max(std::fabs(g), std::fabs(w))))) {
      if (bad++ < 5) ADD_FAILURE() << what << ": out[" << i / f << ", " << i % f << "] = " << g << ", want " << w;
    }
  }
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_GT(nonzero, got.size() / 2) << what << ": the reference must not be mostly zeros";
  if (t != DType::kF32) {
    EXPECT_GE(equal, got.size() * 99 / 100) << what << ": bit-equal outputs";
  }
}

TEST_F(NormFold, RmsScaledSiluMulMatchesHost) {
  struct Shape {
    int64_t f, d;
  };
  // f 14336 (Llama-3-8B, the 16-byte path for 16-bit), 24 (16-byte path, odd
  // chunking), 13 (one column at a time); d 4096 and 64 (16-byte reduction),
  // 20 (scalar reduction).
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (Shape sh : {Shape{14336, 4096}, Shape{24, 64}, Shape{13, 20}}) {
      // 600 and 1500 rows: the row-factor pass, then silu_mul with the factors.
      for (int64_t n : {1, 5, 96, 300, 600, 1500}) {
        check_silu(gpu(), t, n, sh.f, sh.d, 0,
                   std::string(dtype_name(t)) + " n=" + std::to_string(n) + " f=" + std::to_string(sh.f) +
                       " d=" + std::to_string(sh.d));
      }
    }
  }
}

// x one element off 16-byte alignment (the scalar reduction at d % 8 == 0),
// and 70001 rows (through the backend's row-factor pass).
TEST_F(NormFold, RmsScaledSiluMulUnalignedXAndManyRows) {
  check_silu(gpu(), DType::kBF16, 37, 2048, 64, 1, "bf16 x offset 1");
  check_silu(gpu(), DType::kF16, 9, 24, 4096, 1, "f16 x offset 1");
  check_silu(gpu(), DType::kBF16, 70001, 16, 8, 0, "bf16 n=70001");
}

// The test's host reference against the host default of the op
// (Backend::rms_scaled_silu_mul on the CPU backend, F32): the same function.
TEST_F(NormFold, HostReferenceAgreesWithBackendDefault) {
  const int64_t n = 7, f = 40, d = 64;
  std::vector<float> rms;
  auto x = exact_rows(n, d, 50, &rms);
  auto gate_up = raw_product(DType::kF32, n, 2 * f, rms, 51);
  const auto want = host_rms_scaled_silu_mul(DType::kF32, gate_up, host_inv_rms(x, n, d, kXEps), n, f);
  std::vector<float> out(static_cast<size_t>(n * f));
  Tensor to(out.data(), DType::kF32, {n, f});
  cpu().rms_scaled_silu_mul(Tensor(x.data(), DType::kF32, {n, d}), kXEps,
                            Tensor(gate_up.data(), DType::kF32, {n, 2 * f}), to);
  expect_close(out, want, 1e-10, 1e-5, "cpu default vs test reference");
}

// ---- rms_scaled_qkv_rope_kv_write ------------------------------------------------

struct QkvCase {
  int hq, hk, hd, rotary_dim;
  bool norm;
  int64_t d;  // x columns
  const char* path;
};

// The op on the raw projection against qkv_rope_kv_write of the rows scaled
// on the host (inv_t exact, values rounded to t): q_out and both page pools
// bit for bit, pages of the activation dtype.
void check_qkv(ops::Backend& gpu, DType t, const QkvCase& c, int n, bool with_bias) {
  const std::string what = std::string(dtype_name(t)) + " " + c.path + " hq=" + std::to_string(c.hq) +
                           " hk=" + std::to_string(c.hk) + " hd=" + std::to_string(c.hd) +
                           " rot=" + std::to_string(c.rotary_dim) + (c.norm ? " norm" : "") +
                           " d=" + std::to_string(c.d) + " n=" + std::to_string(n) + (with_bias ? " bias" : "");
  const int bs = 4, num_blocks = std::max(16, n / bs + 4), num_slots = bs * num_blocks;
  ASSERT_LE(n, num_slots);
  const int64_t cols = int64_t{c.hq + 2 * c.hk} * c.hd;
  std::vector<float> rms;
  const auto x = exact_rows(n, c.d, 60 + static_cast<uint32_t>(c.hd), &rms);
  const auto qkv = raw_product(t, n, cols, rms, 61 + static_cast<uint32_t>(c.hq));
  const auto inv = host_inv_rms(x, n, c.d, kXEps);
  // The bias (Qwen2's qkv bias) is added after the scale, as fmaf(v, inv, b).
  const auto bias = random_floats(static_cast<size_t>(cols), 65, -0.5f, 0.5f);
  std::vector<float> scaled(qkv.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < cols; ++i) {
      const size_t e = static_cast<size_t>(r * cols + i);
      const float s = inv[static_cast<size_t>(r)];
      scaled[e] = round_act(t, with_bias ? std::fmaf(qkv[e], s, bias[static_cast<size_t>(i)]) : qkv[e] * s);
    }
  }
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = 5 * i + 700 * (i % 4);
  const auto slots = shuffled_slots(n, num_slots, 62, 1, 3);  // every third token skipped
  const auto inv_freq = ops::make_rope_inv_freq(500000.0f, c.rotary_dim, {});
  const auto qn = random_floats(static_cast<size_t>(c.hd), 63, 0.5f, 1.5f);
  const auto kn = random_floats(static_cast<size_t>(c.hd), 64, 0.5f, 1.5f);

  auto gpos = upload(gpu, pos), gslots = upload(gpu, slots), gfreq = upload(gpu, inv_freq);
  auto gqn = upload(gpu, qn), gkn = upload(gpu, kn), gbias = upload(gpu, bias);
  const Tensor qkv_bias = with_bias ? dev_tensor(gbias, DType::kF32, {cols}) : Tensor();
  auto gx = upload_act(gpu, t, x), graw = upload_act(gpu, t, qkv), gscaled = upload_act(gpu, t, scaled);
  ops::AttentionBatch b;
  b.num_tokens = n;
  b.positions = gpos.as<int32_t>();
  b.slot_mapping = gslots.as<int32_t>();
  ops::RopeTable rt;
  rt.inv_freq = gfreq.as<float>();
  rt.rotary_dim = c.rotary_dim;
  const Tensor q_norm = c.norm ? dev_tensor(gqn, DType::kF32, {c.hd}) : Tensor();
  const Tensor k_norm = c.norm ? dev_tensor(gkn, DType::kF32, {c.hd}) : Tensor();
  const size_t page_bytes = static_cast<size_t>(num_slots) * c.hk * c.hd * act_size(t);
  const size_t q_bytes = static_cast<size_t>(n) * c.hq * c.hd * act_size(t);

  struct Out {
    DeviceMem k, v, q;
  };
  auto run = [&](bool fused) {
    Out o{DeviceMem(gpu, page_bytes), DeviceMem(gpu, page_bytes), DeviceMem(gpu, q_bytes)};  // zeroed by alloc
    ops::LayerKv kv{dev_tensor(o.k, t, {num_blocks, bs, c.hk, c.hd}), dev_tensor(o.v, t, {num_blocks, bs, c.hk, c.hd})};
    Tensor q = dev_tensor(o.q, t, {n, c.hq, c.hd});
    if (fused) {
      gpu.rms_scaled_qkv_rope_kv_write(dev_tensor(gx, t, {n, c.d}), kXEps, dev_tensor(graw, t, {n, cols}), qkv_bias,
                                       q_norm, k_norm, 1e-6f, rt, b, kv, q);
    } else {
      gpu.qkv_rope_kv_write(dev_tensor(gscaled, t, {n, cols}), q_norm, k_norm, 1e-6f, rt, b, kv, q);
    }
    return o;
  };
  const Out got = run(true);
  const Out want = run(false);
  const auto q_got = download<uint8_t>(gpu, got.q, q_bytes), q_want = download<uint8_t>(gpu, want.q, q_bytes);
  EXPECT_TRUE(q_got == q_want) << what << ": q_out";
  const std::vector<uint8_t> zeros(page_bytes, 0);
  for (int kv = 0; kv < 2; ++kv) {
    const auto pg = download<uint8_t>(gpu, kv == 0 ? got.k : got.v, page_bytes);
    const auto pw = download<uint8_t>(gpu, kv == 0 ? want.k : want.v, page_bytes);
    EXPECT_TRUE(pg == pw) << what << (kv == 0 ? ": k pages" : ": v pages");
    EXPECT_FALSE(pw == zeros) << what << ": the reference must write pages";
  }
  // The scaled rows stay in range (F16 included): q_out all finite.
  const auto qf = act_floats(t, q_want);
  size_t finite = 0;
  for (float v : qf) finite += std::isfinite(v) ? 1 : 0;
  EXPECT_EQ(finite, qf.size()) << what << ": q_out finite";
}

TEST_F(NormFold, RmsScaledQkvRopeKvWriteMatchesScaledRows) {
  const QkvCase cases[] = {
      // qkv_rope_vec_kernel: full rotary, hd / 16 a power of two, aligned tensors.
      {8, 2, 128, 128, false, 4096, "vec"},
      {8, 2, 128, 128, true, 36, "vec"},
      {16, 8, 128, 128, true, 4096, "vec"},
      {4, 1, 64, 64, false, 20, "vec"},
      // qkv_rope_kernel: partial rotary, or hd / 16 not a power of two (blocks of < 8 warps).
      {4, 2, 64, 32, false, 4096, "generic"},
      {4, 2, 64, 32, true, 36, "generic"},
      {2, 1, 80, 80, false, 64, "generic"},
      {2, 1, 80, 80, true, 4096, "generic"},
      {16, 4, 96, 48, true, 512, "generic"},
  };
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (const QkvCase& c : cases) {
      // 700 rows: the row factors from a pass of their own (above the backend's kRowScalePassRows).
      for (int n : {1, 13, 700}) check_qkv(gpu(), t, c, n, false);
      for (int n : {1, 13, 700}) check_qkv(gpu(), t, c, n, true);  // with a qkv bias (Qwen2)
    }
  }
}

}  // namespace
}  // namespace osprey::gpu_test
