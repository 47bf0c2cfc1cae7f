// Scheduler: decides, each step, which sequences compute how many tokens.
// Never includes a backend header; sees KV memory only through KvManager.
//
// Rules (one per step):
//   - Budget: the scheduled tokens sum to at most max_num_batched_tokens;
//     at most max_num_seqs sequences are running (n > 1 requests reserve n).
//   - Running sequences first, in (priority, arrival) order; each computes
//     its remaining tokens (1 for a decode; a prefill chunk otherwise).
//   - When pages run out, the lowest-priority, most recently arrived running
//     sequence is preempted (recompute: its pages are freed, it goes back to
//     waiting with its generated tokens and resumes identically). A sequence
//     alone in the pool that still cannot grow is finished ("length").
//   - Then waiting sequences, strictly FCFS by (priority, arrival): prefix
//     cache match first, then the rest of the prompt, chunked to the budget
//     left when chunked prefill is on (whole otherwise). None are admitted in
//     a step that preempted.
//   - num_computed catches up with the token count; a sequence samples when
//     its step ends caught up.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request_state.h"
#include "kv/kv_manager.h"

namespace osprey {

struct SchedulerConfig {
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 256;
  bool enable_chunked_prefill = true;
  // Logit rows for prompt logprobs per step (chunked mode; otherwise whole prompts).
  int max_prompt_logprob_rows = 256;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int num_new = 0;               // tokens computed this step: positions [num_computed, +num_new)
  bool sample = false;           // the step ends caught up: sample the next token
  int num_prompt_logprob_rows = 0;  // rows for prompt positions [prompt_logprob_pos, +rows)
  int first_logit_row = 0;       // set by the batch builder; the sample row follows the prompt rows
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;
  std::vector<BlockCopy> copies;       // to apply before the forward
  std::vector<Sequence*> preempted;    // this step (already back in waiting)
  std::vector<Sequence*> cannot_grow;  // to finish with "length": the pool cannot hold them
  int num_tokens = 0;
  void clear() {
    seqs.clear();
    copies.clear();
    preempted.clear();
    cannot_grow.clear();
    num_tokens = 0;
  }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvManager& kv);

  const SchedulerConfig& config() const { return config_; }
  // Logit rows a step can need at most.
  int max_logit_rows() const;

  void add_waiting(Sequence* seq);
  // A forked sibling that shares its parent's pages and is running already.
  void add_running(Sequence* seq);
  // Takes the sequence out of the queues and frees its pages.
  void remove(Sequence* seq);

  void schedule(SchedulerOutput& out);

  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::vector<Sequence*>& waiting() const { return waiting_; }

 private:
  void preempt(Sequence* seq, SchedulerOutput& out);
  int prompt_logprob_budget() const;
  bool whole_or_chunkable(int num_new, int remaining) const;
  // Caps num_new for the prompt-logprob row budget; returns the rows used.
  int prompt_rows(const Sequence& seq, int& num_new, int rows_left) const;

  SchedulerConfig config_;
  KvManager& kv_;
  std::vector<Sequence*> running_;  // sorted by (priority, arrival, index) at each step
  std::vector<Sequence*> waiting_;  // kept sorted by (priority, arrival, index)
  int64_t num_preemptions_ = 0;
};

}  // namespace osprey
