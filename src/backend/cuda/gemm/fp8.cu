// FP8 (E4M3) quantisation for the FP8 weight path (ops/backend.h,
// "FP8 weights"): one scale for a whole tensor, amax / 448. Two kernels: the
// per-block maxima of |x|, then every block of the second reduces those
// partials to the amax and converts its share of x (x * (448 / amax),
// rounded to nearest even and saturated, as f32_to_f8e4m3), block 0 storing
// the scale. No counters to reset, so both run in captured graphs. Used for
// the weights at load and for every FP8 GEMM's input. (The batch-1 GEMV
// on E4M3 weights is in gemv.cu, with the folded-norm kernels it shares
// its dot with.)

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxParts = 1024;

__device__ __forceinline__ float block_max(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) v = fmaxf(v, red[w]);
  return v;
}

// |v|, or +inf for a non-finite v (so that the scale tells of it).
__device__ __forceinline__ float abs_or_inf(float v) { return isfinite(v) ? fabsf(v) : INFINITY; }

// partials[b] = max |x| over the elements block b visits (grid-stride, 8 a
// thread a step when kVec: 16-byte aligned x, count % 8 == 0).
template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads) amax_partials_kernel(const T* __restrict__ x, int64_t count,
                                                                 float* __restrict__ partials) {
  __shared__ float red[kThreads / 32];
  pdl_launch_dependents();
  pdl_wait();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  float m = 0.0f;
  if constexpr (kVec) {
    for (int64_t g = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; g < count / 8; g += stride) {
      float v[8];
      load8_act<T>(x + g * 8, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) m = fmaxf(m, abs_or_inf(v[e]));
    }
  } else {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < count; i += stride)
      m = fmaxf(m, abs_or_inf(to_float(x[i])));
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    quantize_e4m3_kernel(const T* __restrict__ x, int64_t count, const float* __restrict__ partials, int parts,
                         uint8_t* __restrict__ q, float* __restrict__ scale_out) {
  __shared__ float red[kThreads / 32];
  pdl_launch_dependents();
  pdl_wait();
  float m = 0.0f;
  for (int i = threadIdx.x; i < parts; i += kThreads) m = fmaxf(m, partials[i]);
  const float amax = block_max(m, red);
  // The host recipe's two fp32 divisions (ops/fp8_quant.cpp), IEEE-rounded.
  const float inv = amax > 0.0f ? __fdiv_rn(kF8E4M3Max, amax) : 1.0f;
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = amax > 0.0f ? __fdiv_rn(amax, kF8E4M3Max) : 1.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  if constexpr (kVec) {
    for (int64_t g = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; g < count / 8; g += stride) {
      float v[8];
      load8_act<T>(x + g * 8, v);
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        lo |= static_cast<uint32_t>(float_to_e4m3(__fmul_rn(v[e], inv))) << (8 * e);
        hi |= static_cast<uint32_t>(float_to_e4m3(__fmul_rn(v[e + 4], inv))) << (8 * e);
      }
      reinterpret_cast<uint2*>(q)[g] = make_uint2(lo, hi);
    }
  } else {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < count; i += stride)
      q[i] = float_to_e4m3(__fmul_rn(to_float(x[i]), inv));
  }
}

bool vec_ok(DType t, const void* x, const void* q, int64_t count) {
  const auto a = reinterpret_cast<uintptr_t>(x), b = reinterpret_cast<uintptr_t>(q);
  return count % 8 == 0 && a % (t == DType::kF32 ? 32 : 16) == 0 && b % 8 == 0;
}

}  // namespace

int fp8_amax_parts(int64_t count) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(std::max<int64_t>(count, 1), int64_t{kThreads} * 8 * 4), 1,
                                              kMaxParts));
}

void launch_fp8_quantize(DType t, const void* x, int64_t count, float* partials, uint8_t* q, float* scale_out,
                         cudaStream_t stream) {
  OSP_CHECK_MSG(t == DType::kF32 || t == DType::kF16 || t == DType::kBF16,
                "launch_fp8_quantize: F32, F16 or BF16 input, got " << dtype_name(t));
  const int parts = fp8_amax_parts(count);
  const bool vec = vec_ok(t, x, q, count);
  // The converting grid: a few waves of 8-element groups, grid-stride beyond.
  const unsigned qgrid = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(std::max<int64_t>(count, 1), kThreads * 8), 1, 4096));
  OSP_DISPATCH_ACT(t, T, {
    const T* xp = static_cast<const T*>(x);
    auto launch = [&](auto vec_tag) {
      constexpr bool kVec = decltype(vec_tag)::value;
      launch_pdl(amax_partials_kernel<T, kVec>, dim3(parts), dim3(kThreads), 0, stream, xp, count, partials);
      launch_pdl(quantize_e4m3_kernel<T, kVec>, dim3(qgrid), dim3(kThreads), 0, stream, xp, count,
                 static_cast<const float*>(partials), parts, q, scale_out);
    };
    if (vec) {
      launch(std::true_type{});
    } else {
      launch(std::false_type{});
    }
  });
}

}  // namespace osprey::cuda
