// FP8 (E4M3) quantisation for the FP8 weight path (ops/backend.h,
// "FP8 weights"): one scale for a whole tensor, amax / 448. Two kernels: the
// per-block maxima of |x|, then every block of the second reduces those
// partials to the amax and converts its share of x (x * (448 / amax),
// rounded to nearest even and saturated, as f32_to_f8e4m3), block 0 storing
// the scale. No counters to reset, so both run in captured graphs. Used for
// the weights at load and for every FP8 GEMM's input. Also the batch-1
// GEMV on E4M3 weights (launch_gemv_fp8).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/gemm/e4m3.cuh"
#include "backend/cuda/host_util.h"
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

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
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
        lo |= static_cast<uint32_t>(to_e4m3(__fmul_rn(v[e], inv))) << (8 * e);
        hi |= static_cast<uint32_t>(to_e4m3(__fmul_rn(v[e + 4], inv))) << (8 * e);
      }
      reinterpret_cast<uint2*>(q)[g] = make_uint2(lo, hi);
    }
  } else {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < count; i += stride)
      q[i] = to_e4m3(__fmul_rn(to_float(x[i]), inv));
  }
}

bool vec_ok(DType t, const void* x, const void* q, int64_t count) {
  const auto a = reinterpret_cast<uintptr_t>(x), b = reinterpret_cast<uintptr_t>(q);
  return count % 8 == 0 && a % (t == DType::kF32 ? 32 : 16) == 0 && b % 8 == 0;
}

// ---- batch-1 GEMV on E4M3 weights -------------------------------------------------
//
// One warp a weight row, 8 rows a block. Lane l's chunk c is the 16 weights
// (16 bytes) at element (l + 32 c) * 16: a warp reads 512 contiguous bytes a
// step. The first kPreChunks chunks of the row are loaded before pdl_wait()
// (weights only: 4 KB of each row in flight while the previous kernel
// finishes), the rest kUnroll8 chunks at a time. The activation stays in its
// 16-bit dtype (only the weight is FP8 at one row: the step is weight-read
// bound); the dot is fp32, times the matrix's scale s, + bias, + out when
// accumulating, rounded once.
constexpr int kGemvWarps = 8;
constexpr int kPreChunks = 8;  // 128 B a lane: a 4096-wide row whole
constexpr int kUnroll8 = 4;

template <class XT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_fp8_kernel(const uint8_t* __restrict__ w, int64_t m, int64_t k, const float* __restrict__ w_scale,
                    const XT* __restrict__ x, const float* __restrict__ bias, XT* __restrict__ out, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  const bool valid = row < m;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (valid ? row : 0) * k);
  const int64_t chunks = k / 16;  // k % 16 == 0
  uint4 pre[kPreChunks];
#pragma unroll
  for (int c = 0; c < kPreChunks; ++c) {
    const int64_t q = lane + 32 * c;
    pre[c] = valid && q < chunks ? wr[q] : make_uint4(0, 0, 0, 0);
  }
  pdl_launch_dependents();
  pdl_wait();
  if (!valid) return;
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kPreChunks; ++c) {
    const int64_t q = lane + 32 * c;
    if (q < chunks) acc += dot16_e4m3<XT>(pre[c], x + q * 16);
  }
  int64_t q = lane + 32 * kPreChunks;
  for (; q + 32 * (kUnroll8 - 1) < chunks; q += 32 * kUnroll8) {
    uint4 v[kUnroll8];
#pragma unroll
    for (int u = 0; u < kUnroll8; ++u) v[u] = wr[q + 32 * u];
#pragma unroll
    for (int u = 0; u < kUnroll8; ++u) acc += dot16_e4m3<XT>(v[u], x + (q + 32 * u) * 16);
  }
  for (; q < chunks; q += 32) acc += dot16_e4m3<XT>(wr[q], x + q * 16);
  const float sum = warp_sum(acc);
  if (lane == 0) {
    // One explicit fma (never left to contraction): the folded-norm GEMVs'
    // epilogue on E4M3 rows is the same, so their results agree bit for bit.
    float v = __fmaf_rn(sum, *w_scale, bias ? bias[row] : 0.0f);
    if (accumulate) v += to_float(out[row]);
    out[row] = from_float<XT>(v);
  }
}

}  // namespace

bool fp8_gemv_enabled() {
  static const bool off = env_equals("OSPREY_FP8_GEMV", "0");
  return !off;
}

bool launch_gemv_fp8(const void* w, int64_t m, int64_t k, const float* w_scale, DType x_dtype, const void* x,
                     const float* bias, void* out, bool accumulate, cudaStream_t stream) {
  const bool a16 = x_dtype == DType::kBF16 || x_dtype == DType::kF16;
  if (!fp8_gemv_enabled() || !a16 || m <= 0 || k <= 0 || k % 16 != 0 || !aligned16(w) ||
      !aligned16(x) || ceil_div(m, kGemvWarps) > int64_t{2147483647})
    return false;
  const dim3 grid(static_cast<unsigned>(ceil_div(m, kGemvWarps)));
  const auto* wp = static_cast<const uint8_t*>(w);
  OSP_DISPATCH_16(x_dtype, XT,
                  launch_pdl(gemv_fp8_kernel<XT>, grid, dim3(kGemvWarps * 32), 0, stream, wp, m, k, w_scale,
                             static_cast<const XT*>(x), bias, static_cast<XT*>(out), accumulate));
  return true;
}

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
