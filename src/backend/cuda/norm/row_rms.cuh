// The RMS scale of one activation row, reduced by a whole block: the
// per-row factor of the RMSNorm that the projections with folded norm
// weights leave to the op reading their product (rope/qkv_rope.cu,
// elementwise/elementwise.cu; ops/backend.h "RMSNorm weights folded into the
// projections").
#pragma once

#include <cstdint>

#include "backend/cuda/device_common.cuh"

namespace osprey::cuda {

// 1 / sqrt(mean(row[0, d)^2) + eps), the sum of squares in fp32 (the same
// expression as rms_norm_kernel). Every thread of the block must call it
// (block_sum: blockDim.x a multiple of 32); all get the result. 16-byte
// loads where d % 8 == 0 and row is 16-byte aligned, one element at a time
// otherwise. `red` holds 32 floats of shared memory (block_sum's).
template <class T>
__device__ __forceinline__ float block_row_inv_rms(const T* row, int64_t d, float eps, float* red) {
  float ss = 0.0f;
  if (d % 8 == 0 && (reinterpret_cast<uintptr_t>(row) & 15u) == 0) {
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * 8; i < d; i += static_cast<int64_t>(blockDim.x) * 8) {
      float v[8];
      load8_act<T>(row + i, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
    }
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float v = to_float(row[i]);
      ss += v * v;
    }
  }
  ss = block_sum(ss, red);
  return 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
}

// A value v of the raw residual's projection times its row's factor inv
// (plus the projection's bias b, as fmaf(v, inv, b)), rounded to T: what a
// projection of the normed row stores. Every op that reads such a
// projection scales through these, so they all round alike.
template <class T>
__device__ __forceinline__ float rms_scale_round(float v, float inv) {
  return to_float(from_float<T>(v * inv));
}
template <class T>
__device__ __forceinline__ float rms_scale_round(float v, float inv, float b) {
  return to_float(from_float<T>(fmaf(v, inv, b)));
}

}  // namespace osprey::cuda
