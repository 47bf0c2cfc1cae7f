// Backend::quantize_weight_fp8's host default: the reference recipe of the
// FP8 weights (ops/backend.h), on weights in host memory.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "ops/backend.h"

namespace osprey::ops {

void Backend::check_quantize_weight_fp8_args(const Tensor& w, const Tensor& q) {
  OSP_CHECK_MSG(w.dtype() == DType::kF32 || w.dtype() == DType::kF16 || w.dtype() == DType::kBF16,
                "quantize_weight_fp8: w must be F32, F16 or BF16, got " << dtype_name(w.dtype()));
  OSP_CHECK_MSG(q.dtype() == DType::kF8E4M3, "quantize_weight_fp8: q must be F8_E4M3");
  OSP_CHECK(w.ndim() == 2 && q.ndim() == 2 && w.dim(0) == q.dim(0) && w.dim(1) == q.dim(1));
}

Status Backend::quantize_weight_fp8(const Tensor& w, Tensor& q) {
  OSP_CHECK_MSG(w.device() == Device::kCpu && q.device() == Device::kCpu,
                "quantize_weight_fp8: this backend's default takes host tensors");
  check_quantize_weight_fp8_args(w, q);
  const int64_t m = w.rows(), k = w.cols();
  std::vector<float> row(static_cast<size_t>(k));
  float amax = 0.0f;
  const auto* src = static_cast<const char*>(w.data());
  const int64_t row_bytes = dtype_row_bytes(w.dtype(), k);
  for (int64_t r = 0; r < m; ++r) {
    dequantize_row(w.dtype(), src + r * row_bytes, row.data(), k);
    for (float v : row) {
      if (!std::isfinite(v)) return invalid_argument("a non-finite weight in row " + std::to_string(r));
      amax = std::fmax(amax, std::fabs(v));
    }
  }
  const float inv = amax > 0.0f ? kF8E4M3Max / amax : 1.0f;
  const float scale = amax > 0.0f ? amax / kF8E4M3Max : 1.0f;
  auto* dst = static_cast<uint8_t*>(q.data());
  for (int64_t r = 0; r < m; ++r) {
    dequantize_row(w.dtype(), src + r * row_bytes, row.data(), k);
    for (int64_t i = 0; i < k; ++i) dst[r * k + i] = f32_to_f8e4m3(row[static_cast<size_t>(i)] * inv);
  }
  std::memcpy(dst + fp8_scale_offset(m, k), &scale, sizeof(scale));
  return {};
}

}  // namespace osprey::ops
