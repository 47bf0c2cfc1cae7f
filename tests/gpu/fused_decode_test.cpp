// Backend::matmul_silu_mul on CUDA: at one activation row of 16-bit weights
// it is one kernel (gemm/gemv.cu, launch_gemv_silu_mul) that must give
// exactly what matmul then silu_mul give (the gate_up scratch is left
// unwritten), near a double-precision reference; more rows take the two-op
// path. (The batch-1 decode chain with it, queued and as a graph against the
// serialised ops, is MatmulTest.DecodeChainQueuedEqualsSerialised.)
#include <cmath>
#include <cstdlib>

#include "gpu_test_util.h"

namespace osprey::gpu_test {
namespace {

std::vector<uint8_t> pack16(DType t, const std::vector<float>& v) {
  return pack(t, v, 1, static_cast<int64_t>(v.size()));
}

bool fused_switched_off() {
  const char* v = std::getenv("OSPREY_FUSED_SILU");
  return v != nullptr && std::string(v) == "0";
}

// out = silu(x W_g^T) * (x W_u^T) for x [n, k] of act, w [2 f, k] of wt.
void check_matmul_silu_mul(ops::Backend& be, DType act, DType wt, int64_t n, int64_t f, int64_t k, uint32_t seed) {
  const std::string what = std::string(dtype_name(act)) + " x " + std::string(dtype_name(wt)) +
                           " n=" + std::to_string(n) + " f=" + std::to_string(f) + " k=" + std::to_string(k);
  const auto xb = pack16(act, random_floats(static_cast<size_t>(n * k), seed, -1.0f, 1.0f));
  const auto wb = pack(wt, random_floats(static_cast<size_t>(2 * f * k), seed + 1, -0.1f, 0.1f), 2 * f, k);
  const auto xd = unpack(act, xb, n, k);
  const auto wd = unpack(wt, wb, 2 * f, k);
  const auto round_act = [&](double v) {
    const auto r = unpack(act, pack16(act, {static_cast<float>(v)}), 1, 1);
    return r[0];
  };
  std::vector<double> ref(static_cast<size_t>(n * f));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < f; ++j) {
      double g = 0.0, u = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double x = xd[static_cast<size_t>(i * k + c)];
        g += x * wd[static_cast<size_t>(j * k + c)];
        u += x * wd[static_cast<size_t>((f + j) * k + c)];
      }
      g = round_act(g);
      u = round_act(u);
      ref[static_cast<size_t>(i * f + j)] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  const std::vector<uint8_t> poison_gu(static_cast<size_t>(n * 2 * f * 2), 0xff);  // NaN in F16 and BF16
  const std::vector<uint8_t> poison_out(static_cast<size_t>(n * f * 2), 0xff);
  DeviceMem gx = upload(be, xb), gw = upload(be, wb);
  DeviceMem ggu = upload(be, poison_gu), gout = upload(be, poison_out);
  DeviceMem ggu2 = upload(be, poison_gu), gout2 = upload(be, poison_out);
  Tensor x = dev_tensor(gx, act, {n, k}), w = dev_tensor(gw, wt, {2 * f, k});
  Tensor gu = dev_tensor(ggu, act, {n, 2 * f}), out = dev_tensor(gout, act, {n, f});
  Tensor gu2 = dev_tensor(ggu2, act, {n, 2 * f}), out2 = dev_tensor(gout2, act, {n, f});
  be.matmul_silu_mul(x, w, gu, out);
  be.matmul(x, w, Tensor(), gu2);
  be.silu_mul(gu2, out2);
  const auto fused = download<uint8_t>(be, gout, poison_out.size());
  EXPECT_EQ(fused, download<uint8_t>(be, gout2, poison_out.size())) << what << ": not bit for bit the two ops";
  const bool w16 = wt == DType::kBF16 || wt == DType::kF16;
  if (n == 1 && w16 && !fused_switched_off()) {
    EXPECT_EQ(download<uint8_t>(be, ggu, poison_gu.size()), poison_gu) << what << ": gate_up written (not fused)";
  }
  const auto got = unpack(act, fused, n, f);
  // Rounding: g and u to act, the output to act (2^-9 relative for BF16).
  // A sum on the other side of a rounding boundary moves g or u by one ulp.
  const bool bf16 = act == DType::kBF16;
  expect_close(std::vector<double>(got.begin(), got.end()), ref, bf16 ? 3e-5 : 1e-6, bf16 ? 1.6e-2 : 2e-3, what);
}

class FusedDecodeTest : public GpuTest {};

TEST_F(FusedDecodeTest, MatmulSiluMulMatchesTwoOpsAndReference) {
  uint32_t seed = 7000;
  for (DType act : {DType::kBF16, DType::kF16}) {
    for (DType wt : {DType::kBF16, DType::kF16}) {
      check_matmul_silu_mul(gpu(), act, wt, 1, 4, 8, seed += 7);        // one block
      check_matmul_silu_mul(gpu(), act, wt, 1, 37, 40, seed += 7);      // f % 4 != 0: the last block's tail
      check_matmul_silu_mul(gpu(), act, wt, 1, 1024, 2056, seed += 7);  // k not a multiple of the lane stride
    }
    check_matmul_silu_mul(gpu(), act, act, 3, 64, 256, seed += 7);  // more rows: the two-op path
  }
  check_matmul_silu_mul(gpu(), DType::kBF16, DType::kBF16, 1, 14336 / 8, 4096, seed += 7);
  check_matmul_silu_mul(gpu(), DType::kBF16, DType::kQ8_0, 1, 64, 256, seed += 7);  // not 16-bit: two ops
}

}  // namespace
}  // namespace osprey::gpu_test
