// Drives an EngineCore synchronously over the FakeExecutor, checking the
// per-step invariants (token budget, sequence cap, no unwritten KV read).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/output_processor.h"
#include "fake_model.h"

namespace osprey::testing {

inline CoreConfig small_core_config() {
  CoreConfig c;
  c.scheduler.max_num_batched_tokens = 32;
  c.scheduler.max_num_seqs = 8;
  c.scheduler.enable_chunked_prefill = true;
  c.scheduler.max_prompt_logprob_rows = 16;
  c.num_blocks = 64;
  c.block_size = 4;
  c.enable_prefix_caching = true;
  c.cache_salt = 42;
  c.max_model_len = 256;
  c.eos_token_ids = {kFakeEos};
  return c;
}

inline std::vector<int32_t> random_prompt(std::mt19937& rng, int len) {
  std::uniform_int_distribution<int> d(1, kFakeVocab - 1);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = d(rng);
  return p;
}

struct SeqResult {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  int num_finish_events = 0;
  std::vector<LogprobData> logprobs;
};

class CoreHarness {
 public:
  explicit CoreHarness(const CoreConfig& config) : config_(config) {
    core_ = std::make_unique<EngineCore>(config, exec_);
    EXPECT_TRUE(core_->initialize().ok());
  }

  void add(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& params, int priority = 0,
           uint64_t seed = 7) {
    auto req = std::make_unique<RequestState>();
    req->key = next_key_++;
    keys_[id] = req->key;
    req->id = id;
    req->params = params;
    req->priority = priority;
    req->seed = seed;
    req->sink = std::make_shared<RequestSink>(id, params, static_cast<int>(prompt.size()),
                                              std::span<const int32_t>(), nullptr, link_);
    results_[id].resize(params.n);
    prompts_[id] = prompt;
    params_[id] = params;
    seeds_[id] = seed;
    core_->add_request(std::move(req), std::move(prompt));
  }

  Status step() {
    std::vector<SeqEvent> events;
    Status st = core_->step(events);
    const SchedulerOutput& s = core_->last_schedule();
    EXPECT_LE(s.num_tokens, config_.scheduler.max_num_batched_tokens);
    EXPECT_LE(static_cast<int>(s.seqs.size()), config_.scheduler.max_num_seqs);
    EXPECT_LE(core_->scheduler().num_running(), config_.scheduler.max_num_seqs);
    max_step_tokens_ = std::max(max_step_tokens_, s.num_tokens);
    EXPECT_FALSE(exec_.read_unwritten);
    collect(events);
    ++num_steps_;
    return st;
  }

  void collect(std::vector<SeqEvent>& events) {
    for (auto& e : events) {
      SeqResult& r = results_.at(e.sink->id).at(e.index);
      if (e.token >= 0) {
        EXPECT_EQ(r.finish, FinishReason::kNone) << "token after finish";
        r.tokens.push_back(e.token);
      }
      if (e.logprobs) r.logprobs.push_back(*e.logprobs);
      if (!e.prompt_logprobs.empty())
        prompt_logprobs_[e.sink->id].insert(prompt_logprobs_[e.sink->id].end(), e.prompt_logprobs.begin(),
                                            e.prompt_logprobs.end());
      if (e.finish != FinishReason::kNone) {
        r.finish = e.finish;
        ++r.num_finish_events;
      }
    }
  }

  void run(int max_steps = 1000000) {
    for (int i = 0; i < max_steps && core_->has_work(); ++i) ASSERT_TRUE(step().ok());
    ASSERT_FALSE(core_->has_work()) << "did not finish in " << max_steps << " steps";
  }

  void abort(const std::string& id) {
    std::vector<SeqEvent> events;
    core_->abort_request(keys_.at(id), events);
    collect(events);
  }

  // Every finished, non-aborted sequence equals its reference.
  void expect_matches_reference() {
    for (auto& [id, seqs] : results_) {
      for (size_t i = 0; i < seqs.size(); ++i) {
        if (seqs[i].finish == FinishReason::kAbort) continue;
        RefResult ref = reference_generate(prompts_[id], params_[id], seeds_[id], static_cast<int>(i),
                                           config_.max_model_len);
        EXPECT_EQ(seqs[i].tokens, ref.tokens) << id << " index " << i;
        EXPECT_EQ(seqs[i].finish, ref.finish) << id << " index " << i;
        EXPECT_EQ(seqs[i].num_finish_events, 1) << id << " index " << i;
      }
    }
  }

  void expect_pool_free() {
    EXPECT_EQ(core_->kv().num_free_blocks(), core_->kv().num_blocks());
    EXPECT_EQ(core_->scheduler().num_running(), 0);
    EXPECT_EQ(core_->scheduler().num_waiting(), 0);
  }

  EngineCore& core() { return *core_; }
  FakeExecutor& exec() { return exec_; }
  std::map<std::string, std::vector<SeqResult>>& results() { return results_; }
  std::map<std::string, std::vector<LogprobData>>& prompt_logprobs() { return prompt_logprobs_; }
  int max_step_tokens() const { return max_step_tokens_; }
  int num_steps() const { return num_steps_; }

 private:
  CoreConfig config_;
  FakeExecutor exec_;
  std::unique_ptr<EngineCore> core_;
  std::shared_ptr<EngineLink> link_ = std::make_shared<EngineLink>();
  std::map<std::string, std::vector<SeqResult>> results_;
  std::map<std::string, std::vector<int32_t>> prompts_;
  std::map<std::string, SamplingParams> params_;
  std::map<std::string, uint64_t> seeds_;
  std::map<std::string, std::vector<LogprobData>> prompt_logprobs_;
  std::map<std::string, uint64_t> keys_;
  uint64_t next_key_ = 1;
  int max_step_tokens_ = 0;
  int num_steps_ = 0;
};

inline SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

}  // namespace osprey::testing
