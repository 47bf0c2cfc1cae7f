// E4M3 weight chunks in the GEMVs (gemm/fp8.cu's batch-1 GEMV and
// gemv.cu's folded-norm kernels): one 16-byte chunk holds 16 weights, and
// both kernels take a chunk's dot in the same order (dot16), so their
// results agree bit for bit.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/device_common.cuh"

namespace osprey::cuda {

// The 16 E4M3 codes of a raw 16-byte chunk as fp32 (exact: through half).
__device__ __forceinline__ void e4m3x16_to_float(uint4 v, float w[16]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>((words[j] >> (16 * h)) & 0xffffu);
      const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
      w[4 * j + 2 * h] = f.x;
      w[4 * j + 2 * h + 1] = f.y;
    }
  }
}

// dot(x[0, 16), the chunk's 16 codes) in fp32: the first 8 products summed
// in order from 0, then the last 8. x 16-byte aligned (global or shared).
template <class XT>
__device__ __forceinline__ float dot16_e4m3(uint4 wq, const XT* x) {
  float w[16], a[8], b[8];
  e4m3x16_to_float(wq, w);
  load8_act<XT>(x, a);
  load8_act<XT>(x + 8, b);
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) s += a[e] * w[e];
#pragma unroll
  for (int e = 0; e < 8; ++e) s += b[e] * w[8 + e];
  return s;
}

}  // namespace osprey::cuda
