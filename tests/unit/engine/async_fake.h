// Test doubles for asynchronous scheduling: "device" sampling with the host
// sampler's semantics over DeviceSampleRows, and an Executor whose split
// steps really defer. launch_step() only queues a copy of the batch;
// wait_step() runs the oldest queued step: fills its pending tokens from the
// previous step's sampled ids (as the device does), runs the FakeExecutor's
// paged "KV" and logits, samples its rows. Steps thus run in launch order,
// like a device stream, and a step launched before its predecessor was
// waited for sees only what that predecessor really produced.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <limits>
#include <span>
#include <vector>

#include "engine/executor.h"
#include "engine/request_state.h"
#include "fake_model.h"
#include "sampling/device_sampling.h"
#include "sampling/logits_processors.h"
#include "sampling/logprobs.h"
#include "sampling/rng.h"

namespace osprey::testing {

// Samples every row of b.sample_rows from `logits` ([logit_rows, vocab],
// raw) with the host sampler's semantics. Returns the rows with edits.
inline int fake_device_sample(const StepBatch& b, const float* logits, int vocab,
                              std::vector<DeviceSampleResult>& results) {
  results.assign(b.sample_rows.size(), DeviceSampleResult{});
  int scratch_rows = 0;
  std::vector<float> x;
  for (size_t i = 0; i < b.sample_rows.size(); ++i) {
    const DeviceSampleRow& r = b.sample_rows[i];
    EXPECT_GE(r.logit_row, 0);
    EXPECT_LT(r.logit_row, static_cast<int>(b.logit_rows.size()));
    const float* raw = logits + static_cast<size_t>(r.logit_row) * vocab;
    x.assign(raw, raw + vocab);
    const int32_t* ids = b.sample_edits.ids.data() + r.edit_begin;
    const float* vals = b.sample_edits.vals.data() + r.edit_begin;
    const bool edited = r.num_bias + r.num_mask + r.num_rep + r.num_freq > 0;
    EXPECT_EQ(r.scratch_row >= 0, edited);
    if (edited) ++scratch_rows;
    for (int j = 0; j < r.num_bias; ++j) x[ids[j]] += vals[j];
    ids += r.num_bias, vals += r.num_bias;
    for (int j = 0; j < r.num_mask; ++j) x[ids[j]] = -std::numeric_limits<float>::infinity();
    ids += r.num_mask, vals += r.num_mask;
    for (int j = 0; j < r.num_rep; ++j) {
      EXPECT_GE(ids[j], 0) << "a pending token reached a penalty list";
      float& v = x[ids[j]];
      v = v > 0 ? v / r.repetition_penalty : v * r.repetition_penalty;
    }
    ids += r.num_rep, vals += r.num_rep;
    for (int j = 0; j < r.num_freq; ++j) {
      EXPECT_GE(ids[j], 0) << "a pending token reached a penalty list";
      x[ids[j]] -= vals[j] * r.frequency_penalty + r.presence_penalty;
    }
    DeviceSampleResult& res = results[i];
    if (r.temperature <= kGreedyTemperature) {
      res.token = argmax(x);
    } else {
      Candidates c;
      truncate_distribution(x, r.temperature, r.min_p, r.top_k, r.top_p, c);
      res.token = draw(c, sampling_uniform(r.seed, r.seq_index, r.position));
    }
    if (r.num_logprobs >= 0) {
      LogprobData d = compute_logprobs(std::span<const float>(raw, vocab), res.token, r.num_logprobs);
      res.logprob = d.logprob;
      res.rank = d.rank;
      for (size_t k = 0; k < d.top.size(); ++k) {
        res.top_ids[k] = d.top[k].first;
        res.top_logprobs[k] = d.top[k].second;
      }
    }
  }
  return scratch_rows;
}

class AsyncFakeExecutor final : public Executor {
 public:
  // async: split steps defer (supports_async_steps()); else the Executor defaults.
  explicit AsyncFakeExecutor(bool async, DeviceSamplingLimits limits = {64, 4096, 16})
      : async_(async), limits_(limits) {}

  int vocab_size() const override { return inner_.vocab_size(); }
  Status initialize(int nb, int bs, int mt, int mlr) override { return inner_.initialize(nb, bs, mt, mlr); }
  Status initialize_swap(int n) override { return inner_.initialize_swap(n); }
  DeviceSamplingLimits device_sampling_limits() const override { return limits_; }
  Expected<const float*> execute(const StepBatch& b) override { return inner_.execute(b); }
  Expected<StepOutput> execute_step(const StepBatch& b) override {
    EXPECT_EQ(queue_.size(), 0u) << "execute_step with steps in flight";
    EXPECT_TRUE(b.token_fills.empty()) << "token fills in a synchronous step";
    scratch_ = b;
    return run(scratch_);
  }
  bool supports_async_steps() const override { return async_; }
  Status launch_step(const StepBatch& b) override {
    if (!async_) return Executor::launch_step(b);
    if (queue_.size() >= 2) return internal_error("more than two steps in flight");
    if (!queue_.empty()) ++num_overlapped_launches;
    queue_.push_back(b);
    max_in_flight = std::max(max_in_flight, static_cast<int>(queue_.size()));
    return Status::Ok();
  }
  Expected<StepOutput> wait_step() override {
    if (!async_) return Executor::wait_step();
    if (queue_.empty()) return internal_error("wait_step with nothing in flight");
    scratch_ = std::move(queue_.front());
    queue_.pop_front();
    return run(scratch_);
  }

  FakeExecutor& inner() { return inner_; }
  int64_t num_fills = 0;               // tokens filled from the previous step's samples
  int64_t num_overlapped_launches = 0; // launches while another step was queued
  int64_t num_host_logit_steps = 0;
  int max_in_flight = 0;
  int fail_at_run = -1;                // the run with this index (0-based) fails
  int64_t num_runs = 0;

 private:
  Expected<StepOutput> run(StepBatch& b) {
    if (num_runs++ == fail_at_run) {
      prev_samples_.clear();
      return internal_error("fake device failure");
    }
    // Pending tokens: exactly the filled rows, from the previous step's samples.
    size_t next_fill = 0;
    for (int t = 0; t < b.num_tokens; ++t) {
      const bool filled = next_fill < b.token_fills.size() && b.token_fills[next_fill].token_row == t;
      if (!filled) {
        EXPECT_GE(b.token_ids[t], 0) << "unfilled pending token in row " << t;
        continue;
      }
      const TokenFill& f = b.token_fills[next_fill++];
      EXPECT_EQ(b.token_ids[t], kPendingToken);
      if (f.sample_row < 0 || f.sample_row >= static_cast<int>(prev_samples_.size()))
        return internal_error("token fill reads a sample row the previous step did not produce");
      b.token_ids[t] = prev_samples_[static_cast<size_t>(f.sample_row)];
      ++num_fills;
    }
    EXPECT_EQ(next_fill, b.token_fills.size()) << "fills out of order or out of range";
    Expected<const float*> l = inner_.execute(b);
    if (!l.ok()) return l.status();
    StepOutput out;
    prev_samples_.clear();
    if (b.num_tokens == 0) return out;
    EXPECT_LE(static_cast<int>(b.sample_rows.size()), limits_.max_rows);
    const int scratch = fake_device_sample(b, *l, vocab_size(), results_);
    EXPECT_LE(scratch, limits_.max_scratch_rows);
    for (const DeviceSampleResult& r : results_) prev_samples_.push_back(r.token);
    if (b.need_host_logits) ++num_host_logit_steps;
    out.logits = b.need_host_logits ? *l : nullptr;
    out.samples = results_.data();
    return out;
  }

  bool async_;
  DeviceSamplingLimits limits_;
  FakeExecutor inner_;
  std::deque<StepBatch> queue_;
  StepBatch scratch_;
  std::vector<DeviceSampleResult> results_;
  std::vector<int32_t> prev_samples_;  // sampled ids of the last step run
};

}  // namespace osprey::testing
