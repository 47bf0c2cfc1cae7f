// KV page element access for every page dtype: F32, F16, BF16 (the
// activation types) and F8_E4M3 (KvF8, one byte a value under the layer's
// K or V scale: ops::LayerKv). F8 writes store e4m3(x * inv_scale), rounded
// to nearest even and saturated at 448 (as core's f32_to_f8e4m3); reads give
// e4m3 * scale, one fp32 product. For the other dtypes the scales are 1 and
// are not applied.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/device_common.cuh"
#include "ops/backend.h"  // ops::kv_row_scale_index: where an I8 row's scale lives

namespace osprey::cuda {

// The C++ type of an F8_E4M3 page element.
using KvF8 = __nv_fp8_e4m3;

template <class KvT>
inline constexpr bool kIsKvF8 = std::is_same_v<KvT, KvF8>;

// The page value that stores x (already rounded to the activation dtype).
template <class KvT>
__device__ __forceinline__ KvT kv_from_float(float x, float inv_scale) {
  if constexpr (kIsKvF8<KvT>) {
    KvT r;
    r.__x = float_to_e4m3(x * inv_scale);
    return r;
  } else {
    return from_float<KvT>(x);
  }
}

template <class KvT>
__device__ __forceinline__ float kv_to_float(KvT v, float scale) {
  if constexpr (kIsKvF8<KvT>) {
    float f[4];
    e4m3x4_to_float(v.__x, f);
    return f[0] * scale;
  } else {
    return to_float(v);
  }
}

// Eight consecutive page values p[0..8) as fp32 (F8: times scale); p 16-byte
// aligned for the 16-bit types (32 for F32), 8-byte for F8.
template <class KvT>
__device__ __forceinline__ void load8_kv(const KvT* p, float out[8], float scale) {
  if constexpr (kIsKvF8<KvT>) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    e4m3x4_to_float(w.x, out);
    e4m3x4_to_float(w.y, out + 4);
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] *= scale;
  } else {
    load8_act<KvT>(p, out);
  }
}

// Stores eight values (already rounded to the activation dtype) as page
// values; alignment as load8_kv.
template <class KvT>
__device__ __forceinline__ void store8_kv(KvT* p, const float (&v)[8], float inv_scale) {
  if constexpr (kIsKvF8<KvT>) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; ++e) w[e / 4] |= static_cast<uint32_t>(float_to_e4m3(v[e] * inv_scale)) << (8 * (e % 4));
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    store8_act(p, v);
  }
}

// ---- I8 pages: one fp32 scale a (slot, KV head) row (ops::LayerKv) --------------

// The C++ type of an I8 page element.
using KvI8 = int8_t;

template <class KvT>
inline constexpr bool kIsKvI8 = std::is_same_v<KvT, KvI8>;

// A row value's contribution to the row's amax: |x|, or infinity for NaN
// and infinities (fmaxf would drop a NaN), so one max over the row says
// both its largest magnitude and whether it is all finite.
__device__ __forceinline__ float i8_amax_term(float x) { return isfinite(x) ? fabsf(x) : INFINITY; }

// The row scale of a row whose i8_amax_term maximum is amax: amax / 127
// (fp32 division), NaN for a row that holds a NaN or an infinity: core's
// int8_row_quantize, bit for bit.
__device__ __forceinline__ float i8_row_scale(float amax) {
  return isfinite(amax) ? __fdiv_rn(amax, 127.0f) : __int_as_float(0x7fc00000);
}

// x under row scale s as int8_row_quantize stores it: x / s (fp32
// division) to the nearest integer, ties to even; 0 where s is 0 or NaN.
__device__ __forceinline__ int8_t i8_quantize(float x, float s) {
  if (!(s > 0.0f)) return 0;
  return static_cast<int8_t>(__float2int_rn(fminf(fmaxf(__fdiv_rn(x, s), -127.0f), 127.0f)));
}

// Eight int8 values packed into a uint2, lowest first.
__device__ __forceinline__ uint2 i8_quantize8(const float (&v)[8], float s) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e) w[e / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(i8_quantize(v[e], s))) << (8 * (e % 4));
  return make_uint2(w[0], w[1]);
}

// Two int8 values as the bits of a half2 (the lower-addressed byte in the
// low half), exactly: each byte b + 128 goes into the mantissa of 1024
// (0x64 high byte), and 1024 + 128 comes off. `flipped` holds four int8
// values with their sign bits already flipped (word ^ 0x80808080: b + 128
// as an unsigned byte; one LOP3 a word rather than one a pair); kHi 0
// takes bytes 0 and 1, kHi 1 bytes 2 and 3 (no shift). Another high byte
// `top` scales the result, with bias_bits the halves top:0x80 (a select at
// the caller: deriving them here cost instructions in the prefill copier):
// 0x24 and 0x24802480 (halves of 2^-6, a mantissa step of 2^-16) give
// b 2^-16, still exact (subnormal for |b| < 4).
template <int kHi>
__device__ __forceinline__ uint32_t i8x2_flipped_to_half2_bits(uint32_t flipped, uint32_t top = 0x64u,
                                                               uint32_t bias_bits = 0x64806480u) {
  const uint32_t biased = __byte_perm(flipped, top, kHi ? 0x4342 : 0x4140);
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&biased), *reinterpret_cast<const __half2*>(&bias_bits));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Four int8 values (word, low byte first) as floats, exactly, without an
// int-to-float conversion (the prefill kernels widen whole tiles, and those
// conversions share the quarter-rate pipe with the softmax's exp2): each
// byte b + 128 goes into the mantissa of 2^23 (exponent bits 0x4B), and
// 2^23 + 128 comes off.
__device__ __forceinline__ void i8x4_to_float(uint32_t word, float* f) {
  const uint32_t biased = word ^ 0x80808080u;
#pragma unroll
  for (uint32_t k = 0; k < 4; ++k) f[k] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7440u | k)) - 8388736.0f;
}

}  // namespace osprey::cuda

// Runs `body` with `KvT` bound to the C++ type of KV page dtype `dt`: the
// float dtypes as OSP_DISPATCH_FLOAT, F8_E4M3 -> KvF8.
#define OSP_DISPATCH_KV(dt, KvT, ...)           \
  do {                                          \
    if ((dt) == ::osprey::DType::kF8E4M3) {     \
      using KvT = ::osprey::cuda::KvF8;         \
      __VA_ARGS__;                              \
    } else {                                    \
      OSP_DISPATCH_FLOAT(dt, KvT, __VA_ARGS__); \
    }                                           \
  } while (0)

// As OSP_DISPATCH_KV, plus I8 -> KvI8, for the kernels that take I8 pages
// (their row scales come with the kernel's arguments).
#define OSP_DISPATCH_KV8(dt, KvT, ...)            \
  do {                                            \
    if ((dt) == ::osprey::DType::kI8) {           \
      using KvT = ::osprey::cuda::KvI8;           \
      __VA_ARGS__;                                \
    } else {                                      \
      OSP_DISPATCH_KV(dt, KvT, __VA_ARGS__);      \
    }                                             \
  } while (0)
