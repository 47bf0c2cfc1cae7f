// FP8 (E4M3) GEMMs through cuBLASLt at Llama-3-8B shapes on their own, for
// gpu_op_bench gemm-fp8: each projection against the BF16 path in the same
// run, with the scale modes the backend's FP8 path chose between (one scalar
// a matrix, which it uses, and per-row / per-token vectors, OUTER_VEC_32F).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

namespace osprey::bench {

// x [n, k] BF16 -> q [n, k] E4M3 with one scale a row (amax / 448; 1 for a
// zero row), one block a row. k % 8 == 0, x and q 16-byte aligned.
void quantize_rows_e4m3(const void* x, int64_t n, int64_t k, void* q, float* scale, cudaStream_t stream);

class Fp8GemmBench {
 public:
  Fp8GemmBench();
  ~Fp8GemmBench();
  Fp8GemmBench(const Fp8GemmBench&) = delete;
  Fp8GemmBench& operator=(const Fp8GemmBench&) = delete;

  // Empty when cuBLASLt computes the scales as documented: E4M3 ones times
  // scalar scales, and times per-row / per-column vectors
  // (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F); else what differed.
  std::string check_scales();

  // Weight copies of [m, k] E4M3 (random, >= 256 MiB together, so that
  // back-to-back calls read device memory) with per-row scales, and
  // activation buffers for up to max_n rows.
  void set_shape(int64_t m, int64_t k, int64_t max_n);

  // Microseconds per x[n, k] (E4M3) @ w^T -> BF16 [n, m] in graph replay over
  // the copies, the fastest of cuBLASLt's heuristic candidates; rowwise:
  // per-row weight and per-token activation scales (OUTER_VEC_32F), else one
  // scalar each; fast_accum: CUBLASLT_MATMUL_DESC_FAST_ACCUM. -1 when no
  // candidate runs (*why then says what failed). *algos: candidates that ran.
  double gemm_us(int64_t n, bool rowwise, bool fast_accum, int* algos, std::string* why);

  // Microseconds per quantisation of a BF16 [n, k] activation to E4M3 with
  // one scale a row (quantize_rows_e4m3), in graph replay.
  double quantize_us(int64_t n);

  size_t weight_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey::bench
