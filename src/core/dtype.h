// Element types, including the block-quantised weight formats shared by the
// loader and the backends, and scalar fp16/bf16 conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace osprey {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI32,
  kI64,
  kU8,
  kQ8_0,  // blocks of 32: fp16 scale d, 32 x int8 q; x = d * q
  kQ4_0,  // blocks of 32: fp16 scale d, 16 bytes of nibbles; x = d * (q - 8)
  kQ4_1,  // blocks of 32: fp16 scale d, fp16 min m, 16 bytes of nibbles; x = d * q + m
  // FP8 E4M3 (sign, 4 exponent bits with bias 7, 3 mantissa bits; no
  // infinities, 0x7f / 0xff NaN, largest finite 448). Weight matrices of
  // this dtype (the CUDA backend's fp8 quantisation, Backend::
  // quantize_weight_fp8) carry one fp32 scale for the whole matrix after
  // their bytes: see fp8_scale_offset. Not a file dtype (dtype_from_name
  // does not know it).
  kF8E4M3,
  // Signed 8-bit integers. As KV pages (--kv-cache-dtype int8) each K or V
  // row of one token and KV head is int8_row_quantize's q under that row's
  // own fp32 scale (ops::LayerKv). Not a file dtype either.
  kI8,
};

// Nibble layout of Q4_0/Q4_1 (as in GGUF): byte j of qs holds element j in its
// low nibble and element j + 16 in its high nibble.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);

constexpr int kQuantBlock = 32;

std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

// Elements per storage block (1 for plain types, 32 for the quantised ones).
constexpr int64_t dtype_block_elems(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: return kQuantBlock;
    default: return 1;
  }
}

// Bytes per storage block.
constexpr int64_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kQ8_0: return sizeof(BlockQ8_0);
    case DType::kQ4_0: return sizeof(BlockQ4_0);
    case DType::kQ4_1: return sizeof(BlockQ4_1);
    case DType::kF8E4M3:
    case DType::kI8:
      return 1;
  }
  return 0;
}

constexpr bool dtype_is_quantized(DType t) { return dtype_block_elems(t) > 1; }

// Bytes of one row of `cols` elements; cols must be a multiple of the block
// size for quantised types (checked by callers that accept files).
constexpr int64_t dtype_row_bytes(DType t, int64_t cols) {
  return cols / dtype_block_elems(t) * dtype_block_bytes(t);
}

// An F8_E4M3 weight matrix [m, k] (kF8E4M3): the m * k E4M3 bytes row by
// row, then at fp8_scale_offset(m, k) bytes from its start one fp32 s with
// w[i][j] ~= s * e4m3(q[i][j]); fp8_weight_bytes(m, k) bytes in all (256-byte
// aligned parts).
constexpr int64_t fp8_scale_offset(int64_t m, int64_t k) {
  return (m * k + 255) / 256 * 256;
}
constexpr int64_t fp8_weight_bytes(int64_t m, int64_t k) {
  return fp8_scale_offset(m, k) + 256;
}

// The largest finite E4M3 value.
constexpr float kF8E4M3Max = 448.0f;

// The largest magnitude int8_row_quantize stores (symmetric: -128 is unused).
constexpr int kI8RowMax = 127;

// ---- scalar conversions ------------------------------------------------------

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even.
inline uint16_t f32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (absx < 0x38800000u) {  // subnormal or zero in fp16
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> (shift - 1 + 0);
    // r has one extra bit for rounding after shifting by (shift - 1)
    const uint32_t rest = m & ((1u << (shift - 1)) - 1);
    uint32_t h = r >> 1;
    if ((r & 1u) && (rest || (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((absx >> 13) - ((127 - 15) << 10));
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_f32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// E4M3 byte -> float (exact).
float f8e4m3_to_f32(uint8_t v);

// float -> E4M3, round to nearest even, magnitudes above 448 saturated to
// 448 (as CUDA's __NV_SATFINITE conversion), NaN -> 0x7f.
uint8_t f32_to_f8e4m3(float f);

// E4M3 codes [rows, cols] under per-row scales (row_scales[r], or
// row_scales[0] for every row when !per_row) re-rounded to one scale
// `to_scale` >= every row scale: dst[i] = f32_to_f8e4m3(e4m3(src[i]) *
// (row scale / to_scale)). Exact where the ratio is a power of two and the
// value stays a normal number; otherwise within half an E4M3 step of the
// value (the subnormal steps below 2^-6). src and dst may be the same.
// Used to give an FP8 checkpoint's fused or per-row-scaled matrices one
// scale.
void f8e4m3_rescale_rows(const uint8_t* src, int64_t rows, int64_t cols, const float* row_scales, bool per_row,
                         float to_scale, uint8_t* dst);

// One row of int8 with its own scale (INT8 KV pages): returns
// s = amax / 127 (fp32 division; amax the row's largest magnitude) and sets
// q[i] = x[i] / s rounded to the nearest integer, ties to even (fp32
// division; within [-127, 127] by construction), so x[i] ~= s * q[i] within
// s / 2. An all-zero row gives s = 0 and q = 0. A row holding a NaN or an
// infinity gives s = NaN and q = 0: the whole row reads back NaN.
float int8_row_quantize(const float* x, int64_t n, int8_t* q);

// Dequantise one row of `cols` elements of type t (any dtype except the
// integer ones) into out[cols] fp32. Portable reference used by tests and by
// the loader; backends have their own fast paths.
void dequantize_row(DType t, const void* src, float* out, int64_t cols);

// Quantise one row of `cols` floats into dtype t (F32, F16, BF16 or a block
// type; cols a multiple of 32 for the block types) with the usual GGUF
// recipes: Q8_0 d = amax/127; Q4_0 d = (value of largest magnitude)/-8,
// q = round(x/d + 8); Q4_1 d = (max-min)/15, m = min; F8_E4M3 the values
// themselves (f32_to_f8e4m3, no scale: dequantize_row gives them back
// unscaled too); I8 the values rounded to the nearest integer in [-127,
// 127] (no scale either). dst holds
// dtype_row_bytes(t, cols) bytes. Used by tests and benchmarks.
void quantize_row(DType t, const float* src, void* dst, int64_t cols);

}  // namespace osprey
