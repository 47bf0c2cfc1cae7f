// CudaBackend: ops::Backend on one GPU. Every op enqueues on one compute
// stream owned by the backend; only copy_to_host and synchronize wait for it.
// Scratch (converted activations, dequantised weight panels, attention
// partials, the cuBLAS workspace) is reserved on first use and grows only,
// so steady-state steps allocate nothing.
//
// Files: cuda_backend.cpp (construction, memory, row-wise ops),
// gemm/matmul.cpp (matmul dispatch), attention/attention_ops.cpp (kv_write,
// paged_attention); kernels in the .cu files named in kernels.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_buffer.h"
#include "ops/backend.h"

namespace osprey::cuda {

struct PagedAttentionArgs;  // kernels.h

class CudaBackend final : public ops::Backend {
 public:
  // Opens the device; check ok() afterwards (error() says why not).
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  Device device() const override { return Device::kCuda; }
  const char* name() const override { return name_.c_str(); }

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void synchronize() override;

  void embedding(const Tensor& table, const int32_t* ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) override;
  // One pass on every path (gemm/matmul.cpp): the GEMV adds the residual in
  // its epilogue, cuBLASLt/cuBLAS run with beta = 1 and C = D = residual;
  // scratch is left unwritten.
  void matmul_add(const Tensor& x, const Tensor& w, Tensor& residual, Tensor& scratch) override;
  // BF16/F16 activations, unless CudaBackendOptions::fused_residual is off or
  // OSPREY_FUSED_RESIDUAL=0 (read once).
  bool fuses_matmul_add(DType act) const override;
  // The norm folded into the GEMV (gemm/matmul.cpp, gemm/gemv.cu) for
  // F16/BF16 weights at n <= the dense GEMV row limit; other weights, more
  // rows or a capability off: rms_norm then the projection.
  void rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w, const Tensor& bias,
                       Tensor& normed, Tensor& out) override;
  void rms_norm_matmul_silu_mul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w_gate_up,
                                Tensor& normed, Tensor& gate_up, Tensor& out) override;
  // BF16/F16 activations at n <= the dense GEMV row limit, unless
  // CudaBackendOptions::fused_norm is off or OSPREY_FUSED_NORM=0 (read once).
  bool fuses_rms_norm_matmul(int64_t n, DType act) const override;
  // BF16 activations only, unless CudaBackendOptions::folded_norm is off or
  // OSPREY_FOLDED_NORM=0 (read once). The ops below take F32/F16/BF16.
  bool folds_norms(DType act) const override;
  // One kernel, stream-ordered (elementwise/elementwise.cu).
  void scale_columns(Tensor& w, const Tensor& scale) override;
  bool supports_fp8_weights(DType act) const override;
  // I8 pages: the tensor-core decode and mma.sync prefill kernels' shapes
  // (BF16 / F16 q, head_dim 64 or 128, any G); every other page dtype.
  bool supports_kv_dtype(DType kv, DType act, int head_dim, int group) const override;
  Status quantize_weight_fp8(const Tensor& w, Tensor& q) override;
  // qkv_rope_kv_write's kernels with the row scale (rope/qkv_rope.cu).
  void rms_scaled_qkv_rope_kv_write(const Tensor& x, float x_eps, const Tensor& qkv, const Tensor& qkv_bias,
                                    const Tensor& q_norm, const Tensor& k_norm, float eps, const ops::RopeTable& rope,
                                    const ops::AttentionBatch& batch, ops::LayerKv& kv, Tensor& q_out) override;
  // One kernel (elementwise/elementwise.cu): each block reduces its row of
  // x; above kRowScalePassRows rows a row-factor pass, then silu_mul.
  void rms_scaled_silu_mul(const Tensor& x, float x_eps, const Tensor& gate_up, Tensor& out) override;
  void head_rms_norm(Tensor& x, const Tensor& w, float eps) override;
  void rope(Tensor& q, Tensor& k, const int32_t* positions, const ops::RopeTable& table) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void kv_write(const Tensor& k, const Tensor& v, const ops::AttentionBatch& batch, ops::LayerKv& kv) override;
  void paged_attention(const Tensor& q, const ops::LayerKv& kv, const ops::AttentionBatch& batch, float scale,
                       int sliding_window, Tensor& out) override;
  void matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& gate_up, Tensor& out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, int num_rows, Tensor& out) override;
  void fill_rows_from(const Tensor& x, const int32_t* src_rows, int num_rows, Tensor& out) override;
  // ---- device runtime (cuda_runtime.cpp, graphs/, sampling/)
  void* alloc_host(size_t bytes) override;
  void free_host(void* p) override;
  void copy_to_device_async(void* dst, const void* src, size_t bytes) override;
  void copy_to_host_async(void* dst, const void* src, size_t bytes) override;
  void copy_device_to_device(void* dst, const void* src, size_t bytes) override;
  bool memory_info(size_t& free_bytes, size_t& total_bytes) override;
  bool supports_device_sampling() const override { return true; }
  void sample(const SampleBatch& batch) override;
  bool supports_graphs() const override { return true; }
  // The top of each cuBLASLt autotuning bucket (gemm/matmul.cpp) up to max_rows.
  std::vector<int64_t> matmul_tuning_rows(int64_t max_rows) const override;
  int64_t matmul_tuning_runs() const { return lt_timings_; }
  void begin_capture() override;
  std::unique_ptr<Graph> end_capture() override;
  // Timer marks: a ring of kTimerMarksHeld events recorded on the compute stream (cuda_profile.cpp).
  uint64_t timer_mark() override;
  double timer_elapsed_ms(uint64_t a, uint64_t b) override;
  DType default_activation_dtype() const override { return DType::kBF16; }
  bool supports_activation_dtype(DType t) const override {
    return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
  }
  void convert(const Tensor& src, Tensor& dst) override;
  void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) override;
  void qkv_rope_kv_write(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                         const ops::RopeTable& rope, const ops::AttentionBatch& batch, ops::LayerKv& kv,
                         Tensor& q_out) override;

  cudaStream_t stream() const { return stream_; }
  int num_sms() const { return num_sms_; }

 private:
  // Makes this backend's device current on the calling thread (the engine
  // may call from a thread other than the one that built the backend).
  void bind_device() const;
  // fp32 GEMM through cuBLAS: out[n, ldo] columns [0, m) = x[n, k] @ w[m, k]^T
  // (+ out when accumulate), w of type a_type (F32, F16 or BF16).
  void gemm(const void* w, cudaDataType_t w_type, const void* x, cudaDataType_t x_type, int64_t n, int64_t m, int64_t k,
            float* out, int64_t ldo, bool accumulate);
  const float* device_inv_freq(const ops::RopeTable& table);
  // The row factors of x for the rms_scaled ops in a pass of their own
  // (into row_inv_) where x has more rows than the reading kernels reduce
  // well themselves; null otherwise (the kernels reduce their rows).
  const float* row_inv_rms_pass(const Tensor& x, float eps);
  // qkv_rope_kv_write (rms_x and qkv_bias null) and
  // rms_scaled_qkv_rope_kv_write (rms_x: the row-scale source x; qkv_bias:
  // added after the scale where defined): the argument checks and the launch.
  void run_qkv_rope(const Tensor* rms_x, float rms_eps, const Tensor* qkv_bias, const Tensor& qkv,
                    const Tensor& q_norm, const Tensor& k_norm, float eps, const ops::RopeTable& rope,
                    const ops::AttentionBatch& batch, ops::LayerKv& kv, Tensor& q_out);
  // paged_attention's split plan and kernel launch for one (sub-)batch
  // (attention/attention_ops.cpp); decode: one query token per sequence.
  // Plans and launches one attention (sub-)batch: scratch reserved against
  // stream_, the kernel launched on `on` (stream_, or the side stream of a
  // mixed step's decode part).
  void run_attention(PagedAttentionArgs& a, bool decode, cudaStream_t on);
  // 16-bit or FP8 GEMM through cuBLASLt: out[n, ldo] columns [0, m)
  // (out_type BF16, F16 or F32) = x[n, k] @ w[m, k]^T (+ out when
  // accumulate), w and x both of in_type (BF16, F16, or F8_E4M3 with the
  // device scalars a_scale (w's) and b_scale (x's) multiplying the product),
  // fp32 accumulation.
  // The plan (descriptors, layouts, algorithm) is cached per shape and
  // pointer alignment, so only the first call of a shape queries the
  // heuristics. Falls back to cublasGemmEx when cuBLASLt offers no algorithm
  // (16-bit inputs; an FP8 GEMM without one is an error).
  void lt_gemm(const void* w, const void* x, int64_t n, int64_t m, int64_t k, DType out_type, void* out, int64_t ldo,
               bool accumulate, DType in_type = DType::kBF16, const float* a_scale = nullptr,
               const float* b_scale = nullptr);
  // matmul / matmul_add on F8_E4M3 weights (gemm/matmul.cpp): x quantised
  // into fp8_act_ (launch_fp8_quantize), then lt_gemm in FP8.
  void matmul_fp8(const Tensor& x, const Tensor& w, const float* bias, Tensor& out, bool add_to_out);
  // matmul (add_to_out false) and matmul_add (true: out += x @ w^T, no
  // bias) after their argument checks: the path dispatch of gemm/matmul.cpp.
  void matmul_into(const Tensor& x, const Tensor& w, const float* bias, Tensor& out, bool add_to_out);
  // The own GEMV's row limit for 16-bit activations on weights of their
  // dtype (CudaBackendOptions::gemv_max_rows, OSPREY_GEMV_MAX_ROWS), and
  // whether matmul takes the GEMV for n rows of xt on weights of wt.
  int64_t gemv_max_rows16() const;
  bool gemv_rows(int64_t n, DType xt, DType wt) const;
  // matmul with 16-bit activations (x BF16 or F16, out x's dtype or F32), n
  // above the GEMV threshold; add_to_out: out += product (no bias then).
  void matmul_bf16(const Tensor& x, const Tensor& w, const float* bias, Tensor& out, bool add_to_out);

  struct LtPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;  // false: no algorithm, use cublasGemmEx
    bool tuned = false;  // algo settled: timed against the heuristic's other candidates, or not worth timing
  };
  // (n, m, k, ldo, out dtype, accumulate, alignment of w | x << 16 | out << 32, input dtype of w and x)
  using LtKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int, bool, uint64_t, int>;
  LtPlan& lt_plan(const LtKey& key);
  // Autotuning of a new plan and the heuristic's candidates: gemm/matmul.cpp.
  // An accumulating plan (beta = 1) is timed with C = out and D = tune_out_,
  // so out is left as it was.
  void lt_tune(const LtKey& key, LtPlan& plan, const void* w, const void* x, void* out);
  void add_neighbour_picks(const LtKey& key, const LtPlan& plan, std::vector<cublasLtMatmulHeuristicResult_t>& cands);
  static std::vector<cublasLtMatmulHeuristicResult_t> lt_candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                                                                    cublasLtMatrixLayout_t la,
                                                                    cublasLtMatrixLayout_t lb,
                                                                    cublasLtMatrixLayout_t lc, uint64_t align,
                                                                    int max_count);

  CudaBackendOptions options_;
  std::string error_;
  std::string name_;
  int num_sms_ = 0;
  bool fp8_tensor_cores_ = false;  // compute capability 8.9+: cuBLASLt's FP8 GEMMs (supports_fp8_weights)
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  std::map<LtKey, LtPlan> lt_plans_;
  // Fastest timed algorithm per shape bucket (the key with n replaced by its tuning bucket); gemm/matmul.cpp.
  std::map<LtKey, cublasLtMatmulAlgo_t> lt_best_;
  int64_t lt_timings_ = 0;  // lt_tune calls that timed candidates (matmul_tuning_runs)

  DeviceBuffer cublas_workspace_;
  DeviceBuffer act_scratch_;    // activations converted to F16/BF16
  DeviceBuffer panel_scratch_;  // dequantised weight panels (fp32, or the 16-bit activation dtype)
  DeviceBuffer tune_out_;       // D of accumulating (beta = 1) plans while they are timed (lt_tune)
  DeviceBuffer fp8_act_;        // an FP8 GEMM's quantised input, its amax partials and scale (matmul_fp8)
  DeviceBuffer attn_acc_;       // split attention partials
  DeviceBuffer attn_ml_;
  // The decode kernel's split-merge counters (kernels.h split_tickets):
  // allocated and zeroed at construction, zero between launches.
  static constexpr int64_t kDecodeSplitTickets = 8192;
  DeviceBuffer decode_tickets_;
  DeviceBuffer rope_freq_;                // inv_freq copied from host memory
  DeviceBuffer row_inv_;                  // row factors of a folded norm (row_inv_rms_pass)
  const float* last_inv_freq_ = nullptr;  // last RopeTable pointer seen and whether it was device memory
  bool last_inv_freq_on_device_ = false;
  // Timer-mark events, created on the first timer_mark() (cuda_profile.cpp);
  // shared_ptr so that the type may stay incomplete here.
  struct MarkEvents;
  std::shared_ptr<MarkEvents> marks_;
  // A second stream and its fork/join events for the decode part of a mixed
  // step's attention (attention_ops.cpp), created on first use.
  struct SideStream;
  std::shared_ptr<SideStream> side_;
};

}  // namespace osprey::cuda
