// Backend's defaults for the norm folding ops (backend.h): host memory, any
// float dtype, written for clarity (the CPU backend does not fold; these
// serve tests and any host-memory backend that claims folds_norms).
#include <cmath>
#include <vector>

#include "core/check.h"
#include "ops/backend.h"

namespace osprey::ops {
namespace {

float load(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return fp16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: OSP_CHECK_MSG(false, "norm folding: unsupported dtype " << dtype_name(t)); return 0.0f;
  }
}

void store(DType t, void* p, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = f32_to_fp16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    default: OSP_CHECK_MSG(false, "norm folding: unsupported dtype " << dtype_name(t));
  }
}

void check_host(const Tensor& t, const char* what) {
  OSP_CHECK_MSG(t.device() == Device::kCpu, what << ": the default norm folding ops take host memory");
}

// inv_t = 1 / sqrt(mean(x[t, :]^2) + eps), summed in fp32 as the norms do.
std::vector<float> row_inv_rms(const Tensor& x, float eps) {
  check_host(x, "rms scale x");
  const int64_t n = x.rows(), d = x.cols();
  std::vector<float> inv(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    float ss = 0.0f;
    for (int64_t i = 0; i < d; ++i) {
      const float v = load(x.dtype(), x.row(t), i);
      ss += v * v;
    }
    inv[static_cast<size_t>(t)] = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  }
  return inv;
}

// A host copy of y with row t multiplied by inv[t] (plus bias [cols] F32
// where defined), rounded to y's dtype.
struct ScaledRows {
  std::vector<uint8_t> bytes;
  Tensor t;
  ScaledRows(const Tensor& y, const std::vector<float>& inv, const Tensor& bias = Tensor())
      : bytes(static_cast<size_t>(y.nbytes())) {
    check_host(y, "rms scaled rows");
    OSP_CHECK_EQ(static_cast<int64_t>(inv.size()), y.rows());
    const float* b = nullptr;
    if (bias.defined()) {
      check_host(bias, "rms scaled rows bias");
      OSP_CHECK(bias.dtype() == DType::kF32);
      OSP_CHECK_EQ(bias.numel(), y.cols());
      b = bias.data_as<float>();
    }
    const int64_t shape[2] = {y.rows(), y.cols()};
    t = Tensor(bytes.data(), y.dtype(), shape, 2, Device::kCpu);
    for (int64_t r = 0; r < y.rows(); ++r) {
      for (int64_t i = 0; i < y.cols(); ++i) {
        const float v = load(y.dtype(), y.row(r), i);
        const float s = inv[static_cast<size_t>(r)];
        store(y.dtype(), t.row(r), i, b ? std::fmaf(v, s, b[i]) : v * s);
      }
    }
  }
};

}  // namespace

void Backend::scale_columns(Tensor& w, const Tensor& scale) {
  check_host(w, "scale_columns w");
  check_host(scale, "scale_columns scale");
  OSP_CHECK(scale.dtype() == DType::kF32);
  OSP_CHECK_EQ(scale.numel(), w.cols());
  const float* s = scale.data_as<float>();
  for (int64_t r = 0; r < w.rows(); ++r) {
    for (int64_t i = 0; i < w.cols(); ++i) store(w.dtype(), w.row(r), i, load(w.dtype(), w.row(r), i) * s[i]);
  }
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
