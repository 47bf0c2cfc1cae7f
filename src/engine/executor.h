// Executor: what the engine loop needs from a model on a backend. The model
// executor (model_executor.h) wraps Model; tests use a fake that fabricates
// logits from the token history it finds in its own paged "KV".
#pragma once

#include <cstdint>
#include <vector>

#include "kv/block_table.h"
#include "osprey/engine.h"
#include "osprey/status.h"
#include "sampling/device_sampling.h"

namespace osprey {

// token_ids[token_row] of a step is the token sampled in row sample_row of
// the previous launched step's sample_rows: its value is not on the host yet
// (asynchronous scheduling), the executor fills it in on the device.
struct TokenFill {
  int32_t token_row = 0;
  int32_t sample_row = 0;
};

// One step's inputs as host arrays (the batch builder's output). Layout as
// ops::AttentionBatch (src/ops/backend.h): sequences in order, tokens of a
// sequence contiguous.
struct StepBatch {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_kv_len = 0;
  int max_q_len = 0;
  std::vector<int32_t> token_ids;      // [num_tokens]
  std::vector<int32_t> positions;      // [num_tokens]
  std::vector<int32_t> slot_mapping;   // [num_tokens] page * block_size + row
  std::vector<int32_t> q_indptr;       // [num_seqs + 1]
  std::vector<int32_t> kv_lens;        // [num_seqs] after this step's writes
  std::vector<int32_t> block_indptr;   // [num_seqs + 1]
  std::vector<int32_t> block_indices;  // [block_indptr[num_seqs]]
  std::vector<int32_t> logit_rows;     // token rows whose logits are wanted
  std::vector<BlockCopy> copies;       // page copies to run before the forward
  // Swap copies of whole pages (every layer's K and V), run in this order:
  // swap_out {device page src -> host slot dst}, then copies, then swap_in
  // {host slot src -> device page dst}, then the forward.
  std::vector<BlockCopy> swap_out;
  std::vector<BlockCopy> swap_in;
  // Tokens sampled on the device (executors with device_sampling_limits().max_rows > 0):
  // one row per token; logit_row indexes logit_rows' order. Filled by the engine core.
  std::vector<DeviceSampleRow> sample_rows;
  DeviceSampleEdits sample_edits;
  // Whether execute_step must copy every logit row to the host (rows sampled
  // or scored on the host: prompt logprobs, rows the device cannot sample).
  bool need_host_logits = true;
  // Rows whose token comes from the previous step's device sample rows
  // (token_ids holds kPendingToken there). Only for executors with
  // supports_async_steps(); sorted by token_row.
  std::vector<TokenFill> token_fills;

  void clear();
};

// What one step returns to the host.
struct StepOutput {
  // [logit_rows.size(), vocab] F32 in host memory when need_host_logits (else
  // null), valid until the next call.
  const float* logits = nullptr;
  // [sample_rows.size()] in host memory, valid until the next call.
  const DeviceSampleResult* samples = nullptr;
};

// Bounds of device sampling in one step; max_rows == 0: none (host sampling).
struct DeviceSamplingLimits {
  int max_rows = 0;
  int max_edits = 0;
  int max_scratch_rows = 0;  // rows with edits (scratch_row >= 0)
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual int vocab_size() const = 0;
  // Allocates num_blocks KV pages of block_size tokens and buffers for steps of
  // up to max_tokens tokens and max_logit_rows logit rows. Called once.
  virtual Status initialize(int num_blocks, int block_size, int max_tokens, int max_logit_rows) = 0;
  // Allocates num_host_blocks host slots of one page each (every layer's K
  // and V) for swapping; called after initialize() when swap is configured.
  virtual Status initialize_swap(int num_host_blocks) {
    (void)num_host_blocks;
    return unsupported("this executor cannot swap KV pages to host memory");
  }
  // Runs batch.swap_out, batch.copies, batch.swap_in, then the forward. Returns the logits of batch.logit_rows,
  // [logit_rows.size(), vocab] F32 in HOST memory, valid until the next call.
  // A batch without tokens runs only its copies (and returns null).
  // This is the one place logits cross to the host: a device backend copies
  // them here (or, later, samples on the device and returns only ids).
  virtual Expected<const float*> execute(const StepBatch& batch) = 0;

  // Step limits the engine guarantees, given before initialize(): sequences
  // per step and tokens per sequence (sizes fixed device arrays).
  virtual void set_limits(int max_num_seqs, int max_model_len) {
    (void)max_num_seqs;
    (void)max_model_len;
  }
  virtual DeviceSamplingLimits device_sampling_limits() const { return {}; }
  // Device time of the last execute_step (its copies, forward and sampling),
  // nanoseconds; -1 where not measured.
  virtual int64_t last_step_device_ns() const { return -1; }
  // The last step's device time in three parts (nanoseconds; -1 where not
  // measured): before the forward (page moves, uploads, token fills), the
  // forward (graph replay or eager), after it (sampling, copies back).
  // Measured only after set_step_phases(true) (two more timer marks a
  // step); the engine turns it on for OSPREY_STEP_TRACE.
  struct StepPhases {
    int64_t before_ns = -1, forward_ns = -1, after_ns = -1;
  };
  virtual void set_step_phases(bool on) { (void)on; }
  virtual StepPhases last_step_phases() const { return {}; }
  // The per-op profile (EngineConfig::profile); any thread. Empty by default.
  virtual ProfileReport profile() const { return {}; }
  virtual void reset_profile() {}
  // execute() plus device sampling of batch.sample_rows; only the sampled
  // ids (and logprobs), and the logits when batch.need_host_logits, reach the host.
  virtual Expected<StepOutput> execute_step(const StepBatch& batch) {
    Expected<const float*> logits = execute(batch);
    if (!logits.ok()) return logits.status();
    StepOutput out;
    out.logits = *logits;
    return out;
  }

  // Split steps (asynchronous scheduling, EngineConfig::async_scheduling).
  // launch_step() queues a step (copies, forward, device sampling and the
  // copy of its results to the host) and returns; wait_step() blocks until
  // the oldest launched step not yet waited for is done and returns its
  // output, valid until the next wait_step() or execute_step(). The batch may
  // be reused by the caller as soon as launch_step() returns.
  //
  // Where supports_async_steps() is false (the default) the engine never has
  // more than one step launched, and the defaults below simply run
  // execute_step() at launch. Where it is true, up to two steps may be in
  // flight: the engine launches step N + 1 (whose token_fills read step N's
  // sampled ids on the device) before it waits for step N, with these
  // guarantees: step N needs no host logits, so a host-logits buffer written
  // by step N + 1 is never one the host still reads; pages freed while a step
  // is in flight are reused only by later steps (device work runs in launch
  // order).
  virtual bool supports_async_steps() const { return false; }
  virtual Status launch_step(const StepBatch& batch) {
    if (has_launched_) return internal_error("launch_step: a step is already in flight");
    Expected<StepOutput> out = execute_step(batch);
    launched_status_ = out.ok() ? Status::Ok() : out.status();
    launched_output_ = out.ok() ? *out : StepOutput{};
    has_launched_ = true;
    return Status::Ok();
  }
  virtual Expected<StepOutput> wait_step() {
    if (!has_launched_) return internal_error("wait_step: no step in flight");
    has_launched_ = false;
    if (!launched_status_.ok()) return launched_status_;
    return launched_output_;
  }

 private:
  // The default split: the step already ran at launch.
  bool has_launched_ = false;
  Status launched_status_;
  StepOutput launched_output_;
};

}  // namespace osprey
