// RMSNorm, RMSNorm fused with the residual add, and (through rms_norm with
// rows = tokens * heads) the per-head q/k norm. One block per row.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

// Threads per row: enough to cover short rows without idle warps.
int threads_for(int64_t d) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(d, 4 * 32) * 32, 32, 512));
}

// In-place safe: every thread reads its elements before writing them.
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ w, float eps, int64_t d, float* out) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  float* o = out + r * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

__global__ void add_rms_norm_kernel(float* residual, const float* __restrict__ x, const float* __restrict__ w,
                                    float eps, int64_t d, float* out) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float* rr = residual + r * d;
  const float* xr = x + r * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = rr[i] + xr[i];
    rr[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  float* o = out + r * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = rr[i] * inv * w[i];
}

}  // namespace

void launch_rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t d, float* out,
                     cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  OSP_CHECK_LE(rows, int64_t{2147483647});
  rms_norm_kernel<<<static_cast<unsigned>(rows), threads_for(d), 0, stream>>>(x, w, eps, d, out);
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_add_rms_norm(float* residual, const float* x, const float* w, float eps, int64_t rows, int64_t d,
                         float* out, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  OSP_CHECK_LE(rows, int64_t{2147483647});
  add_rms_norm_kernel<<<static_cast<unsigned>(rows), threads_for(d), 0, stream>>>(residual, x, w, eps, d, out);
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
