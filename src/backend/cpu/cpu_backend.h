// CpuBackend: the ops::Backend for host memory. Activations and KV pages are
// fp32 (KV pages may also be F16/BF16); weights of any matmul dtype stay
// packed and are dequantised on the fly. Work is split over a ThreadPool whose
// calling thread takes part. Also the reference other backends are tested
// against. One thread drives a backend at a time (scratch is per backend).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_q8.h"
#include "core/thread_pool.h"
#include "ops/backend.h"

namespace osprey::cpu {

// kAuto picks the best the CPU supports (avx512 > avx2 > scalar); an
// explicit choice falls back to the next lower one the CPU has.
enum class Isa { kAuto, kScalar, kAvx2, kAvx512 };

struct CpuBackendOptions {
  int num_threads = 0;  // <= 0: all cores
  Isa isa = Isa::kAuto;
  int spin_us = 200;  // idle workers poll this long before sleeping
  // Matmuls with Q8_0/Q4_0/Q4_1 weights quantise activations to 8 bits and
  // use integer dot products (cpu_q8.h) for every n; off: fp32 throughout.
  bool quantize_activations = false;
};

class CpuBackend final : public ops::Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options);
  ~CpuBackend() override;

  Device device() const override { return Device::kCpu; }
  const char* name() const override { return name_; }
  const char* isa_name() const { return kernels_->isa; }
  // ISA of the 8-bit activation kernels; null when quantize_activations is off.
  const char* q8_isa_name() const { return q8_ ? q8_->isa : nullptr; }
  int num_threads() const { return pool_.num_threads(); }

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void synchronize() override {}

  void embedding(const Tensor& table, const int32_t* ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) override;
  void head_rms_norm(Tensor& x, const Tensor& w, float eps) override;
  void rope(Tensor& q, Tensor& k, const int32_t* positions, const ops::RopeTable& table) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  bool supports_kv_dtype(DType kv, DType, int, int) const override { return ops::is_kv_page_dtype(kv); }  // I8 too
  void kv_write(const Tensor& k, const Tensor& v, const ops::AttentionBatch& batch, ops::LayerKv& kv) override;
  void paged_attention(const Tensor& q, const ops::LayerKv& kv, const ops::AttentionBatch& batch, float scale,
                       int sliding_window, Tensor& out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, int num_rows, Tensor& out) override;
  void fill_rows_from(const Tensor& x, const int32_t* src_rows, int num_rows, Tensor& out) override;
  void convert(const Tensor& src, Tensor& dst) override;
  void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) override;
  // Composed of head_rms_norm, rope and kv_write on copies of the k/v columns.
  void qkv_rope_kv_write(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                         const ops::RopeTable& rope, const ops::AttentionBatch& batch, ops::LayerKv& kv,
                         Tensor& q_out) override;

  // Tuning knobs, exposed for benchmarks and tests: matmul uses the GEMV
  // kernels for n <= gemv_max_rows, else dequantised panels of panel_rows
  // weight rows.
  void set_gemv_max_rows(int n) { gemv_max_rows_ = n; }
  void set_panel_rows(int n) { panel_rows_ = n; }

 private:
  // Grow-only fp32 scratch owned by one thread; 64-byte aligned.
  struct Scratch {
    float* data = nullptr;
    size_t capacity = 0;  // floats
    float* get(size_t floats);
    ~Scratch();
  };
  Scratch& thread_scratch(int slot);

  // Runs fn(begin, end) over [0, n) on the pool when n * cost_per_item is
  // large enough to pay for a dispatch, else inline.
  template <class F>
  void for_range(int64_t n, int64_t cost_per_item, F&& fn);

  void matmul_gemv(const Tensor& x, const Tensor& w, WeightFormat f, const float* bias, float* out);
  void matmul_panels(const Tensor& x, const Tensor& w, WeightFormat f, const float* bias, float* out);
  void matmul_q8(const Tensor& x, const Tensor& w, WeightFormat f, const float* bias, float* out);

  const CpuKernels* kernels_;
  ThreadPool pool_;
  const char* name_;
  int gemv_max_rows_ = 3;
  int panel_rows_ = 16;
  const Q8Kernels* q8_ = nullptr;  // set when options.quantize_activations
  Scratch q8_act_;                 // quantised activation rows (cpu_matmul_q8.cpp)
  // [thread][slot]: slot 0 matmul panels and attention scores, 1 rope tables
  // and converted KV rows.
  std::vector<std::unique_ptr<Scratch[]>> scratch_;
  std::vector<float> qkv_k_, qkv_v_;  // grow-only k/v columns for qkv_rope_kv_write
  Scratch shared_scratch_;          // used by the dispatching thread before a dispatch (x block sums)
  std::vector<int32_t> token_seq_;  // token -> sequence map for attention
};

template <class F>
void CpuBackend::for_range(int64_t n, int64_t cost_per_item, F&& fn) {
  // About 20k multiply-adds per thread make a dispatch (~1-2 us) worthwhile.
  constexpr int64_t kMinParallelCost = 32 * 1024;
  if (n <= 0) return;
  if (pool_.num_threads() == 1 || n == 1 || n * cost_per_item < kMinParallelCost) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kMinParallelCost / 4 / std::max<int64_t>(1, cost_per_item));
  pool_.parallel_for(n, fn, grain);
}

// Same as ops::make_cpu_backend but with every option.
std::unique_ptr<CpuBackend> make_cpu_backend(const CpuBackendOptions& options);

}  // namespace osprey::cpu
