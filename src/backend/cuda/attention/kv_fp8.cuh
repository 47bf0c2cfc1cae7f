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
