// Portable kernels: the fallback on any CPU and the cross-check for the
// vectorised ones. Weight blocks are dequantised exactly (d * q + m etc.) into
// a 32-float buffer and dotted in fp32.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace osprey::cpu {

bool weight_format_of(DType t, WeightFormat* f) {
  switch (t) {
    case DType::kF32:
      *f = WeightFormat::kF32;
      return true;
    case DType::kF16:
      *f = WeightFormat::kF16;
      return true;
    case DType::kBF16:
      *f = WeightFormat::kBF16;
      return true;
    case DType::kQ8_0:
      *f = WeightFormat::kQ8_0;
      return true;
    case DType::kQ4_0:
      *f = WeightFormat::kQ4_0;
      return true;
    case DType::kQ4_1:
      *f = WeightFormat::kQ4_1;
      return true;
    default:
      return false;
  }
}

namespace {

constexpr int kGroup = 8;  // x rows handled together per weight row

// Dequantises elements [off, off + len) of a row (len <= 32; off a multiple
// of 32 for the quantised formats) into dst.
template <WeightFormat F>
inline void dequant_span(const void* row, int64_t off, int len, float* dst) {
  if constexpr (F == WeightFormat::kF32) {
    std::memcpy(dst, static_cast<const float*>(row) + off, sizeof(float) * static_cast<size_t>(len));
  } else if constexpr (F == WeightFormat::kF16) {
    const auto* p = static_cast<const uint16_t*>(row) + off;
    for (int j = 0; j < len; ++j) dst[j] = fp16_to_f32(p[j]);
  } else if constexpr (F == WeightFormat::kBF16) {
    const auto* p = static_cast<const uint16_t*>(row) + off;
    for (int j = 0; j < len; ++j) dst[j] = bf16_to_f32(p[j]);
  } else if constexpr (F == WeightFormat::kQ8_0) {
    const auto& b = static_cast<const BlockQ8_0*>(row)[off / kQuantBlock];
    const float d = fp16_to_f32(b.d);
    for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(b.qs[j]);
  } else if constexpr (F == WeightFormat::kQ4_0) {
    const auto& b = static_cast<const BlockQ4_0*>(row)[off / kQuantBlock];
    const float d = fp16_to_f32(b.d);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((b.qs[j] & 0x0f) - 8);
      dst[j + 16] = d * static_cast<float>((b.qs[j] >> 4) - 8);
    }
  } else {
    const auto& b = static_cast<const BlockQ4_1*>(row)[off / kQuantBlock];
    const float d = fp16_to_f32(b.d);
    const float m = fp16_to_f32(b.m);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(b.qs[j] & 0x0f) + m;
      dst[j + 16] = d * static_cast<float>(b.qs[j] >> 4) + m;
    }
  }
}

template <WeightFormat F>
void gemv_scalar(const void* w, int64_t w_row_bytes, int64_t k, const float* x, int64_t ldx, const float* /*xsum*/,
                 int n, float* out, int64_t ldo, int64_t r0, int64_t r1) {
  float buf[32];
  for (int64_t r = r0; r < r1; ++r) {
    const void* row = static_cast<const char*>(w) + r * w_row_bytes;
    for (int i0 = 0; i0 < n; i0 += kGroup) {
      const int g = std::min(kGroup, n - i0);
      float acc[kGroup] = {};
      for (int64_t off = 0; off < k; off += 32) {
        const int len = static_cast<int>(std::min<int64_t>(32, k - off));
        dequant_span<F>(row, off, len, buf);
        for (int i = 0; i < g; ++i) {
          const float* xi = x + (i0 + i) * ldx + off;
          float s = 0.0f;
          for (int j = 0; j < len; ++j) s += buf[j] * xi[j];
          acc[i] += s;
        }
      }
      for (int i = 0; i < g; ++i) out[(i0 + i) * ldo + r] = acc[i];
    }
  }
}

template <WeightFormat F>
void dequant_rows_scalar(const void* w, int64_t w_row_bytes, int64_t k, int64_t rows, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const void* row = static_cast<const char*>(w) + r * w_row_bytes;
    for (int64_t off = 0; off < k; off += 32) {
      dequant_span<F>(row, off, static_cast<int>(std::min<int64_t>(32, k - off)), dst + r * k + off);
    }
  }
}

void panel_gemm_scalar(const float* x, int64_t ldx, int n, const float* p, int m, int64_t k, float* out, int64_t ldo) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + i * ldx;
    for (int j = 0; j < m; ++j) {
      const float* pj = p + j * k;
      float s = 0.0f;
      for (int64_t t = 0; t < k; ++t) s += xi[t] * pj[t];
      out[i * ldo + j] = s;
    }
  }
}

float dot_scalar(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void attn_scores_scalar(const float* q, int nq, int64_t hd, const float* rows, int64_t stride, int64_t len,
                        float scale, float* s, int64_t lds) {
  for (int64_t j = 0; j < len; ++j)
    for (int h = 0; h < nq; ++h) s[h * lds + j] = dot_scalar(q + h * hd, rows + j * stride, hd) * scale;
}

void attn_accum_scalar(const float* s, int64_t lds, int nq, int64_t hd, const float* rows, int64_t stride,
                       int64_t len, float* o) {
  for (int64_t j = 0; j < len; ++j)
    for (int h = 0; h < nq; ++h) axpy_scalar(s[h * lds + j], rows + j * stride, o + h * hd, hd);
}

void widen_f16_scalar(const uint16_t* src, int64_t stride, int64_t rows, int64_t len, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < len; ++i) dst[r * len + i] = fp16_to_f32(src[r * stride + i]);
}

void widen_bf16_scalar(const uint16_t* src, int64_t stride, int64_t rows, int64_t len, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < len; ++i) dst[r * len + i] = bf16_to_f32(src[r * stride + i]);
}

void scale_scalar(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

float sum_sq_scalar(const float* x, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

void scale_mul_scalar(const float* x, float s, const float* w, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * s) * w[i];
}

void add_scalar(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void block_sums_scalar(const float* x, int64_t k, float* sums) {
  for (int64_t b = 0; b < k / 32; ++b) {
    float s = 0.0f;
    for (int j = 0; j < 32; ++j) s += x[b * 32 + j];
    sums[b] = s;
  }
}

void silu_mul_scalar(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

float exp_sub_sum_scalar(float* s, int64_t n, float max) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - max);
    sum += s[i];
  }
  return sum;
}

CpuKernels make_scalar() {
  CpuKernels t;
  t.isa = "scalar";
  auto set = [&t](WeightFormat f, GemvFn g, DequantRowsFn d) {
    t.gemv[static_cast<int>(f)] = g;
    t.dequant[static_cast<int>(f)] = d;
  };
  set(WeightFormat::kF32, gemv_scalar<WeightFormat::kF32>, dequant_rows_scalar<WeightFormat::kF32>);
  set(WeightFormat::kF16, gemv_scalar<WeightFormat::kF16>, dequant_rows_scalar<WeightFormat::kF16>);
  set(WeightFormat::kBF16, gemv_scalar<WeightFormat::kBF16>, dequant_rows_scalar<WeightFormat::kBF16>);
  set(WeightFormat::kQ8_0, gemv_scalar<WeightFormat::kQ8_0>, dequant_rows_scalar<WeightFormat::kQ8_0>);
  set(WeightFormat::kQ4_0, gemv_scalar<WeightFormat::kQ4_0>, dequant_rows_scalar<WeightFormat::kQ4_0>);
  set(WeightFormat::kQ4_1, gemv_scalar<WeightFormat::kQ4_1>, dequant_rows_scalar<WeightFormat::kQ4_1>);
  t.panel_gemm = panel_gemm_scalar;
  t.dot = dot_scalar;
  t.axpy = axpy_scalar;
  t.scale = scale_scalar;
  t.sum_sq = sum_sq_scalar;
  t.scale_mul = scale_mul_scalar;
  t.add = add_scalar;
  t.block_sums = block_sums_scalar;
  t.silu_mul = silu_mul_scalar;
  t.exp_sub_sum = exp_sub_sum_scalar;
  t.attn_scores = attn_scores_scalar;
  t.attn_accum = attn_accum_scalar;
  t.widen_f16 = widen_f16_scalar;
  t.widen_bf16 = widen_bf16_scalar;
  return t;
}

}  // namespace

const CpuKernels& scalar_kernels() {
  static const CpuKernels k = make_scalar();
  return k;
}

namespace {
// F16C through CPUID leaf 1 (ECX bit 29): clang 14 does not know "f16c" in
// __builtin_cpu_supports.
bool cpu_has_f16c() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c & bit_F16C) != 0;
#else
  return false;
#endif
}
}  // namespace

const CpuKernels* avx2_kernels() {
#if defined(__x86_64__)
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  return supported ? &avx2_kernels_unchecked() : nullptr;
#else
  return nullptr;
#endif
}

const CpuKernels* avx512_kernels() {
#if defined(__x86_64__)
  static const bool supported = avx2_kernels() != nullptr && __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512dq");
  return supported ? &avx512_kernels_unchecked() : nullptr;
#else
  return nullptr;
#endif
}

}  // namespace osprey::cpu
