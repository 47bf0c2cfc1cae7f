// The engine loop's view of a request: a group of n Sequences that share a
// prompt. Owned and touched by the engine loop thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/block_table.h"
#include "osprey/engine.h"
#include "sampling/penalty_state.h"

namespace osprey {

struct RequestSink;  // the output side (engine.cpp); opaque to the core
struct RequestState;

enum class SeqStatus { kWaiting, kRunning, kFinished };

// A token sampled by a step that is still in flight (asynchronous
// scheduling): its value is not on the host yet.
inline constexpr int32_t kPendingToken = -1;

struct Sequence {
  RequestState* req = nullptr;
  int index = 0;                 // sample index in [0, n)
  std::vector<int32_t> tokens;   // prompt then generated tokens
  int num_prompt_tokens = 0;
  // Tokens whose KV is in the pages of `table`; catches up with tokens.size().
  int num_computed = 0;
  BlockTable table;
  SeqStatus status = SeqStatus::kWaiting;
  // Prompt positions whose logits have produced prompt logprobs (index 0 only).
  int prompt_logprob_pos = 0;
  // Swapped out (waiting only): host slot i holds page i of positions
  // [0, num_swapped); swap-in restores them and num_computed = num_swapped.
  std::vector<int32_t> swapped_blocks;
  int num_swapped = 0;
  // Ids and counts the penalties need, folded in as tokens become known
  // (only used when the request has a penalty; a fork copies its parent's).
  PenaltyState penalties;

  // Asynchronous scheduling (EngineCore). The last num_pending tokens are
  // kPendingToken: sampled by steps in flight, resolved oldest first when
  // each step is waited for (at most 2, one per step in flight).
  int num_pending = 0;
  // Row of the newest pending token in its step's device sample rows (-1:
  // none, or sampled on the host).
  int pending_sample_row = -1;
  // Finishes with the step in flight (its token reaches max_tokens or
  // max_model_len): the scheduler skips it.
  bool hold = false;
  // The newest in-flight step that computes this sequence (EngineCore's
  // step id, -1: none) and its index in that step's sequences.
  int64_t inflight_step = -1;
  int inflight_slot = -1;

  bool swapped() const { return !swapped_blocks.empty(); }

  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_output() const { return num_tokens() - num_prompt_tokens; }
  // Tokens whose values are on the host (all but the pending ones).
  int num_known() const { return num_tokens() - num_pending; }
};

struct RequestState {
  uint64_t key = 0;              // unique for the engine's lifetime (ids may be reused)
  std::string id;
  uint64_t arrival = 0;          // admission order, for FCFS
  int priority = 0;
  // Scheduling order key (smaller first, then arrival): priority aged by the
  // engine step at arrival (Scheduler::assign_rank; EngineConfig::priority_aging_steps).
  int64_t rank = 0;
  SamplingParams params;
  uint64_t seed = 0;             // params.seed or one the engine drew
  std::vector<std::unique_ptr<Sequence>> seqs;  // seqs[i]->index == i once forked
  bool forked = false;           // the n - 1 siblings exist
  int num_cached_tokens = -1;    // prefix-cache hit at first admission (-1: not admitted yet)
  int64_t first_scheduled_ns = 0;  // steady-clock ns at the start of the step that first scheduled it (0: not yet)
  int num_live = 0;              // sequences not finished
  std::shared_ptr<RequestSink> sink;

  bool wants_prompt_logprobs() const { return params.prompt_logprobs >= 0; }
  // Sequences the request will occupy once its first token is sampled.
  int seqs_to_reserve() const { return forked ? 1 : params.n; }
  // Its next sampled token (the first) makes the n - 1 siblings.
  bool forks_at_next_sample() const { return !forked && params.n > 1; }
};

}  // namespace osprey
