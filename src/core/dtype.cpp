#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace osprey {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kQ8_0: return "Q8_0";
    case DType::kQ4_0: return "Q4_0";
    case DType::kQ4_1: return "Q4_1";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI8:
      return "I8";
  }
  return "?";
}

float f8e4m3_to_f32(uint8_t v) {
  const float sign = (v & 0x80u) != 0 ? -1.0f : 1.0f;
  const int e = (v >> 3) & 0xf, m = v & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);  // subnormal: m/8 * 2^-6
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}

uint8_t f32_to_f8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= kF8E4M3Max) return sign | 0x7e;
  if (a < 0.015625f) {  // below the smallest normal (2^-6): steps of 2^-9, 8 steps = the smallest normal's code
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
  }
  int ex = 0;
  const float fr = std::frexp(a, &ex);                                  // a = fr * 2^ex, fr in [0.5, 1)
  int e = ex - 1;                                                       // a = (2 fr) * 2^e, 2 fr in [1, 2)
  int m = static_cast<int>(std::nearbyint((2.0f * fr - 1.0f) * 8.0f));  // exact products: ties to even
  if (m == 8) {
    m = 0;
    ++e;
  }
  const int code = (e + 7) << 3 | m;
  return sign | static_cast<uint8_t>(std::min(code, 0x7e));
}

float int8_row_quantize(const float* x, int64_t n, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (!finite) {
    std::memset(q, 0, static_cast<size_t>(n));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float s = amax / static_cast<float>(kI8RowMax);
  for (int64_t i = 0; i < n; ++i) {
    // |x / s| <= 127 up to the division's rounding; the clamp keeps it there.
    const float r = s > 0.0f ? std::nearbyint(std::clamp(x[i] / s, -127.0f, 127.0f)) : 0.0f;
    q[i] = static_cast<int8_t>(r);
  }
  return s;
}

std::optional<DType> dtype_from_name(std::string_view n) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU8,
                  DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    if (dtype_name(t) == n) return t;
  }
  return std::nullopt;
}

void f8e4m3_rescale_rows(const uint8_t* src, int64_t rows, int64_t cols, const float* row_scales, bool per_row,
                         float to_scale, uint8_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float ratio = row_scales[per_row ? r : 0] / to_scale;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      dst[i] = ratio == 1.0f ? src[i] : f32_to_f8e4m3(f8e4m3_to_f32(src[i]) * ratio);
    }
  }
}

void dequantize_row(DType t, const void* src, float* out, int64_t cols) {
  switch (t) {
    case DType::kF32:
      std::memcpy(out, src, static_cast<size_t>(cols) * 4);
      return;
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < cols; ++i) out[i] = fp16_to_f32(p[i]);
      return;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < cols; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t k = 0; k < cols / kQuantBlock; ++k) {
        const float d = fp16_to_f32(b[k].d);
        for (int j = 0; j < kQuantBlock; ++j) out[k * kQuantBlock + j] = d * static_cast<float>(b[k].qs[j]);
      }
      return;
    }
    case DType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t k = 0; k < cols / kQuantBlock; ++k) {
        const float d = fp16_to_f32(b[k].d);
        float* o = out + k * kQuantBlock;
        for (int j = 0; j < 16; ++j) {
          o[j] = d * static_cast<float>((b[k].qs[j] & 0x0f) - 8);
          o[j + 16] = d * static_cast<float>((b[k].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::kF8E4M3: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < cols; ++i) out[i] = f8e4m3_to_f32(p[i]);
      return;
    }
    case DType::kI8: {
      const auto* p = static_cast<const int8_t*>(src);
      for (int64_t i = 0; i < cols; ++i) out[i] = static_cast<float>(p[i]);
      return;
    }
    case DType::kQ4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t k = 0; k < cols / kQuantBlock; ++k) {
        const float d = fp16_to_f32(b[k].d);
        const float m = fp16_to_f32(b[k].m);
        float* o = out + k * kQuantBlock;
        for (int j = 0; j < 16; ++j) {
          o[j] = d * static_cast<float>(b[k].qs[j] & 0x0f) + m;
          o[j + 16] = d * static_cast<float>(b[k].qs[j] >> 4) + m;
        }
      }
      return;
    }
    default:
      OSP_CHECK_MSG(false, "dequantize_row: unsupported dtype " << dtype_name(t));
  }
}

void quantize_row(DType t, const float* x, void* dst, int64_t cols) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, x, static_cast<size_t>(cols) * 4);
      return;
    case DType::kF16:
    case DType::kBF16: {
      auto* p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < cols; ++i) p[i] = t == DType::kF16 ? f32_to_fp16(x[i]) : f32_to_bf16(x[i]);
      return;
    }
    case DType::kF8E4M3: {
      auto* p = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < cols; ++i) p[i] = f32_to_f8e4m3(x[i]);
      return;
    }
    case DType::kI8: {
      auto* p = static_cast<int8_t*>(dst);
      for (int64_t i = 0; i < cols; ++i) {
        const float r = std::isnan(x[i]) ? 0.0f : std::nearbyint(std::clamp(x[i], -127.0f, 127.0f));
        p[i] = static_cast<int8_t>(r);
      }
      return;
    }
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
      break;
    default:
      OSP_CHECK_MSG(false, "quantize_row: unsupported dtype " << dtype_name(t));
  }
  auto nibbles = [](int q0, int q1) { return static_cast<uint8_t>(std::clamp(q0, 0, 15) | std::clamp(q1, 0, 15) << 4); };
  for (int64_t b = 0; b < cols / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float mn = xb[0], mx = xb[0], amax = 0.0f, signed_max = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) {
      mn = std::min(mn, xb[j]);
      mx = std::max(mx, xb[j]);
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        signed_max = xb[j];
      }
    }
    if (t == DType::kQ8_0) {
      auto* blk = static_cast<BlockQ8_0*>(dst) + b;
      const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
      blk->d = f32_to_fp16(d);
      for (int j = 0; j < kQuantBlock; ++j) blk->qs[j] = static_cast<int8_t>(std::lround(xb[j] * id));
    } else if (t == DType::kQ4_0) {
      auto* blk = static_cast<BlockQ4_0*>(dst) + b;
      const float d = signed_max / -8.0f, id = d ? 1.0f / d : 0.0f;
      blk->d = f32_to_fp16(d);
      for (int j = 0; j < 16; ++j) {
        blk->qs[j] = nibbles(static_cast<int>(std::lround(xb[j] * id + 8.0f)),
                             static_cast<int>(std::lround(xb[j + 16] * id + 8.0f)));
      }
    } else {
      auto* blk = static_cast<BlockQ4_1*>(dst) + b;
      const float d = (mx - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
      blk->d = f32_to_fp16(d);
      blk->m = f32_to_fp16(mn);
      for (int j = 0; j < 16; ++j) {
        blk->qs[j] = nibbles(static_cast<int>(std::lround((xb[j] - mn) * id)),
                             static_cast<int>(std::lround((xb[j + 16] - mn) * id)));
      }
    }
  }
}

}  // namespace osprey
