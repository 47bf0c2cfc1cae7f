// EngineCore: engine steps on one thread: schedule -> build the batch ->
// launch -> wait -> sample -> update (append tokens, stop on EOS / stop ids /
// max_tokens / max_model_len, cache full pages, free finished sequences).
// Emits SeqEvents for the output side; never detokenizes (stop strings are
// matched by the output side, which calls finish_sequence()). The Engine's
// loop thread owns it; tests drive it directly with a fake Executor.
//
// Asynchronous scheduling (CoreConfig::async_scheduling, executors with
// supports_async_steps()): step() schedules, builds and launches step N + 1
// while step N still runs, then waits for N and processes its results, so
// the host's work hides behind the device's. At launch every sequence that
// samples in the step is advanced as if its token were known: num_computed
// moves on and a kPendingToken placeholder is appended; the next step's row
// for that token is filled on the device from the step's sampled ids
// (StepBatch::token_fills). Waiting for the step resolves the placeholders
// oldest first, then stops sequences as usual; a sequence that stopped (EOS,
// stop id) while its next row was already launched has that row dropped; its
// pages are freed at once, which is safe because device work runs in launch
// order (a page freed now is reused only by a later step). Sequences that
// finish by length are known at launch and put on hold (not scheduled).
// A step is launched before the previous one is waited for only when the
// previous one needs nothing on the host to build it: no host logits (host
// sampling, prompt logprobs), no n > 1 fork, no penalties (their device rows
// list the output tokens). Otherwise step() waits first, as without async.
#pragma once

#include <array>
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
  // Launch step N + 1 before waiting for step N where the executor supports
  // it (EngineConfig::async_scheduling).
  bool async_scheduling = true;
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
  // computes exactly one token), nanoseconds summed over those steps. The
  // phases are host time and never overlap one another, so their sum is the
  // loop's time in EngineCore::step.
  int64_t num_decode_steps = 0;
  int64_t decode_tokens = 0;
  int64_t decode_schedule_ns = 0;  // Scheduler::schedule
  int64_t decode_build_ns = 0;     // build_step_batch + device sampling plan
  // Executor::launch_step + wait_step: the host's time queueing the step and
  // blocked on it. Synchronously that is the step's copies + forward +
  // sampling; with asynchronous scheduling only the part not hidden behind
  // the host's work on the next step.
  int64_t decode_forward_ns = 0;
  int64_t decode_update_ns = 0;    // advancing at launch + sampling + update (stops, prefix cache, release)
  int64_t decode_sample_ns = 0;    // of which in the sampler (penalties, argmax / draw, logprobs)
  // Device time of decode steps (copies, forward, sampling; -1 per step not
  // measured is left out): the GPU-busy fraction is this over the steps' wall time.
  int64_t decode_device_ns = 0;
  int64_t num_timed_decode_steps = 0;
  // Rows computed for sequences that finished (EOS, stop id, abort, stop
  // string) while their step was in flight (asynchronous scheduling).
  int64_t num_dropped_rows = 0;
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

  bool has_work() const { return !requests_.empty() || num_inflight_ > 0; }
  // Whether steps may overlap (config and executor); set by initialize().
  bool async_scheduling() const { return async_; }
  // Steps launched and not yet waited for (0 or 1 between step() calls).
  int num_inflight() const { return num_inflight_; }
  // Steps launched before the previous one was waited for.
  int64_t num_overlapped_steps() const { return num_overlapped_; }
  size_t num_requests() const { return requests_.size(); }

  // One step; appends the events of the steps it waited for (the previous
  // one under asynchronous scheduling, whose successor it launched). Returns
  // the executor's error, if any (every request in flight has then been
  // finished with "error").
  Status step(std::vector<SeqEvent>& events);

  const KvManager& kv() const { return kv_; }
  const Scheduler& scheduler() const { return scheduler_; }
  const CoreStats& stats() const { return stats_; }
  const SchedulerOutput& last_schedule() const { return sched_out_; }
  const StepBatch& last_batch() const { return batch_; }

 private:
  // A launched step, until it is waited for.
  struct InflightStep {
    int64_t id = 0;
    std::vector<ScheduledSeq> seqs;  // seq == nullptr: finished while in flight (row dropped)
    std::vector<int> begin;          // per seq: num_computed before the step
    std::vector<int> sample_task;    // per seq: first row in the step's sample_rows, or -1 (host)
    std::vector<int> token_index;    // per seq: index in tokens of its sampled token, or -1
    bool next_may_overlap = false;   // the next step may launch before this one is waited for
    bool decode_only = false;
    int num_tokens = 0;
    int64_t schedule_ns = 0, build_ns = 0, launch_ns = 0, advance_ns = 0;
  };

  // Schedules, builds and launches the next step (if there is anything to
  // run); advances its sequences past it.
  Status launch_next(std::vector<SeqEvent>& events, bool& launched);
  // Waits for the oldest step in flight and processes its results.
  Status finish_oldest(std::vector<SeqEvent>& events);
  InflightStep& inflight(int i) { return inflight_[(inflight_head_ + i) % inflight_.size()]; }
  // The sequence leaves the newest in-flight step that computes it (its row is dropped).
  void drop_inflight(Sequence& seq);
  // Token `index` of the sequence (appended when index == num_tokens(), else
  // its pending placeholder resolved): from the device's result when `device`
  // is set, else by the host sampler over `row` (raw logits).
  void sample_into(Sequence& seq, int index, const float* row, const DeviceSampleResult* device,
                   std::vector<SeqEvent>& events);
  // Fills batch_.sample_rows / sample_edits / need_host_logits and rec.sample_task.
  void plan_device_sampling(InflightStep& rec);
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
  std::vector<RequestState*> touched_scratch_;  // requests of the step being finished
  int64_t step_sample_ns_ = 0;  // sampler time of the step being finished
  CoreStats stats_;
  bool async_ = false;
  // Steps in flight, oldest first from inflight_head_ (a ring of two).
  std::array<InflightStep, 2> inflight_;
  int inflight_head_ = 0;
  int num_inflight_ = 0;
  int64_t next_step_id_ = 0;
  int64_t num_overlapped_ = 0;
};

}  // namespace osprey
