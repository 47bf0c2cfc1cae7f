// Row-wise and elementwise kernels: embedding lookup, add, SiLU-and-mul
// (also with the RMS row scale of a folded norm), row gather, bias
// broadcast, float conversions, the seeded uniform fill and the column
// scaling that folds norm weights into projections at load. The kernels of
// the decode chain (embedding, add, SiLU-and-mul) are launched through
// launch_pdl (pdl.cuh) and call pdl_wait() before any access.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/host_util.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm/row_rms.cuh"
#include "backend/cuda/pdl.cuh"
#include "ops/uniform_hash.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;

// Grid for a grid-stride loop over `count` elements.
unsigned grid_for(int64_t count) {
  const int64_t blocks = ceil_div(std::max<int64_t>(count, 1), kThreads);
  return static_cast<unsigned>(std::min<int64_t>(blocks, 65535 * 8));
}

// One block per token; threads stride over the row.
template <DType T, class OutT>
__global__ void embedding_kernel(const char* table, int64_t row_bytes, int64_t vocab, int64_t d,
                                 const int32_t* __restrict__ ids, OutT* __restrict__ out) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  OutT* o = out + t * d;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = from_float<OutT>(0.0f);
    return;
  }
  const char* row = table + static_cast<int64_t>(id) * row_bytes;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = from_float<OutT>(load_weight<T>(row, i));
}

template <class T>
__global__ void add_kernel(T* __restrict__ x, const T* __restrict__ y, int64_t count) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = from_float<T>(to_float(x[i]) + to_float(y[i]));
  }
}

// BF16 or F16 rows (T) with f % 8 == 0 and 16-byte aligned rows: 8 outputs per thread.
template <class T>
__global__ void silu_mul_x8_kernel(const T* __restrict__ gate_up, int64_t n, int64_t f, T* __restrict__ out,
                                   const float* __restrict__ inv) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t count = n * f / 8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = (i * 8) / f;
    const int64_t c = i * 8 - r * f;
    float g[8], u[8];
    load8_act<T>(gate_up + r * 2 * f + c, g);
    load8_act<T>(gate_up + r * 2 * f + f + c, u);
    if (inv) {  // a folded norm's row factor, rounded as the projection of the normed row stores it
      const float s = inv[r];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        g[e] = rms_scale_round<T>(g[e], s);
        u[e] = rms_scale_round<T>(u[e], s);
      }
    }
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = silu_mul_value(g[e], u[e]);
    store8_act<T>(out + i * 8, o);
  }
}

// silu_mul of gate_up rows scaled by the RMS factor of x's rows (the
// projection of the raw residual x with the MLP norm weight folded into
// w_gate_up), for decode-size steps. Grid (chunks, rows): block (b, t) takes
// columns [b * per_block, (b + 1) * per_block) of row t, one column group a
// thread (8 columns with kVec: T 16-bit, f and per_block multiples of 8,
// gate_up and out 16-byte aligned; else 1). The group's loads are issued
// first, then the whole block reduces x[t, :] to inv (block_row_inv_rms),
// then g and u are scaled and rounded (rms_scale_round) and out = silu(g) *
// u rounded once, as silu_mul_x8_kernel with precomputed factors.
template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    rms_scaled_silu_mul_kernel(const T* __restrict__ x, int64_t d, float x_eps, const T* __restrict__ gate_up,
                               int64_t f, int64_t per_block, T* __restrict__ out) {
  constexpr int kUnit = kVec ? 8 : 1;
  __shared__ float red[32];
  pdl_launch_dependents();
  pdl_wait();
  const int64_t t = blockIdx.y;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * per_block;
  const int64_t c = c0 + static_cast<int64_t>(threadIdx.x) * kUnit;
  const bool active = c < min(f, c0 + per_block);
  const T* g_row = gate_up + t * 2 * f;
  const T* u_row = g_row + f;
  float g[kUnit], u[kUnit];
  if (active) {
    if constexpr (kVec) {
      load8_act<T>(g_row + c, g);
      load8_act<T>(u_row + c, u);
    } else {
      g[0] = to_float(g_row[c]);
      u[0] = to_float(u_row[c]);
    }
  }
  const float inv = block_row_inv_rms(x + t * d, d, x_eps, red);  // every thread: block_sum synchronises
  if (!active) return;
  float o[kUnit];
#pragma unroll
  for (int e = 0; e < kUnit; ++e) o[e] = silu_mul_value(rms_scale_round<T>(g[e], inv), rms_scale_round<T>(u[e], inv));
  if constexpr (kVec) {
    store8_act<T>(out + t * f + c, o);
  } else {
    out[t * f + c] = from_float<T>(o[0]);
  }
}

// w[i] *= scale[i % k] rounded to T, i < count. kVec: k % 8 == 0 and w
// 16-byte aligned; groups of 8 (one row, k being a multiple of 8) per step.
template <class T, bool kVec>
__global__ void scale_columns_kernel(T* __restrict__ w, int64_t count, int64_t k, const float* __restrict__ scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (kVec) {
    for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < count / 8; g += stride) {
      const int64_t i = g * 8;
      const int64_t c = i % k;
      float v[8];
      load8_act<T>(w + i, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] *= scale[c + e];
      store8_act<T>(w + i, v);
    }
  } else {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
      w[i] = from_float<T>(to_float(w[i]) * scale[i % k]);
    }
  }
}

template <class T>
__global__ void silu_mul_kernel(const T* __restrict__ gate_up, int64_t n, int64_t f, T* __restrict__ out,
                                const float* __restrict__ inv) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t count = n * f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / f;
    const int64_t c = i - r * f;
    float g = to_float(gate_up[r * 2 * f + c]);
    float u = to_float(gate_up[r * 2 * f + f + c]);
    if (inv) {
      g = rms_scale_round<T>(g, inv[r]);
      u = rms_scale_round<T>(u, inv[r]);
    }
    out[i] = from_float<T>(silu_mul_value(g, u));
  }
}

// One block per output row r (grid: num_rows, however many rows are
// filled), copying x row rows[r] in 4-byte words when row_bytes allows.
// A row index outside [0, num_x_rows) zeroes the output row (gather_rows,
// kZeroMissing) or leaves it unwritten (fill_rows_from).
template <class Word, bool kZeroMissing>
__global__ void copy_rows_kernel(const Word* __restrict__ x, int64_t row_words, int64_t num_x_rows,
                                 const int32_t* __restrict__ rows, Word* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const int32_t src = rows[r];
  Word* o = out + r * row_words;
  if (src < 0 || src >= num_x_rows) {
    if constexpr (kZeroMissing) {
      for (int64_t i = threadIdx.x; i < row_words; i += blockDim.x) o[i] = Word{};
    }
    return;
  }
  const Word* s = x + static_cast<int64_t>(src) * row_words;
  for (int64_t i = threadIdx.x; i < row_words; i += blockDim.x) o[i] = s[i];
}

template <bool kZeroMissing>
void launch_copy_rows(const void* x, int64_t row_bytes, int64_t num_x_rows, const int32_t* rows, int num_rows,
                      void* out, cudaStream_t stream) {
  if (num_rows == 0 || row_bytes == 0) return;
  const bool words =
      row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  const int64_t row_words = words ? row_bytes / 4 : row_bytes;
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, ceil_div(row_words, 32) * 32));
  if (words) {
    copy_rows_kernel<uint32_t, kZeroMissing><<<num_rows, threads, 0, stream>>>(
        static_cast<const uint32_t*>(x), row_words, num_x_rows, rows, static_cast<uint32_t*>(out));
  } else {
    copy_rows_kernel<uint8_t, kZeroMissing><<<num_rows, threads, 0, stream>>>(
        static_cast<const uint8_t*>(x), row_words, num_x_rows, rows, static_cast<uint8_t*>(out));
  }
  OSP_CUDA_CHECK_LAUNCH();
}

template <class T>
__global__ void fill_rows_kernel(const float* __restrict__ bias, int64_t n, int64_t m, T* __restrict__ out,
                                 int64_t ldo) {
  const int64_t count = n * m;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / m;
    const int64_t c = i - r * m;
    out[r * ldo + c] = from_float<T>(bias[c]);
  }
}

template <class S, class D>
__global__ void convert_kernel(const S* __restrict__ src, int64_t count, D* __restrict__ dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_float<D>(to_float(src[i]));
  }
}

template <class T>
__global__ void fill_uniform_kernel(T* __restrict__ dst, int64_t count, uint64_t seed, float lo, float span) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_float<T>(fmaf(span, ops::uniform_hash01(seed, static_cast<uint64_t>(i)), lo));
  }
}

}  // namespace

void launch_embedding(DType dtype, const void* table, int64_t row_bytes, int64_t vocab, int64_t d, const int32_t* ids,
                      int64_t n, DType out_dtype, void* out, cudaStream_t stream) {
  if (n == 0 || d == 0) return;
  OSP_CHECK_LE(n, int64_t{2147483647});
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, ceil_div(d, 32) * 32));
  const auto* t = static_cast<const char*>(table);
  const dim3 grid(static_cast<unsigned>(n));
  OSP_DISPATCH_ACT(out_dtype, O, {
    O* o = static_cast<O*>(out);
    OSP_DISPATCH_WEIGHT(
        dtype, W, "embedding: unsupported table dtype ",
        launch_pdl(embedding_kernel<W, O>, grid, dim3(threads), 0, stream, t, row_bytes, vocab, d, ids, o));
  });
}

void launch_add(DType act, void* x, const void* y, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  OSP_DISPATCH_ACT(act, T,
                   launch_pdl(add_kernel<T>, dim3(grid_for(count)), dim3(kThreads), 0, stream, static_cast<T*>(x),
                              static_cast<const T*>(y), count));
}

void launch_silu_mul(DType act, const void* gate_up, int64_t n, int64_t f, void* out, cudaStream_t stream,
                     const float* inv) {
  if (n * f == 0) return;
  if ((act == DType::kBF16 || act == DType::kF16) && f % 8 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    OSP_DISPATCH_16(act, T,
                    launch_pdl(silu_mul_x8_kernel<T>, dim3(grid_for(n * f / 8)), dim3(kThreads), 0, stream,
                               static_cast<const T*>(gate_up), n, f, static_cast<T*>(out), inv));
    return;
  }
  OSP_DISPATCH_ACT(act, T,
                   launch_pdl(silu_mul_kernel<T>, dim3(grid_for(n * f)), dim3(kThreads), 0, stream,
                              static_cast<const T*>(gate_up), n, f, static_cast<T*>(out), inv));
}

void launch_rms_scaled_silu_mul(DType act, const void* x, int64_t d, float x_eps, const void* gate_up, int64_t n,
                                int64_t f, void* out, cudaStream_t stream) {
  if (n * f == 0) return;
  OSP_CHECK_GT(d, 0);
  const bool vec = (act == DType::kBF16 || act == DType::kF16) && f % 8 == 0 && aligned16(gate_up) && aligned16(out);
  // A row's columns in chunks of at most one column group (8 columns, or 1)
  // per thread, so every load of the step is in flight at once behind the
  // row reductions (decode-size steps, where latency is what counts; the
  // backend computes the row factors in a pass of their own for larger
  // ones). Whole groups per block; the last chunk of a row may be short.
  OSP_CHECK_MSG(n <= 65535, "launch_rms_scaled_silu_mul takes decode-size steps (rows on grid y), got " << n);
  const int64_t unit = vec ? 8 : 1;
  const int64_t groups = ceil_div(f, unit);
  const int64_t chunks = ceil_div(groups, kThreads);
  const int64_t per_block = ceil_div(groups, chunks) * unit;
  const dim3 grid(static_cast<unsigned>(ceil_div(f, per_block)), static_cast<unsigned>(n));
  if (vec) {
    OSP_DISPATCH_16(act, T,
                    launch_pdl(rms_scaled_silu_mul_kernel<T, true>, grid, dim3(kThreads), 0, stream,
                               static_cast<const T*>(x), d, x_eps, static_cast<const T*>(gate_up), f, per_block,
                               static_cast<T*>(out)));
    return;
  }
  OSP_DISPATCH_ACT(act, T,
                   launch_pdl(rms_scaled_silu_mul_kernel<T, false>, grid, dim3(kThreads), 0, stream,
                              static_cast<const T*>(x), d, x_eps, static_cast<const T*>(gate_up), f, per_block,
                              static_cast<T*>(out)));
}

void launch_scale_columns(DType dtype, void* w, int64_t count, int64_t k, const float* scale, cudaStream_t stream) {
  if (count == 0) return;
  OSP_CHECK(k > 0 && count % k == 0);
  if (k % 8 == 0 && aligned16(w)) {
    OSP_DISPATCH_FLOAT(dtype, T, {
      scale_columns_kernel<T, true><<<grid_for(count / 8), kThreads, 0, stream>>>(static_cast<T*>(w), count, k,
                                                                                   scale);
    });
  } else {
    OSP_DISPATCH_FLOAT(dtype, T, {
      scale_columns_kernel<T, false><<<grid_for(count), kThreads, 0, stream>>>(static_cast<T*>(w), count, k, scale);
    });
  }
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const void* x, int64_t row_bytes, int64_t num_x_rows, const int32_t* rows, int num_rows,
                        void* out, cudaStream_t stream) {
  launch_copy_rows<true>(x, row_bytes, num_x_rows, rows, num_rows, out, stream);
}

void launch_fill_rows_from(const void* x, int64_t row_bytes, int64_t num_x_rows, const int32_t* src_rows,
                           int num_rows, void* out, cudaStream_t stream) {
  launch_copy_rows<false>(x, row_bytes, num_x_rows, src_rows, num_rows, out, stream);
}

void launch_fill_rows(const float* bias, int64_t n, int64_t m, DType out_dtype, void* out, int64_t ldo,
                      cudaStream_t stream) {
  if (n * m == 0) return;
  OSP_DISPATCH_ACT(out_dtype, T,
                   fill_rows_kernel<T><<<grid_for(n * m), kThreads, 0, stream>>>(bias, n, m, static_cast<T*>(out),
                                                                                 ldo));
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_convert(DType from, const void* src, int64_t count, DType to, void* dst, cudaStream_t stream) {
  if (count == 0) return;
  OSP_DISPATCH_FLOAT(from, S, {
    OSP_DISPATCH_FLOAT(to, D, {
      convert_kernel<S, D><<<grid_for(count), kThreads, 0, stream>>>(static_cast<const S*>(src), count,
                                                                     static_cast<D*>(dst));
    });
  });
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_fill_uniform(DType dtype, void* dst, int64_t count, uint64_t seed, float lo, float hi,
                         cudaStream_t stream) {
  if (count == 0) return;
  OSP_DISPATCH_FLOAT(dtype, T, {
    fill_uniform_kernel<T><<<grid_for(count), kThreads, 0, stream>>>(static_cast<T*>(dst), count, seed, lo, hi - lo);
  });
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
