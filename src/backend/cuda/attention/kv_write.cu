// Writes the step's K and V rows into the paged cache at slot_mapping (any
// page dtype: F8_E4M3 pages store x / scale, attention/kv_fp8.cuh).
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

}  // namespace

void launch_kv_write(DType act, const void* k, const void* v, const int32_t* slot_mapping, int64_t n, int hk, int hd,
                     DType cache_dtype, void* k_cache, void* v_cache, int64_t num_slots, float k_inv_scale,
                     float v_inv_scale, cudaStream_t stream) {
  if (n == 0) return;
  OSP_CHECK_LE(n, int64_t{2147483647});
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
