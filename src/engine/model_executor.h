// ModelExecutor: the Executor over a loaded Model on its backend. Owns the
// paged KV cache, the fixed device arrays of each step's inputs (allocated
// once, so their pointers never change), their pinned host staging, the
// device sampler's buffers and the CUDA graphs of decode steps.
//
// A step on a device backend: swap-out copies, page copies and swap-in
// copies are queued on the backend's stream (device-to-device, or through
// pinned host slots); the step's index arrays are packed into pinned staging
// and uploaded with two or three queued copies; the forward runs eagerly or
// replays the graph of its batch-size bucket (every bucket is captured by
// initialize, after warm-up steps that also settle the backend's matmul
// choices at every row-count bucket); the device sampler turns the
// sampled rows into ids (and logprobs); the ids (and the logits, only when
// some row is sampled or scored on the host) are copied back, and the step
// waits for the stream once.
//
// Asynchronous steps (launch_step / wait_step, device backends with device
// sampling, not profiling): launch_step queues all of the above and returns;
// wait_step waits for a timer mark recorded after the step's copies to the
// host (Backend::timer_elapsed_ms waits for its second mark), so a step
// launched later keeps running. Two steps may be in flight: the pinned
// staging and the pinned result buffers are double-buffered (step k uses
// buffer k % 2, free again once step k - 2 has been waited for); the device
// arrays are single, since the stream runs steps in launch order. A step's
// token_fills read the previous step's sampled ids, which the sampler leaves
// in the device array `sampled`: after the upload, one fill_rows_from writes
// the filled rows of token_ids (row t takes sampled[fill_src[t]] where
// fill_src[t] >= 0; the other rows keep their uploaded ids), before the
// forward or the graph replay (graphs keep reading token_ids).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "engine/executor.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "ops/backend.h"
#include "ops/profiling_backend.h"

namespace osprey {

struct ExecutorOptions {
  // Replay CUDA graphs for pure-decode steps (where the backend supports them).
  bool enable_graphs = true;
  // Sample on the device where the backend supports it.
  bool enable_device_sampling = true;
  // F8_E4M3 pages: when not empty, initialize() runs these tokens through the
  // model as one prompt with pages in the activation dtype and sets each
  // layer's K and V scale from the largest magnitude written
  // (engine/kv_calibration.h); at most the step's token budget of them.
  std::vector<int32_t> kv_calibration_tokens;
};

// Batch-size buckets of decode graphs: 1, 2, 4, 8, then multiples of 8, and
// max_bucket itself. Returns the smallest bucket >= n, or 0 when n > max_bucket
// (or n <= 0).
int decode_graph_bucket(int n, int max_bucket);

// Sequences at the front of a step with exactly one query token each
// (q_indptr [num_seqs + 1]): AttentionBatch::num_leading_decodes.
int leading_single_token_seqs(const std::vector<int32_t>& q_indptr);

// KV pool sizing from a memory report (bytes). The pool gets
//   total * utilization - in_use
// where in_use = total - free after weights, step buffers and the profiling
// forward (everything the process holds except the pool). Returns the number
// of pages of page_bytes, or an error when nothing is left.
Expected<int64_t> kv_pages_from_memory(size_t free_bytes, size_t total_bytes, double utilization,
                                       size_t page_bytes);

class ModelExecutor final : public Executor {
 public:
  // The executor owns the backend and the model (declared in that order so
  // the model is destroyed first).
  ModelExecutor(std::unique_ptr<ops::Backend> backend, std::unique_ptr<Model> model, ExecutorOptions options = {});
  ~ModelExecutor() override;

  int vocab_size() const override { return model_->config().vocab_size; }
  void set_limits(int max_num_seqs, int max_model_len) override;
  Status initialize(int num_blocks, int block_size, int max_tokens, int max_logit_rows) override;
  Status initialize_swap(int num_host_blocks) override;
  // All logit rows to the host (no device sampling).
  Expected<const float*> execute(const StepBatch& batch) override;
  Expected<StepOutput> execute_step(const StepBatch& batch) override;
  bool supports_async_steps() const override;
  Status launch_step(const StepBatch& batch) override;
  Expected<StepOutput> wait_step() override;
  DeviceSamplingLimits device_sampling_limits() const override;
  int64_t last_step_device_ns() const override { return last_device_ns_; }
  void set_step_phases(bool on) override { step_phases_ = on; }
  StepPhases last_step_phases() const override { return last_phases_; }
  // Through the backend when it is an ops::ProfilingBackend (else empty).
  ProfileReport profile() const override;
  void reset_profile() override;

  // Device backends, before initialize(): reserves the step buffers for
  // steps of max_tokens tokens, runs one forward of max_tokens tokens (the
  // largest activation and workspace use) over a one-page KV cache, frees
  // that cache and reports the device memory. False `measured` on the CPU.
  struct MemoryProfile {
    bool measured = false;
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    size_t weight_bytes = 0;   // Model::weight_bytes() (as stored)
    size_t before_bytes = 0;   // in use before the step buffers and the profile (weights, context)
    size_t in_use_bytes = 0;   // total - free after the profile
  };
  Expected<MemoryProfile> profile_memory(int max_tokens, int max_logit_rows, int block_size);

  Model& model() { return *model_; }
  ops::Backend& backend() { return *backend_; }
  const KvCache& kv() const { return kv_; }
  int num_graphs() const { return static_cast<int>(graphs_.size()); }
  double graph_capture_ms() const { return capture_ms_; }
  int64_t num_graph_replays() const { return num_graph_replays_; }
  int64_t num_eager_decode_steps() const { return num_eager_decode_; }
  bool graphs_enabled() const { return graphs_on_; }
  // Turns decode graphs off (or back on, where supported) from now on.
  void set_graphs_enabled(bool on);

 private:
  // Byte offsets of the step arrays in the staging and device buffers.
  // Uploaded each step: [token_ids, block_indices + used). `sampled` (the
  // sampler's ids, read by the next step's fills) lies before that span.
  struct Layout {
    size_t sampled = 0, token_ids = 0, positions = 0, slot_mapping = 0, q_indptr = 0, kv_lens = 0, block_indptr = 0,
           logit_rows = 0, fill_src = 0, decode_order = 0, block_indices = 0, sample_rows = 0, edit_ids = 0,
           edit_vals = 0, bytes = 0;
    int max_tokens = 0, max_seqs = 0, max_block_indices = 0, max_logit_rows = 0, max_sample_rows = 0,
        max_edits = 0, max_scratch_rows = 0;
  };
  void copy_blocks(const std::vector<BlockCopy>& copies);
  // Device page -> host slot (to_host) or host slot -> device page, every layer's K and V.
  void swap_blocks(const std::vector<BlockCopy>& copies, bool to_host);
  // The step's page moves, in this order: swap-out, page copies, swap-in.
  void move_blocks(const StepBatch& b);
  // CPU backend: the host arrays themselves.
  Expected<StepOutput> execute_on_host(const StepBatch& b);
  // The ForwardBatch over b's own (host) arrays.
  ForwardBatch host_batch(const StepBatch& b) const;
  Status allocate_step_buffers(int max_tokens, int max_logit_rows, int block_size);
  // options_.kv_calibration_tokens through the model (see ExecutorOptions);
  // sets the model's and kv_'s scales. After reserve (and, on a device, the
  // step buffers), before any warm-up or graph capture.
  Status calibrate_kv_scales(int max_tokens);
  void free_step_buffers();
  // A step queued by enqueue() and not yet completed.
  struct InFlight {
    int num_samples = 0;
    bool want_logprobs = false;
    int host_buf = 0;                 // which sample_out_host_ buffer
    uint64_t mark_begin = 0, mark_end = 0;
    // set_step_phases(true): around the forward (else unset).
    bool phases = false;
    uint64_t mark_forward = 0, mark_after = 0;
    const float* logits = nullptr;    // host logits (need_host_logits), else null
    std::vector<uint8_t> row_logprobs;  // per sample row: num_logprobs >= 0
  };
  // Queues the step (copies, upload, fills, forward, sampling, copies back).
  Status enqueue(const StepBatch& b);
  // Waits for the oldest queued step and returns its output.
  Expected<StepOutput> complete();
  // Packs the step (padded to `padded` decode sequences when > num_seqs) into
  // the staging buffer and queues its upload and token fills. Returns the
  // ForwardBatch over the device arrays.
  ForwardBatch stage(const StepBatch& b, int padded);
  ForwardBatch device_batch(int num_seqs, int num_tokens, int max_q_len, int max_kv_len, int num_logit_rows) const;
  // Forward of one step of `tokens` tokens writing no KV (at max_tokens: scratch sizes).
  void warm_up(KvCache& kv, int block_size, int tokens);
  // warm_up at each of the backend's matmul_tuning_rows that warm_up and
  // warm_up_decode did not reach, once (the choices live in the backend).
  void warm_up_matmuls(KvCache& kv, int block_size);
  // Eager forwards of every decode bucket, all sequences padded.
  void warm_up_decode(KvCache& kv);
  // The ForwardBatch of a pure-decode step padded to `bucket` sequences.
  ForwardBatch decode_graph_batch(int bucket) const;
  // Captures the decode graph of one bucket (after warm_up_decode); false
  // when the backend cannot capture (graphs are then off for good).
  bool capture_decode_graph(int bucket);
  // Every bucket's graph not yet captured (at initialize, or when graphs are turned on).
  void capture_decode_graphs();
  // Replays the bucket's graph (capturing it first if missing).
  Tensor run_graph(int bucket, const ForwardBatch& fb);
  template <class T>
  T* dev(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(device_arrays_) + offset);
  }
  template <class T>
  T* host(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(staging_) + offset);
  }

  std::unique_ptr<ops::Backend> backend_;
  ops::ProfilingBackend* profiler_ = nullptr;  // backend_ itself when it profiles
  std::unique_ptr<Model> model_;
  ExecutorOptions options_;
  KvCache kv_;
  bool on_host_ = true;
  int max_num_seqs_ = 256;
  int max_model_len_ = 4096;
  int max_logit_rows_ = 0;
  int block_size_ = 0;
  // Host swap slots (alloc_host): one buffer per KV tensor (layer-major, K
  // then V), each [num_host_blocks, page bytes of that tensor].
  std::vector<void*> host_swap_;
  int num_host_blocks_ = 0;

  // CPU backend: the batch's own host arrays are the "device" arrays.
  // Device backends: fixed arrays below.
  Layout layout_;
  void* staging_buf_[2] = {nullptr, nullptr};  // pinned host, layout_.bytes each
  void* staging_ = nullptr;        // the one the current step packs into
  void* device_arrays_ = nullptr;  // device, layout_.bytes
  float* sample_scratch_ = nullptr;  // device [max_scratch_rows, vocab]
  void* sample_out_ = nullptr;       // device: (tokens unused: `sampled`), logprobs, ranks [M]; top ids, logprobs [M, 20]
  void* sample_out_host_[2] = {nullptr, nullptr};  // pinned copies of the ids and sample_out_
  float* host_logits_ = nullptr;     // pinned [max_logit_rows, vocab], allocated on first use
  std::vector<DeviceSampleResult> results_;
  // Queued steps, oldest at inflight_head_ (a ring of two).
  InFlight inflight_[2];
  int inflight_head_ = 0;
  int num_inflight_ = 0;
  int64_t num_enqueued_ = 0;  // steps queued so far: step k uses buffers k % 2

  bool graphs_on_ = false;
  bool decode_warmed_ = false;  // warm_up_decode ran on kv_
  bool matmuls_warmed_ = false;  // warm_up_matmuls ran (its choices live in the backend)
  int decode_warm_rows_ = 0;     // largest batch warm_up_decode ran (its row counts are settled)
  struct CapturedGraph {
    std::unique_ptr<ops::Backend::Graph> graph;
    Tensor logits;  // what the captured forward returned (its replays rewrite it)
  };
  std::map<int, CapturedGraph> graphs_;  // by bucket
  double capture_ms_ = 0;                // host time spent capturing
  int max_bucket_ = 0;
  int64_t num_graph_replays_ = 0;
  int64_t num_eager_decode_ = 0;
  int64_t last_device_ns_ = -1;
  bool step_phases_ = false;
  StepPhases last_phases_;
};

}  // namespace osprey
