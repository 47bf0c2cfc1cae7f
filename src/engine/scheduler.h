// Scheduler: decides, each step, which sequences compute how many tokens.
// Never includes a backend header; sees KV memory only through KvManager.
//
// Rules (one per step):
//   - Budget: the scheduled tokens sum to at most max_num_batched_tokens;
//     at most max_num_seqs sequences are running (n > 1 requests reserve n).
//   - Order: (rank, arrival, index), rank = priority * aging_steps + the
//     step count at arrival (aging; priority alone when aging_steps <= 0).
//     A sequence's effective priority thus improves by one level every
//     aging_steps steps relative to later arrivals, so none waits forever.
//   - Running sequences first, in that order; each computes its remaining
//     tokens (1 for a decode; a prefill chunk otherwise).
//   - When pages run out, the last running sequence in that order (lowest
//     priority, most recent) is preempted: swapped out when the KvManager has
//     host slots for its computed pages (its pages are copied to host memory,
//     then freed; on admission they are copied back into fresh pages), else
//     recomputed (its pages are freed). Either way it goes back to waiting
//     with its generated tokens and resumes identically. A sequence alone in
//     the pool that still cannot grow is finished ("length").
//   - Then waiting sequences, strictly in that order: swap-in of a swapped
//     sequence, else prefix cache match; then the rest of the prompt, chunked
//     to the budget left when chunked prefill is on (whole otherwise). None
//     are admitted in a step that preempted, so a step never swaps both ways.
//   - num_computed catches up with the token count; a sequence samples when
//     its step ends caught up.
//   - Asynchronous scheduling (EngineCore): a sequence on hold (it finishes
//     with the step in flight) is skipped; one whose last token is still in
//     flight is never finished as "cannot grow" nor admitted from waiting
//     until that token is known.
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
  // Priority aging (EngineConfig::priority_aging_steps); <= 0: off.
  int aging_steps = 256;
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
  std::vector<BlockCopy> swap_out;     // {device page -> host slot}, before copies
  std::vector<BlockCopy> swap_in;      // {host slot -> device page}, after copies
  std::vector<Sequence*> preempted;    // this step (already back in waiting)
  std::vector<Sequence*> cannot_grow;  // to finish with "length": the pool cannot hold them
  int num_tokens = 0;
  void clear() {
    seqs.clear();
    copies.clear();
    swap_out.clear();
    swap_in.clear();
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

  // Sets req.rank from its priority and the current step count; call before
  // the request's first sequence is added.
  void assign_rank(RequestState& req) const;
  void add_waiting(Sequence* seq);
  // A forked sibling that shares its parent's pages and is running already.
  void add_running(Sequence* seq);
  // Takes the sequence out of the queues and frees its pages.
  void remove(Sequence* seq);

  void schedule(SchedulerOutput& out);

  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }  // swap and recompute
  int64_t num_swap_outs() const { return num_swap_outs_; }
  int64_t num_schedules() const { return num_schedules_; }
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
  std::vector<Sequence*> running_;  // sorted by (rank, arrival, index) at each step
  std::vector<Sequence*> waiting_;  // kept sorted by (rank, arrival, index)
  int64_t num_preemptions_ = 0;
  int64_t num_swap_outs_ = 0;
  int64_t num_schedules_ = 0;       // schedule() calls: the age clock
};

}  // namespace osprey
