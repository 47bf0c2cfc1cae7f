// RMSNorm, RMSNorm fused with the residual add, and (through rms_norm with
// rows = tokens * heads) the per-head q/k norm. One block per row. Every
// kernel is launched through launch_pdl (pdl.cuh): only the norm weights are
// read before pdl_wait().
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm/row_rms.cuh"
#include "backend/cuda/pdl.cuh"

namespace osprey::cuda {
namespace {

// Threads per row: enough to cover short rows without idle warps.
int threads_for(int64_t d) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(d, 4 * 32) * 32, 32, 512));
}

// In-place safe: every thread reads its elements before writing them.
template <class T>
__global__ void rms_norm_kernel(const T* x, const float* __restrict__ w, float eps, int64_t d, T* out) {
  __shared__ float red[32];
  pdl_launch_dependents();
  pdl_wait();
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = to_float(xr[i]);
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  T* o = out + r * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = from_float<T>(to_float(xr[i]) * inv * w[i]);
}

// The sum is rounded to T and stored before the norm reads it back, so the
// normalised row is the norm of exactly the stored residual.
template <class T>
__global__ void add_rms_norm_kernel(T* residual, const T* __restrict__ x, const float* __restrict__ w, float eps,
                                    int64_t d, T* out) {
  __shared__ float red[32];
  pdl_launch_dependents();
  pdl_wait();
  const int64_t r = blockIdx.x;
  T* rr = residual + r * d;
  const T* xr = x + r * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const T v = from_float<T>(to_float(rr[i]) + to_float(xr[i]));
    rr[i] = v;
    const float f = to_float(v);
    ss += f * f;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  T* o = out + r * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = from_float<T>(to_float(rr[i]) * inv * w[i]);
}

// BF16 or F16 rows (T) with d % 8 == 0, d <= 8 * 1024 and 16-byte aligned rows: each
// thread keeps its 8 values in registers, so the row is read once (and, for
// the fused add, the residual written once) - one global round trip fewer,
// which is most of the time of a decode step's single-row norm.
template <class T, bool kAdd>
__global__ void rms_norm_x8_kernel(T* residual, const T* __restrict__ x, const float* __restrict__ w, float eps,
                                   int64_t d, T* __restrict__ out) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const int64_t c = static_cast<int64_t>(threadIdx.x) * 8;
  const bool active = c < d;
  float wv[8];
  if (active) {
#pragma unroll
    for (int e = 0; e < 8; ++e) wv[e] = w[c + e];
  }
  pdl_launch_dependents();
  pdl_wait();
  float v[8];
  float ss = 0.0f;
  if (active) {
    if constexpr (kAdd) {
      float a[8], b[8];
      load8_act<T>(residual + r * d + c, a);
      load8_act<T>(x + r * d + c, b);
      alignas(16) T sum[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        sum[e] = from_float<T>(a[e] + b[e]);
        v[e] = to_float(sum[e]);
      }
      *reinterpret_cast<uint4*>(residual + r * d + c) = *reinterpret_cast<const uint4*>(sum);
    } else {
      load8_act<T>(x + r * d + c, v);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
  }
  ss = block_sum(ss, red);
  if (!active) return;
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  alignas(16) T o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = from_float<T>(v[e] * inv * wv[e]);
  *reinterpret_cast<uint4*>(out + r * d + c) = *reinterpret_cast<const uint4*>(o);
}

// inv[r] = 1 / sqrt(mean(x[r, :]^2) + eps): the row factor of a folded norm
// for the ops that read its projection (one block per row).
template <class T>
__global__ void row_inv_rms_kernel(const T* __restrict__ x, int64_t d, float eps, float* __restrict__ inv) {
  __shared__ float red[32];
  pdl_launch_dependents();
  pdl_wait();
  const int64_t r = blockIdx.x;
  const float v = block_row_inv_rms(x + r * d, d, eps, red);
  if (threadIdx.x == 0) inv[r] = v;
}

bool vec_ok(DType act, int64_t d, const void* a, const void* b, const void* c) {
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return (act == DType::kBF16 || act == DType::kF16) && d % 8 == 0 && d <= 8 * 1024 && al(a) && al(b) && al(c);
}

int vec_threads(int64_t d) {
  return static_cast<int>(std::max<int64_t>(32, ceil_div(d / 8, 32) * 32));
}

}  // namespace

void launch_rms_norm(DType act, const void* x, const float* w, float eps, int64_t rows, int64_t d, void* out,
                     cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  OSP_CHECK_LE(rows, int64_t{2147483647});
  if (vec_ok(act, d, x, out, x) && x != out) {  // head_rms_norm runs in place: keep the generic kernel
    OSP_DISPATCH_16(act, T,
                    launch_pdl(rms_norm_x8_kernel<T, false>, dim3(static_cast<unsigned>(rows)), dim3(vec_threads(d)),
                               0, stream, nullptr, static_cast<const T*>(x), w, eps, d, static_cast<T*>(out)));
    return;
  }
  OSP_DISPATCH_ACT(act, T,
                   launch_pdl(rms_norm_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(threads_for(d)), 0, stream,
                              static_cast<const T*>(x), w, eps, d, static_cast<T*>(out)));
}

void launch_add_rms_norm(DType act, void* residual, const void* x, const float* w, float eps, int64_t rows, int64_t d,
                         void* out, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  OSP_CHECK_LE(rows, int64_t{2147483647});
  if (vec_ok(act, d, residual, x, out)) {
    OSP_DISPATCH_16(act, T,
                    launch_pdl(rms_norm_x8_kernel<T, true>, dim3(static_cast<unsigned>(rows)), dim3(vec_threads(d)),
                               0, stream, static_cast<T*>(residual), static_cast<const T*>(x), w, eps, d,
                               static_cast<T*>(out)));
    return;
  }
  OSP_DISPATCH_ACT(act, T,
                   launch_pdl(add_rms_norm_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(threads_for(d)), 0,
                              stream, static_cast<T*>(residual), static_cast<const T*>(x), w, eps, d,
                              static_cast<T*>(out)));
}

void launch_row_inv_rms(DType act, const void* x, int64_t rows, int64_t d, float eps, float* inv, cudaStream_t stream) {
  if (rows == 0) return;
  OSP_CHECK_GT(d, 0);
  OSP_CHECK_LE(rows, int64_t{2147483647});
  const int threads = static_cast<int>(std::clamp<int64_t>(ceil_div(d, 8 * 32) * 32, 32, 256));
  OSP_DISPATCH_ACT(act, T,
                   launch_pdl(row_inv_rms_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, stream,
                              static_cast<const T*>(x), d, eps, inv));
}

}  // namespace osprey::cuda
