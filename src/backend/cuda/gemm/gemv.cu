// GEMV for few activation rows (decode) on packed weights of every dtype:
// one warp per output row, fp32 activations, fp32 accumulation. Each weight
// row is read once per pass of up to kGemvRowsPerPass activation rows.
// Also the fp32 dequantisation of weight panels for the GEMM fallback.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kN = kGemvRowsPerPass;

__device__ __forceinline__ float dot4(float4 a, const float* b) {
  return a.x * b[0] + a.y * b[1] + a.z * b[2] + a.w * b[3];
}

// Eight consecutive weights starting at element i (i % 8 == 0) of a 16-byte aligned row.
template <DType T>
__device__ __forceinline__ void load8(const char* row, int64_t i, float w[8]) {
  if constexpr (T == DType::kF32) {
    const float4 a = reinterpret_cast<const float4*>(row)[i / 4];
    const float4 b = reinterpret_cast<const float4*>(row)[i / 4 + 1];
    w[0] = a.x;
    w[1] = a.y;
    w[2] = a.z;
    w[3] = a.w;
    w[4] = b.x;
    w[5] = b.y;
    w[6] = b.z;
    w[7] = b.w;
  } else {
    const uint4 v = reinterpret_cast<const uint4*>(row)[i / 8];
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint16_t lo = static_cast<uint16_t>(words[j] & 0xffffu);
      const uint16_t hi = static_cast<uint16_t>(words[j] >> 16);
      if constexpr (T == DType::kF16) {
        w[2 * j] = half_bits_to_float(lo);
        w[2 * j + 1] = half_bits_to_float(hi);
      } else {
        w[2 * j] = bf16_bits_to_float(lo);
        w[2 * j + 1] = bf16_bits_to_float(hi);
      }
    }
  }
}

// out[r * ldo + row] = dot(x[r * k : +k], w row) (+ bias[row]) for r < n <= kN.
// kVec: rows and x are 16-byte aligned and k % 8 == 0 (dense) / k % 32 == 0 (quantised).
template <DType T, bool kVec>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const char* __restrict__ w, int64_t row_bytes, int64_t m, int64_t k, const float* __restrict__ x, int n,
                const float* __restrict__ bias, float* __restrict__ out, int64_t ldo) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= m) return;
  const char* wr = w + row * row_bytes;
  float acc[kN];
#pragma unroll
  for (int r = 0; r < kN; ++r) acc[r] = 0.0f;

  if constexpr (dtype_is_quantized(T)) {
    const int64_t nb = k / kQuantBlock;
    for (int64_t b = lane; b < nb; b += 32) {
      float wv[kQuantBlock];
      dequant_block<T>(wr + b * dtype_block_bytes(T), wv);
#pragma unroll
      for (int r = 0; r < kN; ++r) {
        if (r < n) {
          const float* xr = x + r * k + b * kQuantBlock;
          float s = 0.0f;
          if constexpr (kVec) {
#pragma unroll
            for (int j = 0; j < kQuantBlock / 4; ++j) s += dot4(reinterpret_cast<const float4*>(xr)[j], wv + 4 * j);
          } else {
#pragma unroll
            for (int j = 0; j < kQuantBlock; ++j) s += xr[j] * wv[j];
          }
          acc[r] += s;
        }
      }
    }
  } else if constexpr (kVec) {
    for (int64_t i = static_cast<int64_t>(lane) * 8; i < k; i += 32 * 8) {
      float wv[8];
      load8<T>(wr, i, wv);
#pragma unroll
      for (int r = 0; r < kN; ++r) {
        if (r < n) {
          const float4* xr = reinterpret_cast<const float4*>(x + r * k + i);
          acc[r] += dot4(xr[0], wv) + dot4(xr[1], wv + 4);
        }
      }
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) {
      const float wv = load_weight<T>(wr, i);
#pragma unroll
      for (int r = 0; r < kN; ++r) {
        if (r < n) acc[r] += wv * x[r * k + i];
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kN; ++r) {
    if (r < n) {
      const float s = warp_sum(acc[r]);
      if (lane == 0) out[r * ldo + row] = s + (bias ? bias[row] : 0.0f);
    }
  }
}

template <DType T>
__global__ void dequant_rows_kernel(const char* __restrict__ w, int64_t row_bytes, int64_t rows, int64_t k,
                                    float* __restrict__ dst) {
  const int64_t count = rows * k;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / k;
    dst[e] = load_weight<T>(w + r * row_bytes, e - r * k);
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <DType T>
void gemv_typed(const void* w, int64_t row_bytes, int64_t m, int64_t k, const float* x, int64_t n, const float* bias,
                float* out, cudaStream_t stream) {
  const bool vec =
      aligned16(w) && aligned16(x) && row_bytes % 16 == 0 && (dtype_is_quantized(T) || k % 8 == 0) && (k * 4) % 16 == 0;
  const auto* wp = static_cast<const char*>(w);
  const unsigned grid = static_cast<unsigned>(ceil_div(m, kWarps));
  for (int64_t r0 = 0; r0 < n; r0 += kN) {
    const int rows = static_cast<int>(std::min<int64_t>(kN, n - r0));
    const float* xp = x + r0 * k;
    float* op = out + r0 * m;
    // Quantised rows need no 16-byte alignment: blocks are read in 2-byte words.
    if (vec || (dtype_is_quantized(T) && aligned16(xp))) {
      gemv_kernel<T, true><<<grid, kWarps * 32, 0, stream>>>(wp, row_bytes, m, k, xp, rows, bias, op, m);
    } else {
      gemv_kernel<T, false><<<grid, kWarps * 32, 0, stream>>>(wp, row_bytes, m, k, xp, rows, bias, op, m);
    }
    OSP_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void launch_gemv(DType dtype, const void* w, int64_t row_bytes, int64_t m, int64_t k, const float* x, int64_t n,
                 const float* bias, float* out, cudaStream_t stream) {
  if (n == 0 || m == 0) return;
  OSP_CHECK_LE(ceil_div(m, kWarps), int64_t{2147483647});
  switch (dtype) {
    case DType::kF32:
      gemv_typed<DType::kF32>(w, row_bytes, m, k, x, n, bias, out, stream);
      break;
    case DType::kF16:
      gemv_typed<DType::kF16>(w, row_bytes, m, k, x, n, bias, out, stream);
      break;
    case DType::kBF16:
      gemv_typed<DType::kBF16>(w, row_bytes, m, k, x, n, bias, out, stream);
      break;
    case DType::kQ8_0:
      gemv_typed<DType::kQ8_0>(w, row_bytes, m, k, x, n, bias, out, stream);
      break;
    case DType::kQ4_0:
      gemv_typed<DType::kQ4_0>(w, row_bytes, m, k, x, n, bias, out, stream);
      break;
    case DType::kQ4_1:
      gemv_typed<DType::kQ4_1>(w, row_bytes, m, k, x, n, bias, out, stream);
      break;
    default:
      OSP_CHECK_MSG(false, "gemv: unsupported weight dtype " << dtype_name(dtype));
  }
}

void launch_dequant_rows(DType dtype, const void* w, int64_t row_bytes, int64_t rows, int64_t k, float* dst,
                         cudaStream_t stream) {
  if (rows * k == 0) return;
  const auto* wp = static_cast<const char*>(w);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(rows * k, 256), 65535 * 16));
  switch (dtype) {
    case DType::kF32:
      dequant_rows_kernel<DType::kF32><<<grid, 256, 0, stream>>>(wp, row_bytes, rows, k, dst);
      break;
    case DType::kF16:
      dequant_rows_kernel<DType::kF16><<<grid, 256, 0, stream>>>(wp, row_bytes, rows, k, dst);
      break;
    case DType::kBF16:
      dequant_rows_kernel<DType::kBF16><<<grid, 256, 0, stream>>>(wp, row_bytes, rows, k, dst);
      break;
    case DType::kQ8_0:
      dequant_rows_kernel<DType::kQ8_0><<<grid, 256, 0, stream>>>(wp, row_bytes, rows, k, dst);
      break;
    case DType::kQ4_0:
      dequant_rows_kernel<DType::kQ4_0><<<grid, 256, 0, stream>>>(wp, row_bytes, rows, k, dst);
      break;
    case DType::kQ4_1:
      dequant_rows_kernel<DType::kQ4_1><<<grid, 256, 0, stream>>>(wp, row_bytes, rows, k, dst);
      break;
    default:
      OSP_CHECK_MSG(false, "dequant_rows: unsupported weight dtype " << dtype_name(dtype));
  }
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
