// GEMV for few activation rows (decode) on packed weights of every dtype:
// one warp per output row, F32 or BF16 activations, fp32 accumulation. Each weight
// row is read once per pass of up to kGemvRowsPerPass activation rows.
// Launched with programmatic dependent launch (pdl.cuh): at one activation
// row of F16/BF16 weights the first weight chunks are loaded while the
// kernel before it (norm, SiLU-and-mul) still runs.
// An accumulate flag adds the output's old value in the epilogue (matmul_add:
// the residual stream, one fp32 add before the one rounding).
// Also the batch-1 gate/up GEMV with the SiLU-and-mul folded in
// (launch_gemv_silu_mul) and the fp32 dequantisation of weight panels for
// the GEMM fallback.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/host_util.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace osprey::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kN = kGemvRowsPerPass;

// The eight F16/BF16 weights of a raw 16-byte chunk as fp32.
template <DType T>
__device__ __forceinline__ void unpack8(uint4 v, float w[8]) {
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

// Eight consecutive weights starting at element i (i % 8 == 0) of a 16-byte aligned row.
template <DType T>
__device__ __forceinline__ void load8(const char* row, int64_t i, float w[8]) {
  if constexpr (T == DType::kF32) {
    load8_act<float>(reinterpret_cast<const float*>(row) + i, w);
  } else {
    unpack8<T>(reinterpret_cast<const uint4*>(row)[i / 8], w);
  }
}

// Weight chunks of 8 elements a lane has in flight per iteration of the
// dense vector loop (16-byte loads for F16/BF16: 4 x 16 B per lane).
constexpr int kUnroll = 4;

// Batch-1 GEMV on F16/BF16 rows: groups of kUnroll chunks a lane loads
// before pdl_wait() (registers live across the wait: 16 per group; 4 KB of
// each row in flight while the previous kernel finishes). One group measured
// the same on an H200 (docs/cuda.md).
constexpr int kPreGroups1 = 2;

constexpr int64_t kStep = 32 * 8;  // elements of one 16-byte chunk across the warp

// Batch-1 rows of F16/BF16 weights (16-byte aligned, k % 8 == 0): chunk c of
// a lane covers elements lane * 8 + c * kStep + [0, 8). load_pre loads the
// lane's first kPreChunks chunks raw (zero past k or for an invalid row):
// the loads issued before pdl_wait().
template <int kPreChunks>
__device__ __forceinline__ void load_pre(const char* wr, int64_t k, int lane, bool valid, uint4 (&pre)[kPreChunks]) {
#pragma unroll
  for (int c = 0; c < kPreChunks; ++c) {
    const int64_t idx = static_cast<int64_t>(lane) * 8 + c * kStep;
    pre[c] = valid && idx < k ? reinterpret_cast<const uint4*>(wr)[idx / 8] : make_uint4(0, 0, 0, 0);
  }
}

// The lane's share of dot(x[0, k), row): the pre-loaded chunks, then the
// rest kUnroll chunks at a time, every product added in ascending chunk
// order (as in gemv_kernel's other dense paths, so the sums are identical).
template <DType T, class XT, int kPreChunks>
__device__ __forceinline__ float lane_dot16(const char* wr, const uint4 (&pre)[kPreChunks], const XT* x, int64_t k,
                                            int lane) {
  float acc = 0.0f;
  int64_t i = static_cast<int64_t>(lane) * 8;
#pragma unroll
  for (int c = 0; c < kPreChunks; ++c) {
    const int64_t idx = i + c * kStep;
    if (idx < k) {
      float wv[8], xv[8];
      unpack8<T>(pre[c], wv);
      load8_act<XT>(x + idx, xv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += xv[e] * wv[e];
    }
  }
  i += kPreChunks * kStep;
  for (; i + (kUnroll - 1) * kStep < k; i += kUnroll * kStep) {
    float wv[kUnroll][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load8<T>(wr, i + u * kStep, wv[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float xv[8];
      load8_act<XT>(x + i + u * kStep, xv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += xv[e] * wv[u][e];
    }
  }
  for (; i < k; i += kStep) {
    float wv[8], xv[8];
    load8<T>(wr, i, wv);
    load8_act<XT>(x + i, xv);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += xv[e] * wv[e];
  }
  return acc;
}

// out[r * ldo + row] = dot(x[r * k : +k], w row) (+ bias[row]) for r < n <= kN;
// accumulate: + out[r * ldo + row] too, read after pdl_wait and added in
// fp32 before the one rounding to OT (matmul_add: the residual).
// kVec: rows and x are 16-byte aligned and k % 8 == 0 (dense) / k % 32 == 0 (quantised).
// kNR: activation rows the kernel is compiled for (1 for batch-1 decode:
// fewer registers, more warps resident, no wave tail at 4096-row matrices).
// Launched through launch_pdl: only weights are read before pdl_wait()
// (batch 1 on F16/BF16 rows: the first kPreGroups groups of kUnroll chunks).
template <DType T, class XT, class OT, bool kVec, int kNR, int kPreGroups = 1>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const char* __restrict__ w, int64_t row_bytes, int64_t m, int64_t k, const XT* __restrict__ x, int n,
                const float* __restrict__ bias, OT* __restrict__ out, int64_t ldo, bool accumulate) {
  // Batch 1 only: more rows would hold kNR accumulators across the wait too.
  constexpr bool kPre = kVec && kNR == 1 && (T == DType::kF16 || T == DType::kBF16);
  constexpr int kPreChunks = kPre ? kPreGroups * kUnroll : 1;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const bool valid = row < m;
  const char* wr = w + (valid ? row : 0) * row_bytes;
  // The row's first chunks, raw, in flight across the wait (zero past k).
  [[maybe_unused]] uint4 pre[kPreChunks];
  if constexpr (kPre) load_pre(wr, k, lane, valid, pre);
  pdl_launch_dependents();
  pdl_wait();
  if (!valid) return;
  float acc[kNR];
#pragma unroll
  for (int r = 0; r < kNR; ++r) acc[r] = 0.0f;

  if constexpr (kPre) {
    acc[0] = lane_dot16<T, XT, kPreChunks>(wr, pre, x, k, lane);
  } else if constexpr (dtype_is_quantized(T)) {
    const int64_t nb = k / kQuantBlock;
    for (int64_t b = lane; b < nb; b += 32) {
      float wv[kQuantBlock];
      dequant_block<T>(wr + b * dtype_block_bytes(T), wv);
#pragma unroll
      for (int r = 0; r < kNR; ++r) {
        if (r < n) {
          const XT* xr = x + r * k + b * kQuantBlock;
          float s = 0.0f;
          if constexpr (kVec) {
#pragma unroll
            for (int j = 0; j < kQuantBlock / 8; ++j) {
              float xv[8];
              load8_act<XT>(xr + 8 * j, xv);
#pragma unroll
              for (int e = 0; e < 8; ++e) s += xv[e] * wv[8 * j + e];
            }
          } else {
#pragma unroll
            for (int j = 0; j < kQuantBlock; ++j) s += to_float(xr[j]) * wv[j];
          }
          acc[r] += s;
        }
      }
    }
  } else if constexpr (kVec) {
    int64_t i = static_cast<int64_t>(lane) * 8;
    // Main loop: kUnroll independent 16-byte weight loads in flight per lane.
    for (; i + (kUnroll - 1) * kStep < k; i += kUnroll * kStep) {
      float wv[kUnroll][8];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load8<T>(wr, i + u * kStep, wv[u]);
#pragma unroll
      for (int r = 0; r < kNR; ++r) {
        if (r < n) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            float xv[8];
            load8_act<XT>(x + r * k + i + u * kStep, xv);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r] += xv[e] * wv[u][e];
          }
        }
      }
    }
    for (; i < k; i += kStep) {
      float wv[8];
      load8<T>(wr, i, wv);
#pragma unroll
      for (int r = 0; r < kNR; ++r) {
        if (r < n) {
          float xv[8];
          load8_act<XT>(x + r * k + i, xv);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r] += xv[e] * wv[e];
        }
      }
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) {
      const float wv = load_weight<T>(wr, i);
#pragma unroll
      for (int r = 0; r < kNR; ++r) {
        if (r < n) acc[r] += wv * to_float(x[r * k + i]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kNR; ++r) {
    if (r < n) {
      const float s = warp_sum(acc[r]);
      if (lane == 0) {
        float v = s + (bias ? bias[row] : 0.0f);
        if (accumulate) v += to_float(out[r * ldo + row]);
        out[r * ldo + row] = from_float<OT>(v);
      }
    }
  }
}

// Batch-1 gate/up GEMV with the SiLU-and-mul folded in, w [2 f, k] of
// F16/BF16 (16-byte aligned rows, k % 8 == 0): block b's warps 0..3 take the
// gate rows j = 4 b + w and warps 4..7 the matching up rows f + j. Each dot
// is gemv_kernel's batch-1 one (load_pre before pdl_wait, lane_dot16,
// warp_sum, + 0.0f as for a missing bias) rounded to XT; then thread t < 4
// writes silu(g) * u with silu_mul_x8_kernel's expression, so out is bit for
// bit the two-kernel result. Launched through launch_pdl (same contract).
constexpr int kGluCols = kWarps / 2;  // output columns per block

template <DType T, class XT>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_silu_mul_kernel(const char* __restrict__ w, int64_t row_bytes, int64_t f, int64_t k,
                         const XT* __restrict__ x, XT* __restrict__ out) {
  constexpr int kPreChunks = kPreGroups1 * kUnroll;
  __shared__ float s_gu[2][kGluCols];  // [gate, up][column in block], rounded to XT
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int half = warp / kGluCols;  // 0: gate row, 1: up row
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGluCols + warp % kGluCols;
  const bool valid = j < f;
  const char* wr = w + (valid ? j + half * f : 0) * row_bytes;
  uint4 pre[kPreChunks];
  load_pre(wr, k, lane, valid, pre);
  pdl_launch_dependents();
  pdl_wait();
  if (valid) {
    const float s = warp_sum(lane_dot16<T, XT, kPreChunks>(wr, pre, x, k, lane));
    if (lane == 0) s_gu[half][warp % kGluCols] = to_float(from_float<XT>(s + 0.0f));
  }
  __syncthreads();
  const int64_t jo = static_cast<int64_t>(blockIdx.x) * kGluCols + threadIdx.x;
  if (threadIdx.x < kGluCols && jo < f) {
    const float g = s_gu[0][threadIdx.x];
    const float u = s_gu[1][threadIdx.x];
    out[jo] = from_float<XT>(g / (1.0f + expf(-g)) * u);
  }
}

bool fused_silu_enabled() {
  static const bool on = !env_equals("OSPREY_FUSED_SILU", "0");
  return on;
}

template <DType T, class OT>
__global__ void dequant_rows_kernel(const char* __restrict__ w, int64_t row_bytes, int64_t rows, int64_t k,
                                    OT* __restrict__ dst) {
  const int64_t count = rows * k;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / k;
    dst[e] = from_float<OT>(load_weight<T>(w + r * row_bytes, e - r * k));
  }
}

template <DType T, class XT, class OT>
void gemv_typed(const void* w, int64_t row_bytes, int64_t m, int64_t k, const XT* x, int64_t n, const float* bias,
                OT* out, bool accumulate, cudaStream_t stream) {
  const bool vec = aligned16(w) && aligned16(x) && row_bytes % 16 == 0 && (dtype_is_quantized(T) || k % 8 == 0) &&
                   (k * static_cast<int64_t>(sizeof(XT))) % 16 == 0;
  const auto* wp = static_cast<const char*>(w);
  const unsigned grid = static_cast<unsigned>(ceil_div(m, kWarps));
  for (int64_t r0 = 0; r0 < n; r0 += kN) {
    const int rows = static_cast<int>(std::min<int64_t>(kN, n - r0));
    const XT* xp = x + r0 * k;
    OT* op = out + r0 * m;
    // Quantised rows need no 16-byte alignment: blocks are read in 2-byte words.
    const bool v = vec || (dtype_is_quantized(T) && aligned16(xp) && (k * static_cast<int64_t>(sizeof(XT))) % 16 == 0);
    if (v && rows == 1) {
      launch_pdl(gemv_kernel<T, XT, OT, true, 1, kPreGroups1>, dim3(grid), dim3(kWarps * 32), 0, stream, wp, row_bytes,
                 m, k, xp, rows, bias, op, m, accumulate);
    } else if (v) {
      launch_pdl(gemv_kernel<T, XT, OT, true, kN>, dim3(grid), dim3(kWarps * 32), 0, stream, wp, row_bytes, m, k, xp,
                 rows, bias, op, m, accumulate);
    } else {
      launch_pdl(gemv_kernel<T, XT, OT, false, kN>, dim3(grid), dim3(kWarps * 32), 0, stream, wp, row_bytes, m, k, xp,
                 rows, bias, op, m, accumulate);
    }
  }
}

template <class XT, class OT>
void gemv_for_types(DType dtype, const void* w, int64_t row_bytes, int64_t m, int64_t k, const void* x, int64_t n,
                    const float* bias, void* out, bool accumulate, cudaStream_t stream) {
  const auto* xp = static_cast<const XT*>(x);
  auto* op = static_cast<OT*>(out);
  OSP_DISPATCH_WEIGHT(dtype, W, "gemv: unsupported weight dtype ",
                      gemv_typed<W>(w, row_bytes, m, k, xp, n, bias, op, accumulate, stream));
}

}  // namespace

void launch_gemv(DType dtype, const void* w, int64_t row_bytes, int64_t m, int64_t k, DType x_dtype, const void* x,
                 int64_t n, const float* bias, DType out_dtype, void* out, cudaStream_t stream, bool accumulate) {
  if (n == 0 || m == 0) return;
  OSP_CHECK_LE(ceil_div(m, kWarps), int64_t{2147483647});
  if (x_dtype == DType::kF32 && out_dtype == DType::kF32) {
    gemv_for_types<float, float>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, stream);
  } else if (x_dtype == DType::kBF16 && out_dtype == DType::kBF16) {
    gemv_for_types<__nv_bfloat16, __nv_bfloat16>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, stream);
  } else if (x_dtype == DType::kBF16 && out_dtype == DType::kF32) {
    gemv_for_types<__nv_bfloat16, float>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, stream);
  } else if (x_dtype == DType::kF16 && out_dtype == DType::kF16) {
    gemv_for_types<__half, __half>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, stream);
  } else if (x_dtype == DType::kF16 && out_dtype == DType::kF32) {
    gemv_for_types<__half, float>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, stream);
  } else {
    OSP_CHECK_MSG(false, "gemv: unsupported activation/output dtypes " << dtype_name(x_dtype) << " -> "
                                                                       << dtype_name(out_dtype));
  }
}

bool launch_gemv_silu_mul(DType w_dtype, const void* w, int64_t row_bytes, int64_t f, int64_t k, DType act,
                          const void* x, void* out, cudaStream_t stream) {
  const bool w16 = w_dtype == DType::kBF16 || w_dtype == DType::kF16;
  const bool a16 = act == DType::kBF16 || act == DType::kF16;
  if (!w16 || !a16 || !fused_silu_enabled() || f <= 0 || k <= 0 || k % 8 != 0 || row_bytes % 16 != 0 ||
      !aligned16(w) || !aligned16(x) || ceil_div(f, kGluCols) > int64_t{2147483647})
    return false;
  const dim3 grid(static_cast<unsigned>(ceil_div(f, kGluCols)));
  const auto* wp = static_cast<const char*>(w);
  auto go = [&](auto wtag, auto* xp) {
    using XT = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
    constexpr DType W = decltype(wtag)::value;
    launch_pdl(gemv_silu_mul_kernel<W, XT>, grid, dim3(kWarps * 32), 0, stream, wp, row_bytes, f, k, xp,
               static_cast<XT*>(out));
  };
  using BfTag = std::integral_constant<DType, DType::kBF16>;
  using HTag = std::integral_constant<DType, DType::kF16>;
  if (act == DType::kBF16) {
    const auto* xp = static_cast<const __nv_bfloat16*>(x);
    w_dtype == DType::kBF16 ? go(BfTag{}, xp) : go(HTag{}, xp);
  } else {
    const auto* xp = static_cast<const __half*>(x);
    w_dtype == DType::kBF16 ? go(BfTag{}, xp) : go(HTag{}, xp);
  }
  return true;
}

void launch_dequant_rows(DType dtype, const void* w, int64_t row_bytes, int64_t rows, int64_t k, DType out_dtype,
                         void* dst, cudaStream_t stream) {
  if (rows * k == 0) return;
  const auto* wp = static_cast<const char*>(w);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(rows * k, 256), 65535 * 16));
  OSP_DISPATCH_ACT(out_dtype, OT, {
    OT* d = static_cast<OT*>(dst);
    OSP_DISPATCH_WEIGHT(dtype, W, "dequant_rows: unsupported weight dtype ",
                        dequant_rows_kernel<W, OT><<<grid, 256, 0, stream>>>(wp, row_bytes, rows, k, d));
  });
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
