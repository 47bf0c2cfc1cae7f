// Writes the step's K and V rows into the paged cache at slot_mapping (any
// page dtype: F8_E4M3 pages store x / scale, I8 pages each (slot, head) row
// under its own scale, attention/kv_fp8.cuh).
#include <algorithm>

#include "backend/cuda/attention/kv_fp8.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

// One block per token; threads stride over its hk * hd values.
template <class S, class T>
__global__ void kv_write_kernel(const S* __restrict__ k, const S* __restrict__ v,
                                const int32_t* __restrict__ slot_mapping, int64_t row, T* __restrict__ k_cache,
                                T* __restrict__ v_cache, int64_t num_slots, float k_inv, float v_inv) {
  const int64_t t = blockIdx.x;
  const int32_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;
  const S* ks = k + t * row;
  const S* vs = v + t * row;
  T* kd = k_cache + static_cast<int64_t>(slot) * row;
  T* vd = v_cache + static_cast<int64_t>(slot) * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kd[i] = kv_from_float<T>(to_float(ks[i]), k_inv);
    vd[i] = kv_from_float<T>(to_float(vs[i]), v_inv);
  }
}

// I8 pages: one warp per (token, K or V, head) row of hd <= kMaxHeadDim
// values; the warp's max gives the row scale (i8_row_scale), every lane
// stores its values' codes and lane 0 the scale. Rows [0, hk) of a token
// are K, [hk, 2 hk) V.
template <class S>
__global__ void kv_write_i8_kernel(const S* __restrict__ k, const S* __restrict__ v,
                                   const int32_t* __restrict__ slot_mapping, int hk, int hd, int8_t* __restrict__ k_cache,
                                   int8_t* __restrict__ v_cache, float* __restrict__ k_scales,
                                   float* __restrict__ v_scales, int64_t num_slots, int block_size) {
  constexpr int kChunks = kMaxHeadDim / 32;
  const int64_t t = blockIdx.x;
  const int32_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int r = warp; r < 2 * hk; r += static_cast<int>(blockDim.x / 32)) {  // warp-uniform
    const bool is_k = r < hk;
    const int h = is_k ? r : r - hk;
    const S* src = (is_k ? k : v) + (t * hk + h) * hd;
    float x[kChunks];
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      x[c] = d < hd ? to_float(src[d]) : 0.0f;
      amax = fmaxf(amax, i8_amax_term(x[c]));
    }
    const float s = i8_row_scale(warp_max(amax));
    const int64_t row = static_cast<int64_t>(slot) * hk + h;
    int8_t* dst = (is_k ? k_cache : v_cache) + row * hd;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      if (d < hd) dst[d] = i8_quantize(x[c], s);
    }
    if (lane == 0) (is_k ? k_scales : v_scales)[ops::kv_row_scale_index(slot, h, hk, block_size)] = s;
  }
}

}  // namespace

void launch_kv_write(DType act, const void* k, const void* v, const int32_t* slot_mapping, int64_t n, int hk, int hd,
                     DType cache_dtype, void* k_cache, void* v_cache, int64_t num_slots, float k_inv_scale,
                     float v_inv_scale, float* k_row_scales, float* v_row_scales, int block_size,
                     cudaStream_t stream) {
  if (n == 0) return;
  OSP_CHECK_LE(n, int64_t{2147483647});
  if (cache_dtype == DType::kI8) {
    OSP_CHECK(hd <= kMaxHeadDim && k_row_scales != nullptr && v_row_scales != nullptr && block_size > 0);
    const int threads = 32 * std::min(8, 2 * hk);
    OSP_DISPATCH_ACT(act, S, {
      kv_write_i8_kernel<S><<<static_cast<unsigned>(n), threads, 0, stream>>>(
          static_cast<const S*>(k), static_cast<const S*>(v), slot_mapping, hk, hd, static_cast<int8_t*>(k_cache),
          static_cast<int8_t*>(v_cache), k_row_scales, v_row_scales, num_slots, block_size);
    });
    OSP_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t row = int64_t{hk} * hd;
  const int threads = static_cast<int>(std::clamp<int64_t>(ceil_div(row, 32) * 32, 32, 256));
  const unsigned grid = static_cast<unsigned>(n);
  OSP_DISPATCH_ACT(act, S, {
    OSP_DISPATCH_KV(cache_dtype, T, {
      kv_write_kernel<S, T><<<grid, threads, 0, stream>>>(static_cast<const S*>(k), static_cast<const S*>(v),
                                                          slot_mapping, row, static_cast<T*>(k_cache),
                                                          static_cast<T*>(v_cache), num_slots, k_inv_scale,
                                                          v_inv_scale);
    });
  });
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
