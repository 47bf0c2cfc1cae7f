// Row-wise and elementwise kernels: embedding lookup, add, SiLU-and-mul,
// row gather, bias broadcast and fp32 -> F16/BF16 conversion.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;

// Grid for a grid-stride loop over `count` elements.
unsigned grid_for(int64_t count) {
  const int64_t blocks = ceil_div(std::max<int64_t>(count, 1), kThreads);
  return static_cast<unsigned>(std::min<int64_t>(blocks, 65535 * 8));
}

// One block per token; threads stride over the row.
template <DType T>
__global__ void embedding_kernel(const char* table, int64_t row_bytes, int64_t vocab, int64_t d,
                                 const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + t * d;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = 0.0f;
    return;
  }
  const char* row = table + static_cast<int64_t>(id) * row_bytes;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = load_weight<T>(row, i);
}

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void silu_mul_kernel(const float* __restrict__ gate_up, int64_t n, int64_t f, float* __restrict__ out) {
  const int64_t count = n * f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / f;
    const int64_t c = i - r * f;
    const float g = gate_up[r * 2 * f + c];
    const float u = gate_up[r * 2 * f + f + c];
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

// One block per output row; copies 4-byte words when row_bytes allows.
template <class Word>
__global__ void gather_rows_kernel(const Word* __restrict__ x, int64_t row_words, int64_t num_x_rows,
                                   const int32_t* __restrict__ rows, Word* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const int32_t src = rows[r];
  Word* o = out + r * row_words;
  if (src < 0 || src >= num_x_rows) {
    for (int64_t i = threadIdx.x; i < row_words; i += blockDim.x) o[i] = Word{};
    return;
  }
  const Word* s = x + static_cast<int64_t>(src) * row_words;
  for (int64_t i = threadIdx.x; i < row_words; i += blockDim.x) o[i] = s[i];
}

__global__ void fill_rows_kernel(const float* __restrict__ bias, int64_t n, int64_t m, float* __restrict__ out) {
  const int64_t count = n * m;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = bias[i % m];
  }
}

template <class T>
__global__ void convert_kernel(const float* __restrict__ src, int64_t count, T* __restrict__ dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_float<T>(src[i]);
  }
}

}  // namespace

void launch_embedding(DType dtype, const void* table, int64_t row_bytes, int64_t vocab, int64_t d, const int32_t* ids,
                      int64_t n, float* out, cudaStream_t stream) {
  if (n == 0 || d == 0) return;
  OSP_CHECK_LE(n, int64_t{2147483647});
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, ceil_div(d, 32) * 32));
  const auto* t = static_cast<const char*>(table);
  const dim3 grid(static_cast<unsigned>(n));
  switch (dtype) {
    case DType::kF32:
      embedding_kernel<DType::kF32><<<grid, threads, 0, stream>>>(t, row_bytes, vocab, d, ids, out);
      break;
    case DType::kF16:
      embedding_kernel<DType::kF16><<<grid, threads, 0, stream>>>(t, row_bytes, vocab, d, ids, out);
      break;
    case DType::kBF16:
      embedding_kernel<DType::kBF16><<<grid, threads, 0, stream>>>(t, row_bytes, vocab, d, ids, out);
      break;
    case DType::kQ8_0:
      embedding_kernel<DType::kQ8_0><<<grid, threads, 0, stream>>>(t, row_bytes, vocab, d, ids, out);
      break;
    case DType::kQ4_0:
      embedding_kernel<DType::kQ4_0><<<grid, threads, 0, stream>>>(t, row_bytes, vocab, d, ids, out);
      break;
    case DType::kQ4_1:
      embedding_kernel<DType::kQ4_1><<<grid, threads, 0, stream>>>(t, row_bytes, vocab, d, ids, out);
      break;
    default:
      OSP_CHECK_MSG(false, "embedding: unsupported table dtype " << dtype_name(dtype));
  }
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_add(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  add_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, y, count);
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_silu_mul(const float* gate_up, int64_t n, int64_t f, float* out, cudaStream_t stream) {
  if (n * f == 0) return;
  silu_mul_kernel<<<grid_for(n * f), kThreads, 0, stream>>>(gate_up, n, f, out);
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const void* x, int64_t row_bytes, int64_t num_x_rows, const int32_t* rows, int num_rows,
                        void* out, cudaStream_t stream) {
  if (num_rows == 0 || row_bytes == 0) return;
  const bool words =
      row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  const int64_t row_words = words ? row_bytes / 4 : row_bytes;
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, ceil_div(row_words, 32) * 32));
  if (words) {
    gather_rows_kernel<uint32_t><<<num_rows, threads, 0, stream>>>(static_cast<const uint32_t*>(x), row_words,
                                                                   num_x_rows, rows, static_cast<uint32_t*>(out));
  } else {
    gather_rows_kernel<uint8_t><<<num_rows, threads, 0, stream>>>(static_cast<const uint8_t*>(x), row_words, num_x_rows,
                                                                  rows, static_cast<uint8_t*>(out));
  }
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_fill_rows(const float* bias, int64_t n, int64_t m, float* out, cudaStream_t stream) {
  if (n * m == 0) return;
  fill_rows_kernel<<<grid_for(n * m), kThreads, 0, stream>>>(bias, n, m, out);
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_convert_f32(const float* src, int64_t count, DType to, void* dst, cudaStream_t stream) {
  if (count == 0) return;
  if (to == DType::kF16) {
    convert_kernel<__half><<<grid_for(count), kThreads, 0, stream>>>(src, count, static_cast<__half*>(dst));
  } else {
    OSP_CHECK_MSG(to == DType::kBF16, "convert_f32: unsupported target " << dtype_name(to));
    convert_kernel<__nv_bfloat16>
        <<<grid_for(count), kThreads, 0, stream>>>(src, count, static_cast<__nv_bfloat16*>(dst));
  }
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
