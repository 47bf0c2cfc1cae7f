// The CUDA backend: ops::Backend on one NVIDIA GPU and one compute stream.
// Plain C++ header (no CUDA headers), so code built without nvcc can include
// it behind OSPREY_HAVE_CUDA.
#pragma once

#include <memory>

#include "ops/backend.h"

namespace osprey::cuda {

struct CudaBackendOptions {
  int device_index = 0;
  // F16/BF16 weights with more than a few activation rows: false converts the
  // activations to the weight dtype and multiplies on tensor cores (fp32
  // accumulate), as GPU engines do; true upcasts the weights to fp32 in
  // scratch panels so the product is computed in fp32 end to end, matching
  // the CPU backend (for parity tests; slower).
  bool exact_fp32_matmul = false;
  // Splits of the KV range in paged attention: 0 chooses per step from the
  // shapes and the SM count; > 0 forces that many (tests of the merge path).
  int attention_splits = 0;
  // BF16/F16 activations: report fuses_matmul_add, so the model adds the
  // o and down projections into the residual inside the GEMM/GEMV
  // (matmul_add) and norms with rms_norm instead of add_rms_norm. False, or
  // OSPREY_FUSED_RESIDUAL=0 in the environment, keeps the unfused sequence
  // (A/B runs and tests). matmul_add itself is fused either way.
  bool fused_residual = true;
  // BF16/F16 activations at GEMV batch sizes: report fuses_rms_norm_matmul,
  // so the model folds the norms before the qkv and gate/up projections
  // into their GEMVs (rms_norm_matmul*). False, or OSPREY_FUSED_NORM=0 in
  // the environment, keeps rms_norm + matmul (A/B runs and tests); the
  // rms_norm_matmul* ops then run the two ops too.
  bool fused_norm = true;
  // BF16 activations: report folds_norms, so the model multiplies the
  // attention and MLP norm weights into w_qkv / w_gate_up at load and, at
  // steps above the GEMV row limit, runs those projections on the residual
  // itself with the row scale applied by rms_scaled_qkv_rope_kv_write /
  // rms_scaled_silu_mul (no norm kernels). False, or OSPREY_FOLDED_NORM=0 in
  // the environment, keeps the norms (A/B runs and tests). F16 never folds:
  // the raw product is rms(x) times the normed one and may overflow F16.
  bool folded_norm = true;
  // BF16/F16 activations on weights of the same dtype: the own GEMV kernels
  // (gemm/gemv.cu, with the fused norm and SiLU variants) take steps of up
  // to this many rows (1..8), cuBLASLt the larger ones. The GEMV re-reads
  // nothing but does n dot products per weight element on CUDA cores;
  // cuBLASLt's tensor-core kernels stay at the weight-read bound from n = 2
  // (an H100, 2026-11-27: a decode step at 8 sequences x 512 tokens 10.65 ms
  // through the GEMV, 6.17 through cuBLASLt; docs/PERF.md, session 10).
  // OSPREY_GEMV_MAX_ROWS=1..8 in the environment (read once) overrides it
  // (A/B runs); F32 activations and quantised weights keep their limits.
  int gemv_max_rows = 1;
};

// Number of CUDA devices the driver reports; 0 when there is no driver or GPU.
int device_count();

// Null when the device cannot be opened (no driver, no such device); the
// reason is printed to stderr.
std::unique_ptr<ops::Backend> make_cuda_backend(const CudaBackendOptions& options);

// How many times `backend` (made by make_cuda_backend) has timed cuBLASLt
// candidates for a new shape bucket (autotuning, gemm/matmul.cpp); -1 for
// any other backend. Tests check that serving steps after the engine's
// warm-up time none.
int64_t matmul_tuning_runs(const ops::Backend& backend);

}  // namespace osprey::cuda

namespace osprey::ops {

// The ops-level factory: make_cuda_backend(CudaBackendOptions{device_index}).
std::unique_ptr<Backend> make_cuda_backend(int device_index);

}  // namespace osprey::ops
