// ProfilingBackend: a Backend decorator that forwards every virtual of
// ops::Backend to an inner backend and, while enabled and inside a step
// (begin_step .. end_step, given by the engine's executor), brackets each op
// with two timer marks (Backend::timer_mark) and files its device time, call
// count, estimated bytes moved and FLOPs under (phase, group):
//   phase: "prefill" (a step with more tokens than sequences), "decode" (one
//          token per sequence), "other" (a step of KV page copies only);
//   group: the op ("rms_norm", "attention", "sample", "copy to device", ...);
//          matmuls by weight shape and dtype: "matmul 6144x4096 bf16" (m x k);
//          matmul_add (the residual add folded in) as "matmul+add 4096x4096 bf16",
//          rms_norm_matmul as "rms_norm+matmul 6144x4096 bf16" and
//          rms_norm_matmul_silu_mul as "rms_norm+matmul+silu_mul 28672x4096 bf16";
//          the norm-folding ops as "rms_scale+qkv_rope_kv_write" and
//          "rms_scale+silu_mul".
// Bytes are the minimum traffic of the op (each operand read once, each
// output written once; matmul_add: the residual read and written; attention:
// the KV positions each sequence reads, plus q and out); FLOPs count 2 per
// multiply-add (matmul and matmul_add 2*n*m*k, attention
// 4*heads*head_dim per (query token, attended position)). Attention lengths
// come from the step's host arrays (begin_step), never from device memory.
//
// Marks are resolved in end_step(), after the executor's synchronize; the
// report is read from any thread. Ops outside a step (load, warm-up) and ops
// queued during graph capture are forwarded untimed: run the engine eagerly
// while profiling (EngineConfig::profile sets that).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "ops/backend.h"

namespace osprey::ops {

// Measured ceilings of a backend's device (0: not measured).
struct Ceilings {
  double copy_gbs = 0;     // device-to-device copy, (read + write) bytes / s / 1e9
  double gemm_tflops = 0;  // the backend's own matmul at its default activation dtype, 1e12 FLOP/s
  std::string gemm_shape;  // what the GEMM ran, e.g. "bf16 4096x4096x4096"
};

// Times, through timer marks, a device-to-device copy (CPU 256 MiB, else
// 1 GiB; best of several) and the backend's matmul (CPU: F32 256x1024x1024;
// else the default activation dtype at 4096^3, which cuBLASLt runs on CUDA;
// best of several). Allocates and frees its buffers; a failed allocation
// leaves that ceiling at 0. Seconds on a GPU, about a second on the CPU.
Ceilings measure_ceilings(Backend& backend);

// The host side of one step: per-sequence query and KV lengths.
struct ProfileStep {
  int num_seqs = 0;
  int num_tokens = 0;
  std::span<const int32_t> q_indptr;  // [num_seqs + 1] host memory
  std::span<const int32_t> kv_lens;   // [num_seqs] host memory, after this step's writes
};

// Sum over a sequence's q_len query tokens (the last q_len of kv_len
// positions) of the KV positions each attends to (causal, window 0 = no limit).
int64_t attended_pairs(int64_t q_len, int64_t kv_len, int window);
// Distinct KV positions the sequence's query tokens read together.
int64_t kv_positions_read(int64_t q_len, int64_t kv_len, int window);

struct ProfileGroup {
  std::string phase;
  std::string group;
  int64_t calls = 0;
  double total_ms = 0;
  double bytes = 0;
  double flops = 0;
};

struct ProfileSnapshot {
  std::vector<ProfileGroup> groups;  // phase order (prefill, decode, other), then time, largest first
  int64_t prefill_steps = 0;
  int64_t decode_steps = 0;
  int64_t other_steps = 0;
  int64_t untimed_calls = 0;  // ops in a step not timed (too many marks pending, or a mark lost)
  Ceilings ceilings;
};

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner);
  ~ProfilingBackend() override;

  Backend& inner() { return *inner_; }
  // Any thread. Off: every op is only forwarded.
  void set_enabled(bool on) { enabled_.store(on); }
  bool enabled() const { return enabled_.load(); }
  // Executor thread: the step whose ops follow. end_step() resolves the
  // marks (waiting for the device where needed) into the totals.
  void begin_step(const ProfileStep& step);
  void end_step();
  // Any thread.
  ProfileSnapshot snapshot() const;
  void reset();
  void set_ceilings(const Ceilings& c);

  // ---- every virtual of Backend, forwarded ----
  Device device() const override { return inner_->device(); }
  const char* name() const override { return inner_->name(); }
  void* alloc(size_t bytes) override { return inner_->alloc(bytes); }
  void free(void* p) override { inner_->free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { inner_->copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { inner_->copy_to_host(dst, src, bytes); }
  void synchronize() override { inner_->synchronize(); }
  void embedding(const Tensor& table, const int32_t* ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) override;
  // Forwarded whole (timed as one op): the model's choice of sequence
  // follows the inner backend's fuses_matmul_add, and a fused inner call
  // stays fused under profiling.
  void matmul_add(const Tensor& x, const Tensor& w, Tensor& residual, Tensor& scratch) override;
  bool fuses_matmul_add(DType act) const override { return inner_->fuses_matmul_add(act); }
  // Forwarded whole as well (timed as one op each), with the inner
  // backend's fuses_rms_norm_matmul: the model folds the norms exactly when
  // it would unprofiled. Bytes: x, norm weight, w, bias and out once each
  // (the normed and gate_up scratch not counted).
  void rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w, const Tensor& bias,
                       Tensor& normed, Tensor& out) override;
  void rms_norm_matmul_silu_mul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w_gate_up,
                                Tensor& normed, Tensor& gate_up, Tensor& out) override;
  bool fuses_rms_norm_matmul(int64_t n, DType act) const override { return inner_->fuses_rms_norm_matmul(n, act); }
  // The inner backend's norm folding (the model folds exactly when it would
  // unprofiled); scale_columns runs at load, untimed; the scaled ops are
  // filed as "rms_scale+qkv_rope_kv_write" and "rms_scale+silu_mul" (bytes:
  // their plain op's plus x once).
  bool folds_norms(DType act) const override { return inner_->folds_norms(act); }
  void scale_columns(Tensor& w, const Tensor& scale) override { inner_->scale_columns(w, scale); }
  // FP8 weights: as the inner backend (the conversion runs at load, untimed).
  bool supports_fp8_weights(DType act) const override { return inner_->supports_fp8_weights(act); }
  bool supports_kv_dtype(DType kv, DType act, int head_dim, int group) const override {
    return inner_->supports_kv_dtype(kv, act, head_dim, group);
  }
  Status quantize_weight_fp8(const Tensor& w, Tensor& q) override { return inner_->quantize_weight_fp8(w, q); }
  void rms_scaled_qkv_rope_kv_write(const Tensor& x, float x_eps, const Tensor& qkv, const Tensor& qkv_bias,
                                    const Tensor& q_norm, const Tensor& k_norm, float eps, const RopeTable& rope,
                                    const AttentionBatch& batch, LayerKv& kv, Tensor& q_out) override;
  void rms_scaled_silu_mul(const Tensor& x, float x_eps, const Tensor& gate_up, Tensor& out) override;
  void head_rms_norm(Tensor& x, const Tensor& w, float eps) override;
  void rope(Tensor& q, Tensor& k, const int32_t* positions, const RopeTable& table) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  // matmul_silu_mul is not overridden: Backend's default runs this class's
  // timed matmul and silu_mul, so the profile's groups do not depend on
  // whether the inner backend fuses them (CUDA does at one row); a profiled
  // batch-1 decode runs the two kernels.
  void kv_write(const Tensor& k, const Tensor& v, const AttentionBatch& batch, LayerKv& kv) override;
  void paged_attention(const Tensor& q, const LayerKv& kv, const AttentionBatch& batch, float scale, int sliding_window,
                       Tensor& out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, int num_rows, Tensor& out) override;
  void fill_rows_from(const Tensor& x, const int32_t* src_rows, int num_rows, Tensor& out) override;
  DType default_activation_dtype() const override { return inner_->default_activation_dtype(); }
  bool supports_activation_dtype(DType t) const override { return inner_->supports_activation_dtype(t); }
  void convert(const Tensor& src, Tensor& dst) override;
  void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) override;
  void qkv_rope_kv_write(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                         const RopeTable& rope, const AttentionBatch& batch, LayerKv& kv, Tensor& q_out) override;
  void* alloc_host(size_t bytes) override { return inner_->alloc_host(bytes); }
  void free_host(void* p) override { inner_->free_host(p); }
  void copy_to_device_async(void* dst, const void* src, size_t bytes) override;
  void copy_to_host_async(void* dst, const void* src, size_t bytes) override;
  void copy_device_to_device(void* dst, const void* src, size_t bytes) override;
  bool memory_info(size_t& free_bytes, size_t& total_bytes) override {
    return inner_->memory_info(free_bytes, total_bytes);
  }
  bool supports_device_sampling() const override { return inner_->supports_device_sampling(); }
  void sample(const SampleBatch& batch) override;
  bool supports_graphs() const override { return inner_->supports_graphs(); }
  std::vector<int64_t> matmul_tuning_rows(int64_t max_rows) const override {
    return inner_->matmul_tuning_rows(max_rows);
  }
  void begin_capture() override;
  std::unique_ptr<Graph> end_capture() override;
  uint64_t timer_mark() override { return inner_->timer_mark(); }
  double timer_elapsed_ms(uint64_t a, uint64_t b) override { return inner_->timer_elapsed_ms(a, b); }

 private:
  enum Phase : int { kPrefill = 0, kDecode = 1, kOther = 2, kNumPhases = 3 };
  struct Pending {
    uint64_t begin = 0, end = 0;  // timer marks
    int group = 0;                // index into groups_
    double bytes = 0, flops = 0;
    double ms = -1;  // resolved in end_step
  };
  // Ops pending resolution at most (two marks each, within kTimerMarksHeld).
  static constexpr size_t kMaxPending = kTimerMarksHeld / 2 - 16;

  bool recording() const { return in_step_ && !capturing_; }
  // "<op> MxK dtype" of weight w in label_buf_ (written only while
  // recording; the group name of a matmul-like op); returns label_buf_.
  const char* matmul_label(const char* op, const Tensor& w);
  // Index of (phase_, label) in groups_, created on first use. Holds mutex_.
  int group_index(const char* label);
  // Runs fn; when recording, between two marks filed under label.
  template <class F>
  void timed(const char* label, double bytes, double flops, F&& fn);

  std::unique_ptr<Backend> inner_;
  std::atomic<bool> enabled_{true};

  // Executor thread only.
  bool in_step_ = false;
  bool capturing_ = false;
  Phase phase_ = kOther;
  std::vector<int32_t> q_lens_, kv_lens_;  // the current step's sequences
  std::vector<Pending> pending_;
  char label_buf_[96] = {};

  // Shared with readers.
  mutable std::mutex mutex_;
  std::vector<ProfileGroup> groups_;
  std::map<std::string, int> index_;  // "phase|group" -> groups_ index
  std::string key_;                   // reused lookup key
  int64_t steps_[kNumPhases] = {0, 0, 0};
  int64_t untimed_ = 0;
  Ceilings ceilings_;
};

// Brackets one executor step (no-op for a null profiler or when disabled).
class ProfileStepScope {
 public:
  ProfileStepScope(ProfilingBackend* p, const ProfileStep& step) : p_(p) {
    if (p_) p_->begin_step(step);
  }
  ~ProfileStepScope() {
    if (p_) p_->end_step();
  }
  ProfileStepScope(const ProfileStepScope&) = delete;
  ProfileStepScope& operator=(const ProfileStepScope&) = delete;

 private:
  ProfilingBackend* p_;
};

}  // namespace osprey::ops
