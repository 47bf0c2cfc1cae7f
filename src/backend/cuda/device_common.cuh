// Device helpers shared by the kernels: warp reductions, half/bfloat16
// loads, and dequantisation of the weight formats of core/dtype.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/dtype.h"

namespace osprey::cuda {

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Split-KV merge weights of one output row r (one warp; num_splits <= 64,
// splits lane and lane + 32): split z left (m_z, l_z) at
// part_ml[(z * rows + r) * 2 + {0, 1}]; w[i] for split lane + 32 i is
// exp(m_z - M) / sum_y exp(m_y - M) l_y with M = max m_y, 0 for an empty
// split, a split >= num_splits or a row no split saw. The decode kernel's
// in-kernel merge and the combine kernel both use it, so they agree bit for
// bit. kOtherBlocks: the partials were written by other blocks of the
// running grid (loads bypass L1).
template <bool kOtherBlocks>
__device__ __forceinline__ void split_merge_weights(const float* part_ml, int64_t rows, int64_t r, int num_splits,
                                                    int lane, float w[2]) {
  float m[2], l[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int z = lane + 32 * i;
    const float* p = part_ml + (z * rows + r) * 2;
    if (z < num_splits) {
      m[i] = kOtherBlocks ? __ldcg(p) : p[0];
      l[i] = kOtherBlocks ? __ldcg(p + 1) : p[1];
    } else {
      m[i] = -INFINITY;
      l[i] = 0.0f;
    }
  }
  const float mx = warp_max(fmaxf(m[0], m[1]));
#pragma unroll
  for (int i = 0; i < 2; ++i) w[i] = mx == -INFINITY || m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
  const float denom = warp_sum(w[0] * l[0] + w[1] * l[1]);
#pragma unroll
  for (int i = 0; i < 2; ++i) w[i] = denom > 0.0f && lane + 32 * i < num_splits ? w[i] / denom : 0.0f;
}

// Sum over the whole block; every thread gets the result. blockDim.x is a
// multiple of 32 and at most 1024; `shared` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x >> 5;
  float t = lane < num_warps ? shared[lane] : 0.0f;
  return warp_sum(t);
}

__device__ __forceinline__ float half_bits_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Conversions used for KV pages of F16/BF16 (round to nearest even).
template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Runs `body` with `T` bound to the C++ type of 16-bit dtype `dt` (BF16 ->
// __nv_bfloat16, F16 -> __half); other dtypes abort. For the vectorised
// kernels that move 8 values per 16-byte access.
#define OSP_DISPATCH_16(dt, T, ...)                                                        \
  do {                                                                                     \
    if ((dt) == ::osprey::DType::kBF16) {                                                  \
      using T = __nv_bfloat16;                                                             \
      __VA_ARGS__;                                                                         \
    } else if ((dt) == ::osprey::DType::kF16) {                                            \
      using T = __half;                                                                    \
      __VA_ARGS__;                                                                         \
    } else {                                                                               \
      OSP_CHECK_MSG(false, "unsupported dtype " << ::osprey::dtype_name(dt)                \
                                                << " (F32, F16 or BF16 where allowed)");   \
    }                                                                                      \
  } while (0)

// Same for the activation dtypes F32, BF16 and F16 (F32 -> float). Every
// kernel instantiated through it must be right for all three: use to_float /
// from_float / load8_act<T>, never bf16 bit tricks on a T.
#define OSP_DISPATCH_ACT(dt, T, ...)                                                       \
  do {                                                                                     \
    if ((dt) == ::osprey::DType::kF32) {                                                   \
      using T = float;                                                                     \
      __VA_ARGS__;                                                                         \
    } else {                                                                               \
      OSP_DISPATCH_16(dt, T, __VA_ARGS__);                                                 \
    }                                                                                      \
  } while (0)

// The float storage dtypes (KV pages, conversions) are the same three.
#define OSP_DISPATCH_FLOAT(dt, T, ...) OSP_DISPATCH_ACT(dt, T, __VA_ARGS__)

// Runs `body` with `constexpr DType W` bound to weight dtype `dt` (F32, F16,
// BF16, Q8_0, Q4_0, Q4_1: the dtypes of dequant.cuh); other dtypes abort with
// `what` followed by the dtype's name.
#define OSP_DISPATCH_WEIGHT(dt, W, what, ...)                                              \
  do {                                                                                     \
    switch (dt) {                                                                          \
      case ::osprey::DType::kF32: {                                                        \
        constexpr ::osprey::DType W = ::osprey::DType::kF32;                               \
        __VA_ARGS__;                                                                       \
      } break;                                                                             \
      case ::osprey::DType::kF16: {                                                        \
        constexpr ::osprey::DType W = ::osprey::DType::kF16;                               \
        __VA_ARGS__;                                                                       \
      } break;                                                                             \
      case ::osprey::DType::kBF16: {                                                       \
        constexpr ::osprey::DType W = ::osprey::DType::kBF16;                              \
        __VA_ARGS__;                                                                       \
      } break;                                                                             \
      case ::osprey::DType::kQ8_0: {                                                       \
        constexpr ::osprey::DType W = ::osprey::DType::kQ8_0;                              \
        __VA_ARGS__;                                                                       \
      } break;                                                                             \
      case ::osprey::DType::kQ4_0: {                                                       \
        constexpr ::osprey::DType W = ::osprey::DType::kQ4_0;                              \
        __VA_ARGS__;                                                                       \
      } break;                                                                             \
      case ::osprey::DType::kQ4_1: {                                                       \
        constexpr ::osprey::DType W = ::osprey::DType::kQ4_1;                              \
        __VA_ARGS__;                                                                       \
      } break;                                                                             \
      default:                                                                             \
        OSP_CHECK_MSG(false, what << ::osprey::dtype_name(dt));                            \
    }                                                                                      \
  } while (0)

// silu(g) * u in fp32: the one expression every SiLU-and-mul kernel uses
// (elementwise/elementwise.cu, gemm/gemv.cu), so their outputs agree bit for
// bit after the same rounding.
__device__ __forceinline__ float silu_mul_value(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}

// ---- E4M3 (FP8 weights and KV pages) ----------------------------------------

// Two E4M3 codes (the low 16 bits of `pair`, low byte first) as the bits of
// a half2 (low half first); exact.
__device__ __forceinline__ uint32_t e4m3x2_to_half2_bits(uint32_t pair) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(r.x) | static_cast<uint32_t>(r.y) << 16;
}

// lo and hi rounded to half (lo in the low 16 bits), saturating at
// +-65504 where __floats2half2_rn would give infinities (NaN stays NaN):
// BF16 q rounded to half for the one-byte pages' f16 products stays finite.
__device__ __forceinline__ uint32_t f32x2_to_half2_bits_satfinite(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Four E4M3 codes of a word as fp32 (exact), lowest byte first.
__device__ __forceinline__ void e4m3x4_to_float(uint32_t w, float out[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t bits = e4m3x2_to_half2_bits(w >> (16 * h));
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&bits));
    out[2 * h] = f.x;
    out[2 * h + 1] = f.y;
  }
}

// x -> E4M3 code: round to nearest even, magnitudes past 448 saturated (as
// core's f32_to_f8e4m3).
__device__ __forceinline__ uint8_t float_to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// Eight consecutive values p[0..8) stored from fp32, each rounded to T; p
// 16-byte aligned (32 for float). The counterpart of load8_act.
template <class T>
__device__ __forceinline__ void store8_act(T* p, const float (&v)[8]) {
  constexpr int kWords = static_cast<int>(sizeof(T)) / 2;  // 16-byte words of 8 values
  alignas(16) T e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = from_float<T>(v[i]);
#pragma unroll
  for (int i = 0; i < kWords; ++i) reinterpret_cast<uint4*>(p)[i] = reinterpret_cast<const uint4*>(e)[i];
}

// Eight consecutive activations p[0..8) as fp32; p 16-byte aligned (32 for float).
template <class T>
__device__ __forceinline__ void load8_act(const T* p, float out[8]);
template <>
__device__ __forceinline__ void load8_act<float>(const float* p, float out[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x;
  out[1] = a.y;
  out[2] = a.z;
  out[3] = a.w;
  out[4] = b.x;
  out[5] = b.y;
  out[6] = b.z;
  out[7] = b.w;
}
template <>
__device__ __forceinline__ void load8_act<__nv_bfloat16>(const __nv_bfloat16* p, float out[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[2 * j] = __uint_as_float(w[j] << 16);
    out[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}
template <>
__device__ __forceinline__ void load8_act<__half>(const __half* p, float out[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[2 * j] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[j] & 0xffffu)));
    out[2 * j + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[j] >> 16)));
  }
}

// Element i of a weight row of dtype T (slow path: one element at a time).
template <DType T>
__device__ __forceinline__ float load_weight(const char* row, int64_t i) {
  if constexpr (T == DType::kF32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (T == DType::kF16) {
    return half_bits_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (T == DType::kBF16) {
    return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (T == DType::kQ8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(row) + i / kQuantBlock;
    return half_bits_to_float(b->d) * static_cast<float>(b->qs[i % kQuantBlock]);
  } else if constexpr (T == DType::kQ4_0) {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(row) + i / kQuantBlock;
    const int j = static_cast<int>(i % kQuantBlock);
    const int q = j < 16 ? (b->qs[j] & 0x0f) : (b->qs[j - 16] >> 4);
    return half_bits_to_float(b->d) * static_cast<float>(q - 8);
  } else {
    static_assert(T == DType::kQ4_1, "unsupported weight dtype");
    const auto* b = reinterpret_cast<const BlockQ4_1*>(row) + i / kQuantBlock;
    const int j = static_cast<int>(i % kQuantBlock);
    const int q = j < 16 ? (b->qs[j] & 0x0f) : (b->qs[j - 16] >> 4);
    return half_bits_to_float(b->d) * static_cast<float>(q) + half_bits_to_float(b->m);
  }
}

// Exact floats of small integers without an int-to-float instruction (I2F
// issues at a quarter of the FP32 rate on sm_90): the float with bits
// 0x4B000000 | v is 2^23 + v for v < 2^23, and subtracting 2^23 (plus an
// offset) from it is exact, so these equal static_cast<float>(v - offset)
// bit for bit. Session 11's batch-1 Q8_0 GEMV (qgemv1_kernel) was 4-5%
// faster with them on an H200 (docs/PERF.md, session 12).
constexpr float kTwoPow23 = 8388608.0f;
// float(v - offset) for 0 <= v < 2^16 and an integer offset < 2^16.
__device__ __forceinline__ float small_uint_to_float(uint32_t v, float offset = 0.0f) {
  return __uint_as_float(0x4B000000u | v) - (kTwoPow23 + offset);
}
// float(int8_t(b)) of the low byte b of v (the other bits ignored).
__device__ __forceinline__ float s8_to_float(uint32_t v) {
  return small_uint_to_float((v & 0xffu) ^ 0x80u, 128.0f);
}

// Eight consecutive weights [8 q, 8 q + 8) (q = 0..3) of one quantised
// block as fp32 (load_weight's values bit for bit). Q8_0: quants 8 q ..; Q4_0 / Q4_1: weights 0-15 are the low nibbles
// of bytes 0-15, 16-31 the high ones, so quarter q reads bytes 8 (q % 2) ..
// and the nibble q / 2. Reads 2-byte words (blocks are 2-byte aligned).
template <DType T>
__device__ __forceinline__ void dequant_quarter(const char* block, int q, float out[8]) {
  if constexpr (T == DType::kQ8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(block);
    const float d = half_bits_to_float(b->d);
    const auto* q2 = reinterpret_cast<const uint16_t*>(b->qs) + 4 * q;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint16_t v = q2[j];
      out[2 * j] = d * s8_to_float(v);
      out[2 * j + 1] = d * s8_to_float(v >> 8);
    }
  } else {
    static_assert(T == DType::kQ4_0 || T == DType::kQ4_1, "dequant_quarter takes the quantised dtypes");
    using B = std::conditional_t<T == DType::kQ4_0, BlockQ4_0, BlockQ4_1>;
    const auto* b = reinterpret_cast<const B*>(block);
    const float d = half_bits_to_float(b->d);
    const auto* q2 = reinterpret_cast<const uint16_t*>(b->qs) + 4 * (q & 1);
    const int shift = (q >> 1) * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint16_t v = q2[j];
      const uint32_t lo = (v >> shift) & 0x0fu, hi = (v >> (8 + shift)) & 0x0fu;
      if constexpr (T == DType::kQ4_0) {
        out[2 * j] = d * small_uint_to_float(lo, 8.0f);
        out[2 * j + 1] = d * small_uint_to_float(hi, 8.0f);
      } else {
        const float m = half_bits_to_float(b->m);
        out[2 * j] = d * small_uint_to_float(lo) + m;
        out[2 * j + 1] = d * small_uint_to_float(hi) + m;
      }
    }
  }
}

// Dequantises one whole block of 32 elements into out[32]: its four quarters.
template <DType T>
__device__ __forceinline__ void dequant_block(const void* block, float out[kQuantBlock]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) dequant_quarter<T>(static_cast<const char*>(block), q, out + 8 * q);
}

}  // namespace osprey::cuda
