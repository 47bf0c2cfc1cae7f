// CpuBackend::matmul_q8: the opt-in 8-bit activation matmul (cpu_q8.h),
// out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]) for Q8_0 / Q4_0 / Q4_1 weights.
//
// The n activation rows are quantised once (rows split over the pool), then
// the pool splits the weight rows into ranges of whole panels; each thread
// unpacks kQ8PanelRows weight rows at a time into its scratch and multiplies
// them against all n quantised rows. The same kernel serves every n, so an
// output row depends only on its own activation row (batch invariance).
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"

namespace osprey::cpu {

void CpuBackend::matmul_q8(const Tensor& x, const Tensor& w, WeightFormat f, const float* bias, float* out) {
  const int64_t k = x.cols();
  const int n = static_cast<int>(x.rows());
  const int64_t m = w.dim(0);
  const float* xp = x.data_as<float>();
  const int64_t xrb = q8_act_row_bytes(k);
  // Scratch is fp32-typed and 64-byte aligned; rows are multiples of 32 bytes.
  auto* xq = reinterpret_cast<uint8_t*>(q8_act_.get(static_cast<size_t>((n * xrb + 3) / 4)));
  const Q8QuantizeFn quantize = q8_->quantize;
  const int32_t act_bias = q8_->act_bias[static_cast<int>(f)];
  for_range(n, 4 * k, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) quantize(xp + i * k, k, act_bias, xq + i * xrb);
  });
  const Q8GemmFn gemm = q8_->gemm;
  const void* wp = w.data();
  const int64_t rb = w.row_bytes();
  const int64_t num_panels = (m + kQ8PanelRows - 1) / kQ8PanelRows;
  const size_t scratch_floats = static_cast<size_t>((q8_gemm_scratch_bytes(k) + 3) / 4);
  // Cost of a panel in fp32-FMA equivalents: unpacking a weight row costs
  // about as much as 4 activation rows' integer dot products, and those run
  // ~4x faster per element than fp32 FMAs.
  for_range(num_panels, kQ8PanelRows * k * (n + 4) / 4, [&](int64_t p0, int64_t p1) {
    auto* scratch = reinterpret_cast<uint8_t*>(thread_scratch(0).get(scratch_floats));
    const int64_t r0 = p0 * kQ8PanelRows;
    const int64_t r1 = std::min(m, p1 * kQ8PanelRows);
    gemm(wp, rb, f, k, xq, xrb, n, out, m, r0, r1, scratch);
    if (bias) {
      for (int i = 0; i < n; ++i)
        for (int64_t r = r0; r < r1; ++r) out[i * m + r] += bias[r];
    }
  });
}

}  // namespace osprey::cpu
