// EngineCore: one engine step, synchronously and single-threaded: schedule
// -> build the batch -> execute -> sample -> update (append tokens, stop on
// EOS / stop ids / max_tokens / max_model_len, cache full pages, free
// finished sequences). Emits SeqEvents for the output side; never
// detokenizes (stop strings are matched by the output side, which calls
// finish_sequence()). The Engine's loop thread owns it; tests drive it
// directly with a fake Executor.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/executor.h"
#include "engine/request_state.h"
#include "engine/scheduler.h"
#include "kv/kv_manager.h"
#include "sampling/logprobs.h"
#include "sampling/sampler.h"

namespace osprey {

struct CoreConfig {
  SchedulerConfig scheduler;
  int num_blocks = 0;
  int block_size = 16;
  int num_swap_blocks = 0;  // host swap slots (pages); 0: preemption recomputes
  bool enable_prefix_caching = true;
  uint64_t cache_salt = 0;
  int max_model_len = 0;
  std::vector<int32_t> eos_token_ids;
};

// What happened to one sequence in one step.
struct SeqEvent {
  std::shared_ptr<RequestSink> sink;
  int index = 0;
  int32_t token = -1;                       // the new token, or -1
  std::optional<LogprobData> logprobs;      // of the new token
  std::vector<LogprobData> prompt_logprobs; // token_id = prompt token at position p + 1
  FinishReason finish = FinishReason::kNone;
  int32_t stop_token_id = -1;
  int num_cached_tokens = 0;
  int64_t first_scheduled_ns = 0;           // RequestState::first_scheduled_ns (0: never scheduled)
  Status error;
};

struct CoreStats {
  int64_t num_prompt_tokens = 0;     // prompt positions computed (recompute included)
  int64_t num_generated_tokens = 0;
  int64_t num_steps = 0;
  int64_t num_finished_requests = 0;
  // Wall time of the phases of decode-only steps (every scheduled sequence
  // computes exactly one token), nanoseconds summed over those steps.
  int64_t num_decode_steps = 0;
  int64_t decode_tokens = 0;
  int64_t decode_schedule_ns = 0;  // Scheduler::schedule
  int64_t decode_build_ns = 0;     // build_step_batch
  int64_t decode_forward_ns = 0;   // Executor::execute (copies + forward + logits to host)
  int64_t decode_update_ns = 0;    // sampling + update (stops, prefix cache, release)
  int64_t decode_sample_ns = 0;    // of which in the sampler (penalties, argmax / draw, logprobs)
  // Device time of decode steps (copies, forward, sampling; -1 per step not
  // measured is left out): the GPU-busy fraction is this over the steps' wall time.
  int64_t decode_device_ns = 0;
  int64_t num_timed_decode_steps = 0;
};

class EngineCore {
 public:
  EngineCore(const CoreConfig& config, Executor& executor);

  // Allocates the executor's pages and step buffers.
  Status initialize();

  // A validated request: prompt non-empty, prompt + 1 fits max_model_len and
  // the pool; req->key unique among requests in flight.
  void add_request(std::unique_ptr<RequestState> req, std::vector<int32_t> prompt);
  // Finishes every live sequence of the request with "abort". False if unknown.
  bool abort_request(uint64_t key, std::vector<SeqEvent>& events);
  // The output side matched a stop string: drop the sequence (no event).
  void finish_sequence(uint64_t key, int index);
  // Finishes everything in flight (shutdown, executor failure).
  void fail_all(FinishReason reason, const Status& error, std::vector<SeqEvent>& events);

  bool has_work() const { return !requests_.empty(); }
  size_t num_requests() const { return requests_.size(); }

  // One step; appends the step's events. Returns the executor's error, if any
  // (every request in flight has then been finished with "error").
  Status step(std::vector<SeqEvent>& events);

  const KvManager& kv() const { return kv_; }
  const Scheduler& scheduler() const { return scheduler_; }
  const CoreStats& stats() const { return stats_; }
  const SchedulerOutput& last_schedule() const { return sched_out_; }
  const StepBatch& last_batch() const { return batch_; }

 private:
  // One sampled token: from the device's result when `device` is set, else
  // by the host sampler over `row` (raw logits).
  void sample_into(Sequence& seq, const float* row, const DeviceSampleResult* device, std::vector<SeqEvent>& events);
  // Fills batch_.sample_rows / sample_edits / need_host_logits and sample_task_.
  void plan_device_sampling();
  void fill_stop_ids(const SamplingParams& p);
  void finish(Sequence& seq, FinishReason reason, int32_t stop_token, std::vector<SeqEvent>& events,
              SeqEvent* ev);
  void release_request_if_done(RequestState& req);

  CoreConfig config_;
  Executor& executor_;
  KvManager kv_;
  Scheduler scheduler_;
  Sampler sampler_;
  std::unordered_map<uint64_t, std::unique_ptr<RequestState>> requests_;  // by key
  uint64_t next_arrival_ = 0;
  SchedulerOutput sched_out_;
  StepBatch batch_;
  std::vector<int32_t> stop_ids_scratch_;
  std::vector<RequestState*> touched_scratch_;  // requests of the current step (step())
  // Per scheduled sequence of the step: its first row in batch_.sample_rows, or -1 (host).
  std::vector<int> sample_task_;
  int64_t step_sample_ns_ = 0;  // sampler time of the current step
  CoreStats stats_;
};

}  // namespace osprey
