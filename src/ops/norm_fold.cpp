// Backend's defaults for the norm folding ops (backend.h): host memory, any
// float dtype, written for clarity (the CPU backend does not fold; these
// serve tests and any host-memory backend that claims folds_norms).
#include <cmath>
#include <vector>

#include "core/check.h"
#include "ops/backend.h"

namespace osprey::ops {
namespace {

// Host tensors of a float dtype only: the rows go through core's row
// conversions (dequantize_row / quantize_row, round to nearest even).
void check_host(const Tensor& t, const char* what) {
  OSP_CHECK_MSG(t.device() == Device::kCpu, what << ": the default norm folding ops take host memory");
  OSP_CHECK_MSG(t.dtype() == DType::kF32 || t.dtype() == DType::kF16 || t.dtype() == DType::kBF16,
                what << ": norm folding takes F32, F16 or BF16, got " << dtype_name(t.dtype()));
}

// Calls f(r, row) with row t of y as floats [cols]; writes the row back
// rounded to y's dtype into dst's row r (dst: same shape and dtype).
template <class F>
void map_rows(const Tensor& y, Tensor& dst, F f) {
  std::vector<float> row(static_cast<size_t>(y.cols()));
  for (int64_t r = 0; r < y.rows(); ++r) {
    dequantize_row(y.dtype(), y.row(r), row.data(), y.cols());
    f(r, row.data());
    quantize_row(dst.dtype(), row.data(), dst.row(r), dst.cols());
  }
}

// inv_t = 1 / sqrt(mean(x[t, :]^2) + eps), summed in fp32 as the norms do.
std::vector<float> row_inv_rms(const Tensor& x, float eps) {
  check_host(x, "rms scale x");
  const int64_t d = x.cols();
  std::vector<float> inv(static_cast<size_t>(x.rows()));
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t t = 0; t < x.rows(); ++t) {
    dequantize_row(x.dtype(), x.row(t), row.data(), d);
    float ss = 0.0f;
    for (float v : row) ss += v * v;
    inv[static_cast<size_t>(t)] = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  }
  return inv;
}

// A host copy of y with row t multiplied by inv[t] (plus bias [cols] F32
// where defined, as fmaf(v, inv, b)), rounded to y's dtype.
struct ScaledRows {
  std::vector<uint8_t> bytes;
  Tensor t;
  ScaledRows(const Tensor& y, const std::vector<float>& inv, const Tensor& bias = Tensor())
      : bytes(static_cast<size_t>(y.nbytes())) {
    check_host(y, "rms scaled rows");
    OSP_CHECK_EQ(static_cast<int64_t>(inv.size()), y.rows());
    const float* b = nullptr;
    if (bias.defined()) {
      OSP_CHECK_MSG(bias.device() == Device::kCpu && bias.dtype() == DType::kF32, "rms scaled rows bias: host F32");
      OSP_CHECK_EQ(bias.numel(), y.cols());
      b = bias.data_as<float>();
    }
    const int64_t shape[2] = {y.rows(), y.cols()};
    t = Tensor(bytes.data(), y.dtype(), shape, 2, Device::kCpu);
    map_rows(y, t, [&](int64_t r, float* v) {
      const float s = inv[static_cast<size_t>(r)];
      for (int64_t i = 0; i < y.cols(); ++i) v[i] = b ? std::fmaf(v[i], s, b[i]) : v[i] * s;
    });
  }
};

}  // namespace

void Backend::scale_columns(Tensor& w, const Tensor& scale) {
  check_host(w, "scale_columns w");
  OSP_CHECK_MSG(scale.device() == Device::kCpu && scale.dtype() == DType::kF32, "scale_columns scale: host F32");
  OSP_CHECK_EQ(scale.numel(), w.cols());
  const float* s = scale.data_as<float>();
  map_rows(w, w, [&](int64_t, float* v) {
    for (int64_t i = 0; i < w.cols(); ++i) v[i] *= s[i];
  });
}

void Backend::rms_scaled_qkv_rope_kv_write(const Tensor& x, float x_eps, const Tensor& qkv, const Tensor& qkv_bias,
                                           const Tensor& q_norm, const Tensor& k_norm, float eps,
                                           const RopeTable& rope, const AttentionBatch& batch, LayerKv& kv,
                                           Tensor& q_out) {
  OSP_CHECK_EQ(x.rows(), qkv.rows());
  ScaledRows scaled(qkv, row_inv_rms(x, x_eps), qkv_bias);
  qkv_rope_kv_write(scaled.t, q_norm, k_norm, eps, rope, batch, kv, q_out);
}

void Backend::rms_scaled_silu_mul(const Tensor& x, float x_eps, const Tensor& gate_up, Tensor& out) {
  OSP_CHECK_EQ(x.rows(), gate_up.rows());
  ScaledRows scaled(gate_up, row_inv_rms(x, x_eps));
  silu_mul(scaled.t, out);
}

}  // namespace osprey::ops
