// Inner kernels of the CPU backend, one table per instruction set. The scalar
// table (cpu_kernels_scalar.cpp) is portable; the AVX2 table
// (cpu_kernels_avx2.cpp, compiled with -mavx2 -mfma -mf16c) is picked at run
// time when the CPU supports it. Both compute the same maths in fp32; they
// differ only in summation order.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace osprey::cpu {

// Weight row formats the matmul kernels read packed.
enum class WeightFormat : int { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1, kCount };

// Returns false for dtypes matmul cannot take as weights.
bool weight_format_of(DType t, WeightFormat* f);

// GEMV over a range of weight rows:
//   out[i * ldo + r] = dot(dequant(w row r), x[i * ldx : +k])  for i < n, r in [r0, r1)
// w row r starts at w + r * w_row_bytes; k is a multiple of 32 for the
// quantised formats. xsum[i * (k/32) + b] = sum of x row i over block b; it is
// read only by Q4_1 (null otherwise). n is small (decode): each weight row is
// dequantised once and dotted with all n rows.
using GemvFn = void (*)(const void* w, int64_t w_row_bytes, int64_t k, const float* x, int64_t ldx, const float* xsum,
                        int n, float* out, int64_t ldo, int64_t r0, int64_t r1);

// Dequantises `rows` consecutive weight rows of k elements into dst[rows, k] (fp32, ld = k).
using DequantRowsFn = void (*)(const void* w, int64_t w_row_bytes, int64_t k, int64_t rows, float* dst);

// out[i * ldo + j] = dot(x[i * ldx : +k], p[j * k : +k]) for i < n, j < m.
// x is fp32 activations, p a dequantised fp32 panel of m weight rows (m small).
using PanelGemmFn = void (*)(const float* x, int64_t ldx, int n, const float* p, int m, int64_t k, float* out,
                             int64_t ldo);

struct CpuKernels {
  const char* isa = "scalar";
  GemvFn gemv[static_cast<int>(WeightFormat::kCount)] = {};
  DequantRowsFn dequant[static_cast<int>(WeightFormat::kCount)] = {};
  PanelGemmFn panel_gemm = nullptr;

  // Vector helpers (fp32).
  float (*dot)(const float* a, const float* b, int64_t n) = nullptr;
  void (*axpy)(float a, const float* x, float* y, int64_t n) = nullptr;                         // y += a * x
  void (*scale)(float a, float* y, int64_t n) = nullptr;                                        // y *= a
  float (*sum_sq)(const float* x, int64_t n) = nullptr;                                         // sum x^2
  void (*scale_mul)(const float* x, float s, const float* w, float* out, int64_t n) = nullptr;  // out = x * s * w
  void (*add)(float* x, const float* y, int64_t n) = nullptr;                                   // x += y
  void (*block_sums)(const float* x, int64_t k, float* sums) = nullptr;                         // sums[k/32]
  void (*silu_mul)(const float* g, const float* u, float* out, int64_t n) = nullptr;            // out = silu(g) * u
  float (*exp_sub_sum)(float* s, int64_t n, float max) = nullptr;  // s = exp(s - max); returns sum(s)

  // Attention over `len` key/value rows r_j = rows + j * stride (hd floats
  // each) for the nq query heads q[h * hd : +hd] that share them (GQA group):
  //   attn_scores:  s[h * lds + j] = dot(q_h, r_j) * scale
  //   attn_accum:   o[h * hd : +hd] += sum_j s[h * lds + j] * r_j   (j in order)
  // Same fp32 arithmetic as dot/axpy per row; each row is read once for all nq heads.
  void (*attn_scores)(const float* q, int nq, int64_t hd, const float* rows, int64_t stride, int64_t len,
                      float scale, float* s, int64_t lds) = nullptr;
  void (*attn_accum)(const float* s, int64_t lds, int nq, int64_t hd, const float* rows, int64_t stride,
                     int64_t len, float* o) = nullptr;
  // Exact widening of F16 / BF16 KV rows to fp32:
  //   dst[r * len + i] = float(src[r * stride + i])  for r < rows, i < len.
  void (*widen_f16)(const uint16_t* src, int64_t stride, int64_t rows, int64_t len, float* dst) = nullptr;
  void (*widen_bf16)(const uint16_t* src, int64_t stride, int64_t rows, int64_t len, float* dst) = nullptr;
};

const CpuKernels& scalar_kernels();
// Null when the build or the CPU lacks AVX2/FMA/F16C.
const CpuKernels* avx2_kernels();
// Null when the CPU lacks AVX-512 F/BW/VL/DQ (or AVX2). The AVX2 table with
// AVX-512 GEMV, dequantisation (Q4_1, Q8_0) and panel GEMM kernels.
const CpuKernels* avx512_kernels();
// Defined in cpu_kernels_avx2.cpp / cpu_kernels_avx512.cpp (x86-64 only);
// call avx2_kernels() / avx512_kernels() instead.
const CpuKernels& avx2_kernels_unchecked();
const CpuKernels& avx512_kernels_unchecked();

}  // namespace osprey::cpu
