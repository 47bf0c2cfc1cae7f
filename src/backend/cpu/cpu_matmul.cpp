// CpuBackend::matmul: out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]).
//
// Small n (decode): GEMV kernels, parallel over weight rows; each weight block
// is dequantised in registers once and dotted with all n activation rows.
// Large n (prefill): parallel over panels of panel_rows_ weight rows; a
// thread dequantises its panel once into fp32 scratch [panel_rows, k] and
// multiplies every activation row against it, so the dequantisation cost is
// spread over n rows. No weight matrix is ever dequantised whole.
// With quantize_activations, Q8_0/Q4_0/Q4_1 weights go to matmul_q8 for every
// n instead (cpu_matmul_q8.cpp).
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"

namespace osprey::cpu {

void CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  OSP_CHECK_MSG(x.dtype() == DType::kF32 && out.dtype() == DType::kF32, "matmul: x and out must be F32");
  OSP_CHECK_EQ(w.ndim(), 2);
  const int64_t k = x.cols();
  const int64_t n = x.rows();
  const int64_t m = w.dim(0);
  OSP_CHECK_MSG(w.dim(1) == k, "matmul: w " << w.shape_string() << " vs x " << x.shape_string());
  OSP_CHECK_MSG(out.rows() == n && out.cols() == m,
                "matmul: out " << out.shape_string() << " vs n " << n << ", m " << m);
  WeightFormat f;
  OSP_CHECK_MSG(weight_format_of(w.dtype(), &f), "matmul: unsupported weight dtype " << dtype_name(w.dtype()));
  if (dtype_is_quantized(w.dtype())) OSP_CHECK_EQ(k % kQuantBlock, 0);
  const float* b = nullptr;
  if (bias.defined()) {
    OSP_CHECK(bias.dtype() == DType::kF32 && bias.numel() == m);
    b = bias.data_as<float>();
  }
  if (n == 0 || m == 0) return;
  if (q8_ != nullptr && q8_format_supported(f)) {
    matmul_q8(x, w, f, b, out.data_as<float>());
  } else if (n <= gemv_max_rows_) {
    matmul_gemv(x, w, f, b, out.data_as<float>());
  } else {
    matmul_panels(x, w, f, b, out.data_as<float>());
  }
}

void CpuBackend::matmul_gemv(const Tensor& x, const Tensor& w, WeightFormat f, const float* bias, float* out) {
  const int64_t k = x.cols();
  const int n = static_cast<int>(x.rows());
  const int64_t m = w.dim(0);
  const float* xp = x.data_as<float>();
  const float* xsum = nullptr;
  if (f == WeightFormat::kQ4_1) {
    const int64_t nb = k / kQuantBlock;
    float* s = shared_scratch_.get(static_cast<size_t>(n * nb));
    for (int i = 0; i < n; ++i) kernels_->block_sums(xp + i * k, k, s + i * nb);
    xsum = s;
  }
  const GemvFn gemv = kernels_->gemv[static_cast<int>(f)];
  const void* wp = w.data();
  const int64_t rb = w.row_bytes();
  for_range(m, k * n, [&](int64_t r0, int64_t r1) {
    gemv(wp, rb, k, xp, k, xsum, n, out, m, r0, r1);
    if (bias) {
      for (int i = 0; i < n; ++i)
        for (int64_t r = r0; r < r1; ++r) out[i * m + r] += bias[r];
    }
  });
}

void CpuBackend::matmul_panels(const Tensor& x, const Tensor& w, WeightFormat f, const float* bias, float* out) {
  const int64_t k = x.cols();
  const int n = static_cast<int>(x.rows());
  const int64_t m = w.dim(0);
  const int64_t pr = panel_rows_;
  const int64_t num_panels = (m + pr - 1) / pr;
  const float* xp = x.data_as<float>();
  const char* wp = static_cast<const char*>(w.data());
  const int64_t rb = w.row_bytes();
  const DequantRowsFn dequant = kernels_->dequant[static_cast<int>(f)];
  const PanelGemmFn gemm = kernels_->panel_gemm;
  for_range(num_panels, pr * k * n, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = p * pr;
      const int rows = static_cast<int>(std::min(pr, m - r0));
      const float* panel;
      if (f == WeightFormat::kF32) {
        panel = reinterpret_cast<const float*>(wp + r0 * rb);
      } else {
        float* s = thread_scratch(0).get(static_cast<size_t>(pr * k));
        dequant(wp + r0 * rb, rb, k, rows, s);
        panel = s;
      }
      gemm(xp, k, n, panel, rows, k, out + r0, m);
      if (bias) {
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < rows; ++j) out[i * m + r0 + j] += bias[r0 + j];
      }
    }
  });
}

}  // namespace osprey::cpu
