#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace osprey {

namespace {
bool before(const Sequence* a, const Sequence* b) {
  if (a->req->rank != b->req->rank) return a->req->rank < b->req->rank;
  if (a->req->arrival != b->req->arrival) return a->req->arrival < b->req->arrival;
  return a->index < b->index;
}
}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, KvManager& kv) : config_(config), kv_(kv) {
  OSP_CHECK_GT(config_.max_num_batched_tokens, 0);
  OSP_CHECK_GT(config_.max_num_seqs, 0);
}

int Scheduler::prompt_logprob_budget() const {
  return config_.enable_chunked_prefill ? std::max(1, config_.max_prompt_logprob_rows)
                                        : config_.max_num_batched_tokens;
}

int Scheduler::max_logit_rows() const { return config_.max_num_seqs + prompt_logprob_budget(); }

void Scheduler::assign_rank(RequestState& req) const {
  // Effective priority at step s: priority - (s - arrival_step) / aging_steps;
  // times aging_steps and plus s (the same for everyone) it is this fixed key.
  req.rank = config_.aging_steps > 0
                 ? static_cast<int64_t>(req.priority) * config_.aging_steps + num_schedules_
                 : static_cast<int64_t>(req.priority);
}

void Scheduler::add_waiting(Sequence* seq) {
  OSP_CHECK(seq->table.empty() && seq->num_computed == 0);
  seq->status = SeqStatus::kWaiting;
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), seq, before), seq);
}

void Scheduler::add_running(Sequence* seq) {
  seq->status = SeqStatus::kRunning;
  running_.push_back(seq);
}

void Scheduler::remove(Sequence* seq) {
  auto& q = seq->status == SeqStatus::kRunning ? running_ : waiting_;
  auto it = std::find(q.begin(), q.end(), seq);
  if (it != q.end()) q.erase(it);
  kv_.free(seq->table);
  kv_.drop_swapped(seq->swapped_blocks);
  seq->num_swapped = 0;
  seq->status = SeqStatus::kFinished;
}

void Scheduler::preempt(Sequence* seq, SchedulerOutput& out) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  OSP_CHECK(it != running_.end());
  running_.erase(it);
  if (kv_.swap_out(seq->table, seq->num_computed, seq->swapped_blocks, out.swap_out)) {
    seq->num_swapped = seq->num_computed;
    ++num_swap_outs_;
  } else {
    kv_.free(seq->table);  // recompute
  }
  seq->num_computed = 0;
  add_waiting(seq);
  out.preempted.push_back(seq);
  ++num_preemptions_;
}

bool Scheduler::whole_or_chunkable(int num_new, int remaining) const {
  // Without chunked prefill a sequence computes all its remaining tokens in
  // one step, except one longer than a whole step (a resumed long sequence).
  return config_.enable_chunked_prefill || num_new == remaining || remaining > config_.max_num_batched_tokens;
}

int Scheduler::prompt_rows(const Sequence& seq, int& num_new, int rows_left) const {
  if (!seq.req->wants_prompt_logprobs() || seq.index != 0) return 0;
  const int last = seq.num_prompt_tokens - 1;  // positions [0, last) give prompt logprobs
  const int begin = std::max(seq.num_computed, seq.prompt_logprob_pos);
  if (begin >= last) return 0;
  if (seq.num_computed < last && num_new > rows_left) num_new = rows_left;
  const int end = std::min(seq.num_computed + num_new, last);
  return std::max(0, end - begin);
}

void Scheduler::schedule(SchedulerOutput& out) {
  out.clear();
  ++num_schedules_;
  int budget = config_.max_num_batched_tokens;
  int rows_left = prompt_logprob_budget();
  std::stable_sort(running_.begin(), running_.end(), before);
  bool preempted_any = false;

  // Running sequences; victims are taken from the back, which is never
  // scheduled yet (the loop goes front to back).
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Sequence* seq = running_[i];
    if (seq->hold) {
      ++i;  // finishes with the step in flight
      continue;
    }
    const int remaining = seq->num_tokens() - seq->num_computed;
    OSP_CHECK_GT(remaining, 0);
    int num_new = std::min(remaining, budget);
    if (!whole_or_chunkable(num_new, remaining)) {
      ++i;
      continue;
    }
    const int rows = prompt_rows(*seq, num_new, rows_left);
    if (num_new == 0) {
      ++i;
      continue;
    }
    bool scheduled = false;
    while (true) {
      if (kv_.allocate(seq->table, seq->num_computed, num_new, out.copies)) {
        scheduled = true;
        break;
      }
      if (running_.size() == 1) {
        // Alone, with every other page free: the pool cannot hold it. With a
        // token still in flight it waits a step (that token is emitted first).
        if (seq->num_pending > 0) {
          ++i;  // unscheduled this step
          break;
        }
        running_.erase(running_.begin());
        out.cannot_grow.push_back(seq);
        break;
      }
      Sequence* victim = running_.back();
      preempt(victim, out);
      preempted_any = true;
      if (victim == seq) break;
    }
    if (!scheduled) continue;  // running_[i] is now the next sequence (or past the end)
    out.seqs.push_back({seq, num_new, seq->num_computed + num_new == seq->num_tokens(), rows, 0});
    out.num_tokens += num_new;
    budget -= num_new;
    rows_left -= rows;
    ++i;
  }

  // Waiting sequences, strictly in order.
  int num_seqs = 0;
  for (Sequence* s : running_) num_seqs += s->req->seqs_to_reserve();
  while (!preempted_any && !waiting_.empty() && budget > 0) {
    Sequence* seq = waiting_.front();
    if (num_seqs + seq->req->seqs_to_reserve() > config_.max_num_seqs) break;
    if (seq->num_pending > 0) break;  // preempted with a token in flight: admitted once it is known
    OSP_CHECK(seq->table.empty());
    const bool first_pass_logprobs = seq->req->wants_prompt_logprobs() && seq->index == 0 &&
                                     seq->prompt_logprob_pos < seq->num_prompt_tokens - 1;
    const bool swapped = seq->swapped();
    int matched = 0;
    if (swapped) {
      seq->num_computed = seq->num_swapped;
    } else {
      matched = first_pass_logprobs ? 0 : kv_.match_prefix(seq->table, seq->tokens);
      seq->num_computed = matched;
    }
    const int remaining = seq->num_tokens() - seq->num_computed;
    int num_new = std::min(remaining, budget);
    const int rows = prompt_rows(*seq, num_new, rows_left);
    bool ok = num_new > 0 && whole_or_chunkable(num_new, remaining);
    if (ok) {
      ok = swapped ? kv_.swap_in(seq->table, seq->swapped_blocks, seq->num_swapped, num_new, out.swap_in)
                   : kv_.allocate(seq->table, seq->num_computed, num_new, out.copies);
    }
    if (ok && swapped) seq->num_swapped = 0;
    if (!ok) {
      kv_.free(seq->table);
      seq->num_computed = 0;
      if (running_.empty() && out.seqs.empty() &&
          KvManager::blocks_for(seq->num_tokens(), kv_.block_size()) > kv_.num_blocks()) {
        // Even the whole pool cannot hold it (a resumed sequence grew too long).
        waiting_.erase(waiting_.begin());
        out.cannot_grow.push_back(seq);
        continue;
      }
      break;
    }
    if (seq->req->num_cached_tokens < 0) seq->req->num_cached_tokens = matched;
    waiting_.erase(waiting_.begin());
    seq->status = SeqStatus::kRunning;
    running_.push_back(seq);
    num_seqs += seq->req->seqs_to_reserve();
    out.seqs.push_back({seq, num_new, seq->num_computed + num_new == seq->num_tokens(), rows, 0});
    out.num_tokens += num_new;
    budget -= num_new;
    rows_left -= rows;
  }
}

}  // namespace osprey
