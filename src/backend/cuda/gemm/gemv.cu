// GEMV for few activation rows (decode) on packed weights of every dtype:
// one warp per output row, F32 or BF16 activations, fp32 accumulation. Each weight
// row is read once per pass of up to kGemvRowsPerPass activation rows.
// Launched with programmatic dependent launch (pdl.cuh): at one activation
// row of F16/BF16 weights the first weight chunks are loaded while the
// kernel before it (norm, SiLU-and-mul) still runs.
// An accumulate flag adds the output's old value in the epilogue (matmul_add:
// the residual stream, one fp32 add before the one rounding).
// Also the batch-1 gate/up GEMV with the SiLU-and-mul folded in
// (launch_gemv_silu_mul), the RMSNorm of x folded into both on 16-bit
// weights and at one row on E4M3 ones (launch_gemv_rms_norm*: separate
// kernels that stage the normed rows once per block in shared memory, see
// "RMSNorm folded into the GEMV" below), the batch-1 GEMV on E4M3 weights
// (launch_gemv_fp8), and the fp32 dequantisation of weight panels for the
// GEMM fallback.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/attention/mma_ptx.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/device_query.h"
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
// the loads issued before pdl_wait(). kE: weights in a 16-byte chunk (8 for
// F16/BF16; 16 for E4M3 rows, whose chunk c covers lane * 16 + c * 512 + [0, 16)).
template <int kPreChunks, int kE = 8>
__device__ __forceinline__ void load_pre(const char* wr, int64_t k, int lane, bool valid, uint4 (&pre)[kPreChunks]) {
#pragma unroll
  for (int c = 0; c < kPreChunks; ++c) {
    const int64_t idx = static_cast<int64_t>(lane) * kE + c * 32 * kE;
    pre[c] = valid && idx < k ? reinterpret_cast<const uint4*>(wr)[idx / kE] : make_uint4(0, 0, 0, 0);
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

// acc[r] += dot8(x row r at element idx, wv) for r < n <= kNR: one 8-element
// weight chunk against each activation row (rows k elements apart).
template <class XT, int kNR>
__device__ __forceinline__ void fma_rows8(float (&acc)[kNR], const float (&wv)[8], const XT* x, int64_t k, int64_t idx,
                                          int n) {
#pragma unroll
  for (int r = 0; r < kNR; ++r) {
    if (r < n) {
      float xv[8];
      load8_act<XT>(x + r * k + idx, xv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[r] += xv[e] * wv[e];
    }
  }
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
      fma_rows8<XT, kNR>(acc, wv, x, k, i, n);
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
    out[jo] = from_float<XT>(silu_mul_value(g, u));
  }
}

// False when OSPREY_FP8_GEMV=0 is set (read once): no batch-1 kernel on
// E4M3 weights then (launch_gemv_fp8 and the folded-norm GEMVs decline;
// cuBLASLt's FP8 GEMM runs on the quantised row).
bool fp8_gemv_enabled() {
  static const bool off = env_equals("OSPREY_FP8_GEMV", "0");
  return !off;
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

// Quantised rows -> dst [rows, k] (k % 32 == 0, dst 16-byte aligned): one
// thread per eight weights (a quarter block), so a warp reads eight
// consecutive blocks once each and writes 16-byte (BF16/F16) or 2 x 16-byte
// (F32) chunks side by side. dequant_rows_kernel took one thread per weight
// and re-read the block's scale for each: ~8% of copy bandwidth (H100).
template <DType T, class OT>
__global__ void __launch_bounds__(256) dequant_blocks_kernel(const char* __restrict__ w, int64_t row_bytes,
                                                             int64_t rows, int64_t nb, OT* __restrict__ dst) {
  const int64_t quarters = rows * nb * 4;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < quarters;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t blk = e >> 2;  // block index over the rows, row-major
    const int64_t r = blk / nb;
    const int q = static_cast<int>(e & 3);
    float v[8];
    dequant_quarter<T>(w + r * row_bytes + (blk - r * nb) * dtype_block_bytes(T), q, v);
    OT* o = dst + e * 8;
    if constexpr (std::is_same_v<OT, float>) {
      reinterpret_cast<float4*>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint32_t p[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const OT a = from_float<OT>(v[2 * j]), b = from_float<OT>(v[2 * j + 1]);
        p[j] = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&a)) |
               (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&b)) << 16);
      }
      *reinterpret_cast<uint4*>(o) = make_uint4(p[0], p[1], p[2], p[3]);
    }
  }
}

// Batch-1 GEMV on Q8_0 rows whose byte length is a multiple of 16 (k a
// multiple of 256): one warp per weight row. The row streams through two
// shared-memory buffers of kQ1SegBlocks blocks each in 16-byte cp.async
// copies (the next segment in flight while this one is used; the first
// requested before pdl_wait, as weights are never written by the stream).
// Each group of 8 lanes takes one block at a time, 4 weights a lane, with
// the activations read 4 at a time. gemv_kernel's quantised branch (one
// lane per block, 2-byte global loads) read Q8_0 weights at 37-54% of copy
// bandwidth (H200, Llama-3-8B shapes); this kernel at 44-66% (qkv 17.4 ->
// 12.8 us, o 11.7 -> 9.7, gate_up 55.9 -> 45.4, down 35.6 -> 30.2;
// gpu_op_bench gemm-small-quant, OSPREY_QGEMV1 A/B). The same scheme for
// Q4_0 / Q4_1 was slower than gemv_kernel (gate_up Q4_0 46.4 -> 54.8 us,
// Q4_1 45.4 -> 60.3: half the bytes per weight, so the per-weight work
// bounds it; docs/PERF.md, session 11): they have staged_qgemv1_kernel below,
// which since session 12 takes Q8_0 rows first too (this kernel remains for
// rows it does not take, and for OSPREY_Q4GEMV1=0).
constexpr int kQ1Warps = 8;
constexpr int kQ1SegBlocks = 32;

template <class XT>
__device__ __forceinline__ void load4_act(const XT* p, float (&v)[4]) {
  if constexpr (std::is_same_v<XT, float>) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const uint16_t h[4] = {static_cast<uint16_t>(u.x & 0xffffu), static_cast<uint16_t>(u.x >> 16),
                           static_cast<uint16_t>(u.y & 0xffffu), static_cast<uint16_t>(u.y >> 16)};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[j] = std::is_same_v<XT, __half> ? half_bits_to_float(h[j]) : bf16_bits_to_float(h[j]);
    }
  }
}

template <class XT, class OT>
__global__ void __launch_bounds__(kQ1Warps * 32)
    qgemv1_kernel(const char* __restrict__ w, int64_t row_bytes, int64_t m, int64_t k, const XT* __restrict__ x,
                  const float* __restrict__ bias, OT* __restrict__ out, bool accumulate) {
  constexpr int kBlockBytes = static_cast<int>(dtype_block_bytes(DType::kQ8_0));
  constexpr int kSeg = kQ1SegBlocks * kBlockBytes;  // 1088 bytes
  static_assert(kSeg % 16 == 0, "segments of whole 16-byte chunks");
  __shared__ __align__(16) unsigned char smem[kQ1Warps][2][kSeg];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kQ1Warps + warp;
  const bool valid = row < m;
  const char* wr = w + (valid ? row : 0) * row_bytes;
  const int nb = static_cast<int>(k / kQuantBlock);
  const int nseg = (nb + kQ1SegBlocks - 1) / kQ1SegBlocks;
  // Segment s into buffer s & 1; the row's length is a multiple of 16, so
  // the last (partial) segment is too.
  auto load_seg = [&](int s) {
    const int bytes = min(kSeg, static_cast<int>(row_bytes - static_cast<int64_t>(s) * kSeg));
    const char* src = wr + static_cast<int64_t>(s) * kSeg;
    unsigned char* dst = smem[warp][s & 1];
    for (int c = lane; c < bytes / 16; c += 32) cp_async16(dst + 16 * c, src + 16 * c, 16);
    cp_async_commit();
  };
  if (valid) load_seg(0);
  pdl_launch_dependents();
  pdl_wait();
  if (!valid) return;
  const int sub = lane & 7;   // weights 4 sub .. 4 sub + 3 of a block
  const int bsel = lane >> 3;  // first block of the segment this lane takes; then every 4th
  const int e0 = 4 * sub;
  float acc = 0.0f;
  for (int s = 0; s < nseg; ++s) {
    if (s + 1 < nseg) {
      load_seg(s + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncwarp();
    const unsigned char* seg = smem[warp][s & 1];
    const int blocks = min(kQ1SegBlocks, nb - s * kQ1SegBlocks);
    for (int b = bsel; b < blocks; b += 4) {
      const unsigned char* blk = seg + b * kBlockBytes;
      float xv[4];
      load4_act<XT>(x + (static_cast<int64_t>(s) * kQ1SegBlocks + b) * kQuantBlock + e0, xv);
      const float d = half_bits_to_float(*reinterpret_cast<const uint16_t*>(blk));
      const auto* q2 = reinterpret_cast<const uint16_t*>(blk + 2 + e0);  // quants e0 .. e0 + 3
      const uint16_t v0 = q2[0], v1 = q2[1];
      const float dot = s8_to_float(v0) * xv[0] + s8_to_float(v0 >> 8) * xv[1] + s8_to_float(v1) * xv[2] +
                        s8_to_float(v1 >> 8) * xv[3];
      acc += d * dot;
    }
    __syncwarp();  // every lane is done with this buffer before segment s + 2 is copied into it
  }
  const float sum = warp_sum(acc);
  if (lane == 0) {
    float v = sum + (bias ? bias[row] : 0.0f);
    if (accumulate) v += to_float(out[row]);
    out[row] = from_float<OT>(v);
  }
}

// Batch-1 GEMV on Q4_0 / Q4_1 / Q8_0 rows, k a multiple of 256 (rows of
// whole 16-byte chunks). gemv_kernel's quantised branch (one lane a whole
// block, 2-byte global loads, the block's 32 activations re-read and
// converted per row) is bound by instruction issue at ~5 instructions a
// weight: 24-39% of copy bandwidth on an H200; qgemv1_kernel (Q8_0) also
// re-reads and converts x per row. Here:
// - a persistent grid of at most one block of kSqWarps warps per SM stages
//   x as fp32 in shared memory once (and, Q4_1, the sums of x that each
//   lane's 8 weights of a block meet), every row of the block reads it;
// - warp w of block b takes rows (b + i * gridDim.x) * kSqWarps + w; its
//   rows stream through a kSqStages-deep ring of shared-memory segments of
//   seg_blocks blocks (16-byte cp.async, one copy group per segment,
//   continuing across the warp's rows; the first before pdl_wait, as
//   weights are never written by the stream);
// - four lanes share a block, 8 weights a lane: lane s of a Q4 block reads
//   its bytes 4 s .. 4 s + 3, whose low nibbles are weights 4 s .. 4 s + 3
//   and high nibbles 16 + 4 s .. 19 + 4 s; lane s of a Q8_0 block its bytes
//   (weights) 8 s .. 8 s + 7, XOR 0x80; a byte permute puts each value q into
//   the float bits of 2^23 + q, one subtraction makes q - 8 (Q4_0), q (Q4_1)
//   or the int8 (Q8_0) exactly, one FMA adds it times x: ~4 instructions a
//   weight.
// The lane's block dot is scaled once by d (plus m times its x sum, Q4_1).
// The sums are in another order than gemv_kernel's (d is applied per block,
// not per weight), both fp32. H200, Llama-3-8B shapes (gpu_op_bench
// gemm-small-quant, OSPREY_Q4GEMV1 A/B, session 12): Q4_0 qkv 14.2 -> 9.3
// us, o 11.2 -> 7.1, gate_up 46.5 -> 33.5, down 31.6 -> 19.2; Q4_1 qkv 11.0
// -> 10.1, o 10.7 -> 7.7, gate_up 45.8 -> 35.9, down 31.7 -> 20.5: a layer's
// four projections 25-33% faster (gate_up Q4_0 at 46% of copy). Without
// the swizzle of the staged x (below) shared-memory bank conflicts held the
// gain to 7-10% (ncu: short-scoreboard stalls 45% of the cycles). Q8_0
// against qgemv1_kernel: qkv 12.5 -> 12.3 us, o 12.1 -> 9.1, gate_up 51.7 ->
// 45.5, down 39.9 -> 24.7.
constexpr int kSqWarps = 16;
constexpr int kSqStages = 3;
// Blocks of one ring segment at most: ~2.3-2.6 KB (Q8_0's blocks are 34 bytes).
template <DType W>
constexpr int kSqMaxSegBlocks = W == DType::kQ8_0 ? 64 : 128;
constexpr size_t kSqMaxSmem = 220 * 1024;

template <DType W, class XT, class OT>
__global__ void __launch_bounds__(kSqWarps * 32, 1)
    staged_qgemv1_kernel(const char* __restrict__ w, int64_t row_bytes, int64_t m, int64_t k,
                         const XT* __restrict__ x, const float* __restrict__ bias, OT* __restrict__ out,
                         bool accumulate, int seg_blocks) {
  static_assert(W == DType::kQ4_0 || W == DType::kQ4_1 || W == DType::kQ8_0, "quantised blocks");
  constexpr bool kQ8 = W == DType::kQ8_0;
  constexpr int kBB = static_cast<int>(dtype_block_bytes(W));
  constexpr int kQsOff = W == DType::kQ4_1 ? 4 : 2;  // d (and m) first
  // What the float 2^23 + byte loses to give the weight's integer: q - 8
  // (Q4_0), q (Q4_1), int8 (Q8_0, its bytes XOR 0x80 first).
  constexpr float kSub = W == DType::kQ4_0 ? kTwoPow23 + 8.0f : (kQ8 ? kTwoPow23 + 128.0f : kTwoPow23);
  // The staging's swizzle of odd blocks (module comment): Q4 lanes read
  // elements 4 s.. and 16 + 4 s.., Q8_0 lanes 8 s.. and 8 s + 4...
  constexpr int kFlip = kQ8 ? 4 : 16;
  extern __shared__ __align__(16) unsigned char sq_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nb = static_cast<int>(k / kQuantBlock);
  const int seg_bytes = seg_blocks * kBB;  // a multiple of 16 (seg_blocks % 8 == 0)
  const int nseg = nb / seg_blocks;        // whole segments a row
  unsigned char* ring = sq_smem + static_cast<size_t>(warp) * kSqStages * seg_bytes;
  float* xs = reinterpret_cast<float*>(sq_smem + static_cast<size_t>(kSqWarps) * kSqStages * seg_bytes);
  float* xsum = xs + k;  // Q4_1: [nb][4]
  // The warp's rows: row0, row0 + stride, ... below m.
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kSqWarps + warp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kSqWarps;
  // The next segment to request: (row lrow, segment lseg), into stage lstage.
  int64_t lrow = row0;
  int lseg = 0, lstage = 0;
  auto load_next = [&] {
    if (lrow < m) {
      const char* src = w + lrow * row_bytes + static_cast<int64_t>(lseg) * seg_bytes;
      unsigned char* dst = ring + lstage * seg_bytes;
      for (int c = lane; c < seg_bytes / 16; c += 32) cp_async16(dst + 16 * c, src + 16 * c, 16);
      if (++lseg == nseg) {
        lseg = 0;
        lrow += stride;
      }
      lstage = lstage + 1 == kSqStages ? 0 : lstage + 1;
    }
    cp_async_commit();  // one group per segment, empty past the warp's last
  };
#pragma unroll
  for (int t = 0; t < kSqStages - 1; ++t) load_next();
  pdl_launch_dependents();
  pdl_wait();
  // x as fp32, then (Q4_1) each lane's sum of its 8 activations of a block.
  // Element e of block b sits at 32 b + (e ^ kFlip (b & 1)): every odd
  // block's halves (Q4) or 4-element quarters (Q8_0) swapped pairwise, so
  // the 16-byte reads of a quarter warp (two blocks' 4 lanes) fall on all 32
  // banks instead of twice on 16.
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * 8; i < k; i += static_cast<int64_t>(blockDim.x) * 8) {
    float v[8];
    load8_act<XT>(x + i, v);
    const int64_t flip = (i & 32) != 0 ? kFlip : 0;  // bit 5 of i: an odd block
    *reinterpret_cast<float4*>(xs + (i ^ flip)) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(xs + ((i + 4) ^ flip)) = make_float4(v[4], v[5], v[6], v[7]);
  }
  __syncthreads();
  if constexpr (W == DType::kQ4_1) {
    for (int i = threadIdx.x; i < nb * 4; i += blockDim.x) {
      const int b = i >> 2, flip = (b & 1) << 4;
      const float* xl = xs + b * kQuantBlock + ((4 * (i & 3)) ^ flip);
      const float* xh = xs + b * kQuantBlock + ((16 + 4 * (i & 3)) ^ flip);
      xsum[i] = ((xl[0] + xl[1]) + (xl[2] + xl[3])) + ((xh[0] + xh[1]) + (xh[2] + xh[3]));
    }
    __syncthreads();
  }
  const int sub = lane & 3;   // this lane's 4 bytes of a block
  const int bsel = lane >> 2;  // the first block of a segment it takes; then every 8th
  int stage = 0;
  for (int64_t row = row0; row < m; row += stride) {
    float acc = 0.0f;
    for (int sg = 0; sg < nseg; ++sg) {
      load_next();
      cp_async_wait<kSqStages - 1>();  // this segment has landed
      __syncwarp();
      const unsigned char* seg = ring + stage * seg_bytes;
      const float* xseg = xs + sg * seg_blocks * kQuantBlock;
      const float* sseg = xsum + sg * seg_blocks * 4;
      for (int bl = bsel; bl < seg_blocks; bl += 8) {
        const unsigned char* blk = seg + bl * kBB;
        // lo / hi: the bytes whose values meet xl / xh (Q4: the low and high
        // nibbles of bytes 4 s..; Q8_0: bytes 8 s.. and 8 s + 4.., XOR 0x80).
        uint32_t lo, hi;
        if constexpr (kQ8) {  // 2-byte aligned only
          const auto* q2 = reinterpret_cast<const uint16_t*>(blk + kQsOff + 8 * sub);
          lo = (static_cast<uint32_t>(q2[0]) | (static_cast<uint32_t>(q2[1]) << 16)) ^ 0x80808080u;
          hi = (static_cast<uint32_t>(q2[2]) | (static_cast<uint32_t>(q2[3]) << 16)) ^ 0x80808080u;
        } else {
          const unsigned char* qp = blk + kQsOff + 4 * sub;
          uint32_t q;
          if constexpr (W == DType::kQ4_1) {
            q = *reinterpret_cast<const uint32_t*>(qp);
          } else {  // 2-byte aligned only
            q = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(qp)) |
                (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(qp + 2)) << 16);
          }
          lo = q & 0x0F0F0F0Fu;
          hi = (q >> 4) & 0x0F0F0F0Fu;
        }
        const int flip = ((sg * seg_blocks + bl) & 1) != 0 ? kFlip : 0;  // the staging's swizzle
        const float* xb = xseg + bl * kQuantBlock;
        const int el = kQ8 ? 8 * sub : 4 * sub, eh = kQ8 ? 8 * sub + 4 : 16 + 4 * sub;
        const float4 xl = *reinterpret_cast<const float4*>(xb + (el ^ flip));
        const float4 xh = *reinterpret_cast<const float4*>(xb + (eh ^ flip));
        // byte e of v into the low byte of 0x4B000000: the float 2^23 + q.
        auto nib = [](uint32_t v, uint32_t sel) { return __uint_as_float(__byte_perm(v, 0x4B000000u, sel)) - kSub; };
        // Two chains of four, then their sum: shorter dependences.
        float d0 = xl.x * nib(lo, 0x7440);
        float d1 = xh.x * nib(hi, 0x7440);
        d0 = fmaf(xl.y, nib(lo, 0x7441), d0);
        d1 = fmaf(xh.y, nib(hi, 0x7441), d1);
        d0 = fmaf(xl.z, nib(lo, 0x7442), d0);
        d1 = fmaf(xh.z, nib(hi, 0x7442), d1);
        d0 = fmaf(xl.w, nib(lo, 0x7443), d0);
        d1 = fmaf(xh.w, nib(hi, 0x7443), d1);
        const float d = half_bits_to_float(*reinterpret_cast<const uint16_t*>(blk));
        if constexpr (W == DType::kQ4_1) {
          const float mn = half_bits_to_float(*reinterpret_cast<const uint16_t*>(blk + 2));
          acc = fmaf(mn, sseg[bl * 4 + sub], acc);
        }
        acc = fmaf(d, d0 + d1, acc);
      }
      __syncwarp();  // every lane is done with this stage before it is refilled
      stage = stage + 1 == kSqStages ? 0 : stage + 1;
    }
    const float sum = warp_sum(acc);
    if (lane == 0) {
      float v = sum + (bias ? bias[row] : 0.0f);
      if (accumulate) v += to_float(out[row]);
      out[row] = from_float<OT>(v);
    }
  }
  cp_async_wait<0>();
}

// OSPREY_Q4GEMV1=0: batch-1 Q4_0 / Q4_1 rows on gemv_kernel, Q8_0 rows on
// qgemv1_kernel (the A/B switch).
bool staged_qgemv1_enabled() {
  static const bool on = !env_equals("OSPREY_Q4GEMV1", "0");
  return on;
}

// Launches staged_qgemv1_kernel where it takes the shape (one activation row, k a
// multiple of 256, rows of whole blocks, 16-byte aligned weights and x, the
// staged x within kSqMaxSmem); false otherwise.
template <DType W, class XT, class OT>
bool launch_staged_qgemv1(const char* w, int64_t row_bytes, int64_t m, int64_t k, const XT* x, const float* bias,
                          OT* out, bool accumulate, int num_sms, cudaStream_t stream) {
  constexpr int64_t kBB = dtype_block_bytes(W);
  if (!staged_qgemv1_enabled() || k % 256 != 0 || row_bytes != k / kQuantBlock * kBB || !aligned16(w) ||
      !aligned16(x)) {
    return false;
  }
  const int64_t nb = k / kQuantBlock;
  // Segments of whole 8-block groups (16-byte multiples) that divide the row.
  const int64_t groups = nb / 8;
  int64_t nseg = std::max<int64_t>(1, ceil_div(nb, kSqMaxSegBlocks<W>));
  while (groups % nseg != 0) ++nseg;
  const int seg_blocks = static_cast<int>(nb / nseg);
  const size_t smem = static_cast<size_t>(kSqWarps) * kSqStages * seg_blocks * kBB + static_cast<size_t>(k) * 4 +
                      (W == DType::kQ4_1 ? static_cast<size_t>(nb) * 16 : 0);
  if (smem > kSqMaxSmem) return false;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(m, kSqWarps), std::max(1, num_sms)));
  auto kernel = staged_qgemv1_kernel<W, XT, OT>;
  set_max_dynamic_smem_once(kernel, smem);
  launch_pdl(kernel, dim3(grid), dim3(kSqWarps * 32), smem, stream, w, row_bytes, m, k, x, bias, out, accumulate,
             seg_blocks);
  return true;
}

// OSPREY_QGEMV1=0: batch-1 Q8_0 rows on gemv_kernel (the A/B switch).
bool qgemv1_enabled() {
  static const bool on = !env_equals("OSPREY_QGEMV1", "0");
  return on;
}

// launch_dequant_rows for weight dtype W: dequant_blocks_kernel where
// `blocks` (quantised W, k % 32 == 0, dst 16-byte aligned), else
// dequant_rows_kernel.
template <DType W, class OT>
void dequant_typed(bool blocks, unsigned grid, const char* w, int64_t row_bytes, int64_t rows, int64_t k, OT* dst,
                   cudaStream_t stream) {
  if constexpr (dtype_is_quantized(W)) {
    if (blocks) {
      dequant_blocks_kernel<W, OT><<<grid, 256, 0, stream>>>(w, row_bytes, rows, k / kQuantBlock, dst);
      return;
    }
  }
  dequant_rows_kernel<W, OT><<<grid, 256, 0, stream>>>(w, row_bytes, rows, k, dst);
}

template <DType T, class XT, class OT>
void gemv_typed(const void* w, int64_t row_bytes, int64_t m, int64_t k, const XT* x, int64_t n, const float* bias,
                OT* out, bool accumulate, int num_sms, cudaStream_t stream) {
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
    if constexpr (dtype_is_quantized(T)) {
      if (v && rows == 1 && launch_staged_qgemv1<T>(wp, row_bytes, m, k, xp, bias, op, accumulate, num_sms, stream)) {
        continue;
      }
    }
    if constexpr (T == DType::kQ8_0) {  // rows the staged kernel does not take
      if (v && rows == 1 && row_bytes % 16 == 0 && aligned16(wp) && k % kQuantBlock == 0 && qgemv1_enabled()) {
        launch_pdl(qgemv1_kernel<XT, OT>, dim3(static_cast<unsigned>(ceil_div(m, kQ1Warps))), dim3(kQ1Warps * 32),
                   0, stream, wp, row_bytes, m, k, xp, bias, op, accumulate);
        continue;
      }
    }
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
                    const float* bias, void* out, bool accumulate, int num_sms, cudaStream_t stream) {
  const auto* xp = static_cast<const XT*>(x);
  auto* op = static_cast<OT*>(out);
  OSP_DISPATCH_WEIGHT(dtype, W, "gemv: unsupported weight dtype ",
                      gemv_typed<W>(w, row_bytes, m, k, xp, n, bias, op, accumulate, num_sms, stream));
}

// Calls go(W tag, const XT* x) for the 16-bit weight dtype w_dtype and activation dtype act.
template <class Go>
void dispatch16(DType w_dtype, DType act, const void* x, Go&& go) {
  using BfTag = std::integral_constant<DType, DType::kBF16>;
  using HTag = std::integral_constant<DType, DType::kF16>;
  if (act == DType::kBF16) {
    const auto* xp = static_cast<const __nv_bfloat16*>(x);
    w_dtype == DType::kBF16 ? go(BfTag{}, xp) : go(HTag{}, xp);
  } else {
    const auto* xp = static_cast<const __half*>(x);
    w_dtype == DType::kBF16 ? go(BfTag{}, xp) : go(HTag{}, xp);
  }
}

}  // namespace

void launch_gemv(DType dtype, const void* w, int64_t row_bytes, int64_t m, int64_t k, DType x_dtype, const void* x,
                 int64_t n, const float* bias, DType out_dtype, void* out, int num_sms, cudaStream_t stream,
                 bool accumulate) {
  if (n == 0 || m == 0) return;
  OSP_CHECK_LE(ceil_div(m, kWarps), int64_t{2147483647});
  if (x_dtype == DType::kF32 && out_dtype == DType::kF32) {
    gemv_for_types<float, float>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, num_sms, stream);
  } else if (x_dtype == DType::kBF16 && out_dtype == DType::kBF16) {
    gemv_for_types<__nv_bfloat16, __nv_bfloat16>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, num_sms,
                                                 stream);
  } else if (x_dtype == DType::kBF16 && out_dtype == DType::kF32) {
    gemv_for_types<__nv_bfloat16, float>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, num_sms, stream);
  } else if (x_dtype == DType::kF16 && out_dtype == DType::kF16) {
    gemv_for_types<__half, __half>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, num_sms, stream);
  } else if (x_dtype == DType::kF16 && out_dtype == DType::kF32) {
    gemv_for_types<__half, float>(dtype, w, row_bytes, m, k, x, n, bias, out, accumulate, num_sms, stream);
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
  dispatch16(w_dtype, act, x, [&](auto wtag, auto* xp) {
    using XT = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
    constexpr DType W = decltype(wtag)::value;
    launch_pdl(gemv_silu_mul_kernel<W, XT>, grid, dim3(kWarps * 32), 0, stream, wp, row_bytes, f, k, xp,
               static_cast<XT*>(out));
  });
  return true;
}

namespace {

// RMSNorm folded into the GEMV (launch_gemv_rms_norm*).
//
// Each block stages its activation rows once: after pdl_wait its threads
// read x [rows, k] and g [k] (F32) once, form every row's sum of squares
// (rms_norm_x8_kernel's reduction: 8 elements a thread, warp_sum, then
// warp_sum over the per-warp sums) and write xn = x * inv_rms * g rounded to
// the activation dtype XT (rms_norm.cu's expression and rounding: the
// normed row the two-op path writes to global memory) to shared memory;
// then each warp takes the dots of its weight rows against shared memory
// in gemv_kernel's order. With 512 threads, at k = 4096 (one chunk a
// thread, as rms_norm_x8_kernel launches 512 threads there) every operation
// and its order match rms_norm + matmul (_silu_mul). 16-bit staging also
// halves the shared-memory reads per FMA against fp32 (at 8 rows the dot
// reads 8 x 16 B of xn per 16 B of weights; fp32 would make shared
// memory, not DRAM, the limit).
// The grid is persistent (at most the blocks that fit at once): a block
// loops over tiles of kNormWarps weight rows, so x and g are read and
// normed once per resident block, not once per warp (the earlier design,
// ~100 MB of L1/L2 traffic per 6144-row GEMV) nor once per tile.
// Launched through launch_pdl: only weights (the first tile's first
// chunks) are read before pdl_wait().
constexpr int kNormWarps = 16;  // warps (weight rows of a tile) per block
constexpr int kNormThreads = kNormWarps * 32;

// Before pdl_wait (g is a norm weight, which no kernel writes): asks L1
// for the lines of g the thread reads in stage_norm_rows, so the staging
// after the wait makes one L2 round trip (x), not two (x, then g).
__device__ __forceinline__ void prefetch_norm_weight(const float* g, int64_t k) {
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * 8; i < k; i += int64_t{kNormThreads} * 8)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(g + i));
}

// Block-wide: xs[r * k + c] = XT(x[r, c] * inv_rms(x[r]) * g[c]) for r < n <=
// kNR; ends with __syncthreads(). Every thread of the block calls it.
template <class XT, int kNR>
__device__ __forceinline__ void stage_norm_rows(const XT* __restrict__ x, int n, int64_t k, const float* __restrict__ g,
                                                float eps, XT* xs) {
  __shared__ float s_ss[kNR][kNormWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  constexpr int64_t kBlockStep = int64_t{kNormThreads} * 8;
  float ss[kNR];
#pragma unroll
  for (int r = 0; r < kNR; ++r) ss[r] = 0.0f;
#pragma unroll 1  // one pass at k <= 4096; unrolled, it spills the pre-loaded chunks
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * 8; i < k; i += kBlockStep) {
#pragma unroll
    for (int r = 0; r < kNR; ++r) {
      if (r < n) {
        float xv[8];
        load8_act<XT>(x + r * k + i, xv);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss[r] += xv[e] * xv[e];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kNR; ++r) {
    if (r < n) {
      const float s = warp_sum(ss[r]);
      if (lane == 0) s_ss[r][warp] = s;
    }
  }
  __syncthreads();
  float inv[kNR];
#pragma unroll
  for (int r = 0; r < kNR; ++r) {
    // block_sum's second stage: every lane gets the same tree's total.
    const float t = warp_sum(r < n && lane < kNormWarps ? s_ss[r][lane] : 0.0f);
    inv[r] = 1.0f / sqrtf(t / static_cast<float>(k) + eps);  // norm/rms_norm.cu's expression
  }
#pragma unroll 1  // one pass at k <= 4096; unrolled, it spills the pre-loaded chunks
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * 8; i < k; i += kBlockStep) {
    float gv[8];
    load8_act<float>(g + i, gv);
#pragma unroll
    for (int r = 0; r < kNR; ++r) {
      if (r < n) {
        float xv[8];
        load8_act<XT>(x + r * k + i, xv);  // an L1 hit: read just above
        alignas(16) XT o[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = from_float<XT>(xv[e] * inv[r] * gv[e]);
        *reinterpret_cast<uint4*>(xs + r * k + i) = *reinterpret_cast<const uint4*>(o);
      }
    }
  }
  __syncthreads();
}

// E4M3 weight chunks (launch_gemv_fp8 and the folded-norm kernels on
// E4M3 rows): one 16-byte chunk holds 16 weights, and every kernel takes a
// chunk's dot in the same order (dot16_e4m3, through staged_dot), so their
// results agree bit for bit.
// The 16 E4M3 codes of a raw 16-byte chunk as fp32 (exact: through half).
// The conversion of device_common.cuh's e4m3x4_to_float, written out here:
// through its half2 bit pattern the folded-norm kernels compile to other
// PTX (extra packing moves, a reordered row loop), which was not measured.
__device__ __forceinline__ void e4m3x16_to_float(uint4 v, float w[16]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>((words[j] >> (16 * h)) & 0xffffu);
      const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
      w[4 * j + 2 * h] = f.x;
      w[4 * j + 2 * h + 1] = f.y;
    }
  }
}

// dot(x[0, 16), the chunk's 16 codes) in fp32: the first 8 products summed
// in order from 0, then the last 8. x 16-byte aligned (global or shared).
template <class XT>
__device__ __forceinline__ float dot16_e4m3(uint4 wq, const XT* x) {
  float w[16], a[8], b[8];
  e4m3x16_to_float(wq, w);
  load8_act<XT>(x, a);
  load8_act<XT>(x + 8, b);
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) s += a[e] * w[e];
#pragma unroll
  for (int e = 0; e < 8; ++e) s += b[e] * w[8 + e];
  return s;
}

// Weights in one 16-byte chunk of a row of T (the folded-norm kernels'
// F16/BF16 or F8_E4M3 rows).
template <DType T>
constexpr int kChunkElems = T == DType::kF8E4M3 ? 16 : 8;

// acc[r] += the raw chunk's share against xs row r at element idx, r < n:
// fma_rows8 for F16/BF16; for E4M3 the chunk's dot16_e4m3 added at once
// (launch_gemv_fp8's order, so that its sums are the same).
template <DType T, class XT, int kNR>
__device__ __forceinline__ void fma_chunk(float (&acc)[kNR], uint4 raw, const XT* xs, int64_t k, int64_t idx, int n) {
  if constexpr (T == DType::kF8E4M3) {
#pragma unroll
    for (int r = 0; r < kNR; ++r) {
      if (r < n) acc[r] += dot16_e4m3<XT>(raw, xs + r * k + idx);
    }
  } else {
    float wv[8];
    unpack8<T>(raw, wv);
    fma_rows8<XT, kNR>(acc, wv, xs, k, idx, n);
  }
}

// acc[r] += the lane's share of dot(xs row r, weight row wr) for r < n: the
// pre-loaded chunks first when kUsePre (a block's first tile), then kUnroll
// chunks at a time, then the tail; products added in ascending chunk order
// (gemv_kernel's order; launch_gemv_fp8's for E4M3 rows). A warp's 16-byte
// reads of xs are consecutive: no bank conflicts.
template <DType T, class XT, int kNR, int kPreChunks, bool kUsePre>
__device__ __forceinline__ void staged_dot(const char* wr, const uint4 (&pre)[kPreChunks], const XT* xs, int n,
                                           int64_t k, int lane, float (&acc)[kNR]) {
  constexpr int kE = kChunkElems<T>;
  constexpr int64_t kStepT = 32 * kE;  // elements of one chunk across the warp
  const uint4* w4 = reinterpret_cast<const uint4*>(wr);
  int64_t i = static_cast<int64_t>(lane) * kE;
  if constexpr (kUsePre) {
#pragma unroll
    for (int c = 0; c < kPreChunks; ++c) {
      const int64_t idx = i + c * kStepT;
      if (idx < k) fma_chunk<T, XT, kNR>(acc, pre[c], xs, k, idx, n);
    }
    i += kPreChunks * kStepT;
  }
  // kUnroll raw 16-byte weight loads in flight, unpacked one chunk at a
  // time (16 registers, not 32: the batch-1 kernel stays at 64 without
  // spilling). Each acc[r] still gets its chunks in ascending order.
  for (; i + (kUnroll - 1) * kStepT < k; i += kUnroll * kStepT) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = w4[(i + u * kStepT) / kE];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fma_chunk<T, XT, kNR>(acc, raw[u], xs, k, i + u * kStepT, n);
  }
  for (; i < k; i += kStepT) fma_chunk<T, XT, kNR>(acc, w4[i / kE], xs, k, i, n);
}

// Chunks of the first tile's row a lane loads before pdl_wait (held across
// the wait and the staging): two groups at one row, as gemv_kernel's batch
// 1; one at more rows (two groups spill there under the 64-register cap of
// two resident 512-thread blocks per SM).
template <int kNR>
constexpr int kNormPreChunks = kNR == 1 ? 2 * kUnroll : kUnroll;

// One activation row on E4M3 weights (launch_gemv_fp8): one warp a weight
// row, kWarps rows a block; the lane's chunks of staged_dot (x read from
// global memory instead of a staged row), the first kNormPreChunks<1> (4 KB
// of each row) loaded before pdl_wait(). The activation stays in its 16-bit
// dtype (only the weight is FP8 at one row: the step is weight-read bound);
// the fp32 dot times the matrix's scale s, + bias, + out when accumulating,
// rounded once.
template <class XT>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_fp8_kernel(const char* __restrict__ w, int64_t m, int64_t k, const float* __restrict__ w_scale,
                    const XT* __restrict__ x, const float* __restrict__ bias, XT* __restrict__ out, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const bool valid = row < m;
  const char* wr = w + (valid ? row : 0) * k;
  uint4 pre[kNormPreChunks<1>];
  load_pre<kNormPreChunks<1>, kChunkElems<DType::kF8E4M3>>(wr, k, lane, valid, pre);
  pdl_launch_dependents();
  pdl_wait();
  if (!valid) return;
  float acc[1] = {0.0f};
  staged_dot<DType::kF8E4M3, XT, 1, kNormPreChunks<1>, true>(wr, pre, x, 1, k, lane, acc);
  const float sum = warp_sum(acc[0]);
  if (lane == 0) {
    // One explicit fma (never left to contraction), as norm_row's on E4M3
    // rows: the two paths agree bit for bit.
    float v = __fmaf_rn(sum, *w_scale, bias ? bias[row] : 0.0f);
    if (accumulate) v += to_float(out[row]);
    out[row] = from_float<XT>(v);
  }
}

// The dot and store of weight row `row` (< m) for the gemv_norm_kernel tile loop.
// ws: the E4M3 matrix's scale (1 for 16-bit rows, unused).
template <DType T, class XT, int kNR, bool kUsePre>
__device__ __forceinline__ void norm_row(const char* __restrict__ w, int64_t row_bytes, int64_t m, int64_t k,
                                         int64_t row, const uint4 (&pre)[kNormPreChunks<kNR>], const XT* xs, int n,
                                         int lane, float ws, const float* __restrict__ bias, XT* __restrict__ out) {
  float acc[kNR];
#pragma unroll
  for (int r = 0; r < kNR; ++r) acc[r] = 0.0f;
  staged_dot<T, XT, kNR, kNormPreChunks<kNR>, kUsePre>(w + row * row_bytes, pre, xs, n, k, lane, acc);
#pragma unroll
  for (int r = 0; r < kNR; ++r) {
    if (r < n) {
      const float s = warp_sum(acc[r]);
      const float b = bias ? bias[row] : 0.0f;
      // E4M3: launch_gemv_fp8's epilogue (one explicit fma).
      if (lane == 0) out[r * m + row] = from_float<XT>(T == DType::kF8E4M3 ? __fmaf_rn(s, ws, b) : s + b);
    }
  }
}

// out[r * m + row] = dot(w row, xn_r) (+ bias[row]) for r < n <= kNR, xn_r
// the staged row (stage_norm_rows), rows in tiles of kNormWarps (warp w of
// tile t: row t * kNormWarps + w), tiles grid-strided. Dynamic shared
// memory: n * k values of XT. w rows F16/BF16, 16-byte aligned, k % 8 == 0.
// Two resident blocks per SM (64 registers, no spills; 32 warps as
// gemv_kernel's batch 1; at 8 rows 2 x 64 KB of staged rows at k = 4096).
template <DType T, class XT, int kNR>
__global__ void __launch_bounds__(kNormThreads, 2)
    gemv_norm_kernel(const char* __restrict__ w, int64_t row_bytes, int64_t m, int64_t k, const XT* __restrict__ x,
                     int n, const float* __restrict__ g, float eps, const float* __restrict__ w_scale,
                     const float* __restrict__ bias, XT* __restrict__ out) {
  extern __shared__ uint4 s_norm_dyn[];
  XT* xs = reinterpret_cast<XT*>(s_norm_dyn);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t tiles = (m + kNormWarps - 1) / kNormWarps;  // gridDim.x <= tiles
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kNormWarps + warp;
  uint4 pre[kNormPreChunks<kNR>];
  load_pre<kNormPreChunks<kNR>, kChunkElems<T>>(w + (row0 < m ? row0 : 0) * row_bytes, k, lane, row0 < m, pre);
  prefetch_norm_weight(g, k);
  const float ws = T == DType::kF8E4M3 ? *w_scale : 1.0f;  // weights: never written by the stream
  pdl_launch_dependents();
  pdl_wait();
  stage_norm_rows<XT, kNR>(x, n, k, g, eps, xs);
  if (row0 < m) norm_row<T, XT, kNR, true>(w, row_bytes, m, k, row0, pre, xs, n, lane, ws, bias, out);
  for (int64_t tile = blockIdx.x + static_cast<int64_t>(gridDim.x); tile < tiles; tile += gridDim.x) {
    const int64_t row = tile * kNormWarps + warp;
    if (row < m) norm_row<T, XT, kNR, false>(w, row_bytes, m, k, row, pre, xs, n, lane, ws, bias, out);
  }
}

// One row, gate/up with the SiLU-and-mul (launch_gemv_rms_norm_silu_mul):
// w [2 f, k]; tile t's warps 0..7 take gate rows j = 8 t + w, warps 8..15
// the matching up rows f + j; each dot is rounded to XT (+ 0.0f, as
// gemv_silu_mul_kernel), then thread t < 8 writes silu(g) * u with
// silu_mul_x8_kernel's expression. Dynamic shared memory: k values of XT.
constexpr int kNormGluCols = kNormWarps / 2;

// One tile of gemv_norm_silu_mul_kernel (every thread of the block calls it).
template <DType T, class XT, bool kUsePre>
__device__ __forceinline__ void norm_silu_tile(const char* __restrict__ w, int64_t row_bytes, int64_t f, int64_t k,
                                               int64_t tile, const uint4 (&pre)[kNormPreChunks<1>], const XT* xs,
                                               float ws, float (&s_gu)[2][kNormGluCols], XT* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int half = warp / kNormGluCols;  // 0: gate row, 1: up row
  const int64_t j = tile * kNormGluCols + warp % kNormGluCols;
  if (j < f) {
    float acc[1] = {0.0f};
    staged_dot<T, XT, 1, kNormPreChunks<1>, kUsePre>(w + (j + half * f) * row_bytes, pre, xs, 1, k, lane, acc);
    const float s = warp_sum(acc[0]);
    // As launch_gemv_fp8 (one explicit fma) / gemv_silu_mul_kernel writes them.
    const float v = T == DType::kF8E4M3 ? __fmaf_rn(s, ws, 0.0f) : s + 0.0f;
    if (lane == 0) s_gu[half][warp % kNormGluCols] = to_float(from_float<XT>(v));
  }
  __syncthreads();
  const int64_t jo = tile * kNormGluCols + threadIdx.x;
  if (threadIdx.x < kNormGluCols && jo < f) {
    const float gt = s_gu[0][threadIdx.x];
    const float u = s_gu[1][threadIdx.x];
    out[jo] = from_float<XT>(silu_mul_value(gt, u));
  }
  __syncthreads();  // s_gu is rewritten by the next tile
}

template <DType T, class XT>
__global__ void __launch_bounds__(kNormThreads, 2)
    gemv_norm_silu_mul_kernel(const char* __restrict__ w, int64_t row_bytes, int64_t f, int64_t k,
                              const XT* __restrict__ x, const float* __restrict__ g, float eps,
                              const float* __restrict__ w_scale, XT* __restrict__ out) {
  extern __shared__ uint4 s_norm_dyn[];
  XT* xs = reinterpret_cast<XT*>(s_norm_dyn);
  __shared__ float s_gu[2][kNormGluCols];  // [gate, up][column in tile], rounded to XT
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int half = warp / kNormGluCols;
  const int64_t tiles = (f + kNormGluCols - 1) / kNormGluCols;  // gridDim.x <= tiles
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kNormGluCols + warp % kNormGluCols;
  uint4 pre[kNormPreChunks<1>];
  load_pre<kNormPreChunks<1>, kChunkElems<T>>(w + (j0 < f ? j0 + half * f : 0) * row_bytes, k, lane, j0 < f, pre);
  prefetch_norm_weight(g, k);
  const float ws = T == DType::kF8E4M3 ? *w_scale : 1.0f;
  pdl_launch_dependents();
  pdl_wait();
  stage_norm_rows<XT, 1>(x, 1, k, g, eps, xs);
  norm_silu_tile<T, XT, true>(w, row_bytes, f, k, blockIdx.x, pre, xs, ws, s_gu, out);
  for (int64_t tile = blockIdx.x + static_cast<int64_t>(gridDim.x); tile < tiles; tile += gridDim.x)
    norm_silu_tile<T, XT, false>(w, row_bytes, f, k, tile, pre, xs, ws, s_gu, out);
}

// The operands the folded-norm kernels take: F16/BF16 weights and
// activations, 16-byte aligned rows, x and g, k % 8 == 0.
// E4M3 rows (one activation row only: launch_gemv_fp8's batch) are dense
// (row_bytes == k), k % 16 == 0, and taken unless OSPREY_FP8_GEMV=0.
bool norm_fold_fits(DType w_dtype, const void* w, int64_t row_bytes, int64_t k, DType act, const void* x,
                    const float* g) {
  const bool w16 = w_dtype == DType::kBF16 || w_dtype == DType::kF16;
  const bool w8 = w_dtype == DType::kF8E4M3 && row_bytes == k && k % 16 == 0 && fp8_gemv_enabled();
  const bool a16 = act == DType::kBF16 || act == DType::kF16;
  return (w16 || w8) && a16 && k > 0 && k % 8 == 0 && row_bytes % 16 == 0 && aligned16(w) && aligned16(x) &&
         g != nullptr && aligned16(g);
}

// Calls go(W tag, const XT* x) for the weight dtype of the folded-norm
// kernels (F16, BF16 or F8_E4M3) and activation dtype act (F16 or BF16).
template <class Go>
void dispatch_norm_fold(DType w_dtype, DType act, const void* x, Go&& go) {
  if (w_dtype != DType::kF8E4M3) {
    dispatch16(w_dtype, act, x, go);
    return;
  }
  using F8Tag = std::integral_constant<DType, DType::kF8E4M3>;
  if (act == DType::kBF16) {
    go(F8Tag{}, static_cast<const __nv_bfloat16*>(x));
  } else {
    go(F8Tag{}, static_cast<const __half*>(x));
  }
}

// Largest dynamic shared memory a block of the staged kernels may take on
// the current device (opt-in limit less the kernels' static arrays and a
// margin); read once (one device type per process is assumed).
int64_t norm_stage_limit_bytes() {
  static const int64_t limit = [] {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device()) != cudaSuccess) {
      (void)cudaGetLastError();
      v = 48 * 1024;
    }
    return static_cast<int64_t>(v) - 2048;
  }();
  return limit;
}

// Blocks of kKernel (kNormThreads threads, `smem` dynamic bytes) resident
// at once on one SM of the current device. Cached per kernel (a template
// argument: instantiations share a function type) for the last smem size
// (a host query, no stream work, so it is also safe while a graph is
// captured); at least 1.
template <auto kKernel>
int64_t norm_blocks_per_sm(size_t smem) {
  static std::atomic<int64_t> cache{0};  // (smem << 20) | blocks; 0: unknown
  const int64_t c = cache.load(std::memory_order_relaxed);
  if (c != 0 && static_cast<size_t>(c >> 20) == smem) return c & ((int64_t{1} << 20) - 1);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kNormThreads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  const int64_t blocks = std::clamp<int64_t>(per_sm, 1, (int64_t{1} << 20) - 1);
  cache.store((static_cast<int64_t>(smem) << 20) | blocks, std::memory_order_relaxed);
  return blocks;
}

// Launches kKernel over `tiles` tiles with `smem` dynamic bytes: raises the
// kernel's limit once, grid = min(tiles, the blocks resident at once on
// num_sms SMs).
template <auto kKernel, class... Args>
void launch_norm_kernel(int64_t tiles, size_t smem, int num_sms, cudaStream_t stream, Args... args) {
  set_max_dynamic_smem_once(kKernel, smem);
  const int64_t grid = std::min(tiles, norm_blocks_per_sm<kKernel>(smem) * std::max(num_sms, 1));
  launch_pdl(kKernel, dim3(static_cast<unsigned>(grid)), dim3(kNormThreads), smem, stream, args...);
}

}  // namespace

bool launch_gemv_rms_norm(DType w_dtype, const void* w, int64_t row_bytes, int64_t m, int64_t k, DType act,
                          const void* x, int64_t n, const float* g, float eps, const float* bias, void* out,
                          int num_sms, cudaStream_t stream) {
  if (!norm_fold_fits(w_dtype, w, row_bytes, k, act, x, g)) return false;
  const bool fp8 = w_dtype == DType::kF8E4M3;
  if (fp8 && n != 1) return false;  // launch_gemv_fp8's batch: cuBLASLt's FP8 GEMMs beyond
  // Staged rows of one pass must fit in shared memory.
  if (std::min<int64_t>(n, kN) * k * 2 > norm_stage_limit_bytes()) return false;
  if (n <= 0 || m <= 0) return true;
  const auto* wp = static_cast<const char*>(w);
  const auto* w_scale = fp8 ? reinterpret_cast<const float*>(wp + fp8_scale_offset(m, k)) : nullptr;
  const int64_t tiles = ceil_div(m, int64_t{kNormWarps});
  dispatch_norm_fold(w_dtype, act, x, [&](auto wtag, auto* x0) {
    using XT = std::remove_const_t<std::remove_pointer_t<decltype(x0)>>;
    constexpr DType W = decltype(wtag)::value;
    for (int64_t r0 = 0; r0 < n; r0 += kN) {
      const int rows = static_cast<int>(std::min<int64_t>(kN, n - r0));
      const XT* xp = x0 + r0 * k;
      XT* op = static_cast<XT*>(out) + r0 * m;
      const size_t smem = static_cast<size_t>(rows * k) * sizeof(XT);
      if (rows == 1) {
        launch_norm_kernel<gemv_norm_kernel<W, XT, 1>>(tiles, smem, num_sms, stream, wp, row_bytes, m, k, xp, rows, g,
                                                       eps, w_scale, bias, op);
      } else if constexpr (W != DType::kF8E4M3) {
        launch_norm_kernel<gemv_norm_kernel<W, XT, kN>>(tiles, smem, num_sms, stream, wp, row_bytes, m, k, xp, rows, g,
                                                        eps, w_scale, bias, op);
      }
    }
  });
  return true;
}

bool launch_gemv_rms_norm_silu_mul(DType w_dtype, const void* w, int64_t row_bytes, int64_t f, int64_t k, DType act,
                                   const void* x, const float* g, float eps, void* out, int num_sms,
                                   cudaStream_t stream) {
  if (!fused_silu_enabled() || f <= 0 || !norm_fold_fits(w_dtype, w, row_bytes, k, act, x, g) ||
      k * 2 > norm_stage_limit_bytes())
    return false;
  const auto* wp = static_cast<const char*>(w);
  const auto* w_scale =
      w_dtype == DType::kF8E4M3 ? reinterpret_cast<const float*>(wp + fp8_scale_offset(2 * f, k)) : nullptr;
  const int64_t tiles = ceil_div(f, int64_t{kNormGluCols});
  const size_t smem = static_cast<size_t>(k) * 2;  // one 16-bit row
  dispatch_norm_fold(w_dtype, act, x, [&](auto wtag, auto* xp) {
    using XT = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
    constexpr DType W = decltype(wtag)::value;
    launch_norm_kernel<gemv_norm_silu_mul_kernel<W, XT>>(tiles, smem, num_sms, stream, wp, row_bytes, f, k, xp, g, eps,
                                                         w_scale, static_cast<XT*>(out));
  });
  return true;
}

bool launch_gemv_fp8(const void* w, int64_t m, int64_t k, const float* w_scale, DType x_dtype, const void* x,
                     const float* bias, void* out, bool accumulate, cudaStream_t stream) {
  const bool a16 = x_dtype == DType::kBF16 || x_dtype == DType::kF16;
  if (!fp8_gemv_enabled() || !a16 || m <= 0 || k <= 0 || k % 16 != 0 || !aligned16(w) || !aligned16(x) ||
      ceil_div(m, int64_t{kWarps}) > int64_t{2147483647})
    return false;
  const dim3 grid(static_cast<unsigned>(ceil_div(m, int64_t{kWarps})));
  const auto* wp = static_cast<const char*>(w);
  OSP_DISPATCH_16(x_dtype, XT,
                  launch_pdl(gemv_fp8_kernel<XT>, grid, dim3(kWarps * 32), 0, stream, wp, m, k, w_scale,
                             static_cast<const XT*>(x), bias, static_cast<XT*>(out), accumulate));
  return true;
}

void launch_dequant_rows(DType dtype, const void* w, int64_t row_bytes, int64_t rows, int64_t k, DType out_dtype,
                         void* dst, cudaStream_t stream) {
  if (rows * k == 0) return;
  const auto* wp = static_cast<const char*>(w);
  // Quantised rows: a thread per quarter block where k and dst allow it.
  const bool blocks = dtype_is_quantized(dtype) && k % kQuantBlock == 0 && aligned16(dst);
  const int64_t threads = blocks ? rows * (k / kQuantBlock) * 4 : rows * k;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(threads, 256), 65535 * 16));
  OSP_DISPATCH_ACT(out_dtype, OT, {
    OT* d = static_cast<OT*>(dst);
    OSP_DISPATCH_WEIGHT(dtype, W, "dequant_rows: unsupported weight dtype ",
                        dequant_typed<W>(blocks, grid, wp, row_bytes, rows, k, d, stream));
  });
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
