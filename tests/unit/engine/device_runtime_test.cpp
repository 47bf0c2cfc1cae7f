// Host-side logic of the device runtime (no GPU): decode-graph bucket
// choice, KV pool sizing from a memory report, the device sampling rows
// built from SamplingParams, and the engine core's split between device and
// host sampling, checked through a fake executor that "samples on the
// device" with the host sampler's semantics: outputs must equal the plain
// host path's token for token, with and without the device's limits.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "async_fake.h"
#include "core_harness.h"
#include "engine/engine_core.h"
#include "engine/model_executor.h"
#include "sampling/device_sampling.h"
#include "sampling/logits_processors.h"
#include "sampling/logprobs.h"
#include "sampling/rng.h"

namespace osprey::testing {
namespace {

TEST(DecodeGraphBucket, PicksTheSmallestBucketAtLeastN) {
  EXPECT_EQ(decode_graph_bucket(1, 256), 1);
  EXPECT_EQ(decode_graph_bucket(2, 256), 2);
  EXPECT_EQ(decode_graph_bucket(3, 256), 4);
  EXPECT_EQ(decode_graph_bucket(5, 256), 8);
  EXPECT_EQ(decode_graph_bucket(8, 256), 8);
  EXPECT_EQ(decode_graph_bucket(9, 256), 16);
  EXPECT_EQ(decode_graph_bucket(17, 256), 24);
  EXPECT_EQ(decode_graph_bucket(33, 256), 40);
  EXPECT_EQ(decode_graph_bucket(256, 256), 256);
  EXPECT_EQ(decode_graph_bucket(97, 100), 100);  // the cap itself is a bucket
  EXPECT_EQ(decode_graph_bucket(101, 100), 0);   // beyond the largest: eager
  EXPECT_EQ(decode_graph_bucket(0, 100), 0);
  EXPECT_EQ(decode_graph_bucket(3, 3), 3);
  for (int n = 1; n <= 300; ++n) {
    const int b = decode_graph_bucket(n, 300);
    EXPECT_GE(b, n);
    EXPECT_LE(b - n, 7) << n;  // padding wastes at most 7 rows
  }
}

TEST(LeadingSingleTokenSeqs, CountsTheOneTokenSequencesAtTheFront) {
  EXPECT_EQ(leading_single_token_seqs({0}), 0);                 // no sequences
  EXPECT_EQ(leading_single_token_seqs({}), 0);                  // malformed: nothing
  EXPECT_EQ(leading_single_token_seqs({0, 1, 2, 3}), 3);        // all decodes
  EXPECT_EQ(leading_single_token_seqs({0, 1, 2, 50, 51}), 2);   // stops at the prompt
  EXPECT_EQ(leading_single_token_seqs({0, 40, 41, 42}), 0);     // a prompt first
  EXPECT_EQ(leading_single_token_seqs({0, 1, 1, 2}), 1);        // an empty sequence ends it
}

TEST(KvPagesFromMemory, BudgetIsUtilizationMinusInUse) {
  const size_t gib = size_t{1} << 30;
  // 80 GiB card, 10 GiB in use, 90%: 72 - 10 = 62 GiB of 2 MiB pages.
  auto pages = kv_pages_from_memory(70 * gib, 80 * gib, 0.9, size_t{2} << 20);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(*pages, static_cast<int64_t>((0.9 * 80 - 10) * 512));
  // Nothing left: a clear error.
  auto none = kv_pages_from_memory(70 * gib, 80 * gib, 0.1, size_t{2} << 20);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().to_string().find("no device memory left for the KV cache"), std::string::npos);
  EXPECT_FALSE(kv_pages_from_memory(70 * gib, 80 * gib, 1.5, 4096).ok());
  EXPECT_FALSE(kv_pages_from_memory(70 * gib, 80 * gib, 0.0, 4096).ok());
  EXPECT_FALSE(kv_pages_from_memory(90 * gib, 80 * gib, 0.9, 4096).ok());
}

TEST(DeviceSampleRows, SectionsFollowTheParams) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 5;
  p.logit_bias = {{4, 1.0f}, {9, -2.0f}};
  p.min_tokens = 3;
  p.repetition_penalty = 1.2f;
  p.frequency_penalty = 0.5f;
  p.logprobs = 2;
  const std::vector<int32_t> prompt = {5, 6, 5, 7};
  const std::vector<int32_t> output = {7, 8, 8};
  const std::vector<int32_t> stops = {0, 2};
  DeviceSampleEdits edits;
  edits.ids = {99};  // earlier rows' edits stay
  edits.vals = {0.0f};
  DeviceSampleRow r;
  make_device_sample_row(p, prompt, output, stops, 42, 3, 17, r, edits);
  EXPECT_EQ(r.edit_begin, 1);
  EXPECT_EQ(r.num_bias, 2);
  EXPECT_EQ(r.num_mask, 0);  // output (3) has reached min_tokens (3)
  EXPECT_EQ(r.num_rep, 4);   // {5, 6, 7, 8}
  EXPECT_EQ(r.num_freq, 2);  // {7: 1, 8: 2}
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.seq_index, 3);
  EXPECT_EQ(r.position, 17);
  EXPECT_EQ(r.num_logprobs, 2);
  const std::vector<int32_t> ids(edits.ids.begin() + 1, edits.ids.end());
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 9, 5, 6, 7, 8, 7, 8}));
  EXPECT_EQ(edits.vals[1], 1.0f);
  EXPECT_EQ(edits.vals[2], -2.0f);
  EXPECT_EQ(edits.vals[7], 1.0f);
  EXPECT_EQ(edits.vals[8], 2.0f);
  // Before min_tokens: the stop ids are masked; no penalties: no sections.
  SamplingParams q;
  q.min_tokens = 5;
  DeviceSampleRow r2;
  make_device_sample_row(q, prompt, output, stops, 0, 0, 0, r2, edits);
  EXPECT_EQ(r2.num_mask, 2);
  EXPECT_EQ(r2.num_bias + r2.num_rep + r2.num_freq, 0);
  EXPECT_EQ(r2.num_logprobs, -1);
  EXPECT_TRUE(device_can_sample(q));
}

// Samples "on the device" with exactly the host sampler's semantics, from
// the rows the engine core planned.
class DeviceSamplingFake final : public Executor {
 public:
  explicit DeviceSamplingFake(DeviceSamplingLimits limits) : limits_(limits) {}
  int vocab_size() const override { return inner_.vocab_size(); }
  Status initialize(int nb, int bs, int mt, int mlr) override { return inner_.initialize(nb, bs, mt, mlr); }
  Status initialize_swap(int n) override { return inner_.initialize_swap(n); }
  Expected<const float*> execute(const StepBatch& b) override { return inner_.execute(b); }
  DeviceSamplingLimits device_sampling_limits() const override { return limits_; }
  Expected<StepOutput> execute_step(const StepBatch& b) override {
    EXPECT_LE(static_cast<int>(b.sample_rows.size()), std::max(limits_.max_rows, 0));
    Expected<const float*> l = inner_.execute(b);
    if (!l.ok()) return l.status();
    StepOutput out;
    if (b.num_tokens == 0) return out;
    const int scratch_rows = fake_device_sample(b, *l, vocab_size(), results_);
    EXPECT_LE(scratch_rows, limits_.max_scratch_rows);
    device_rows += static_cast<int64_t>(b.sample_rows.size());
    if (!b.need_host_logits) ++steps_without_host_logits;
    out.logits = b.need_host_logits ? *l : nullptr;
    out.samples = results_.data();
    return out;
  }

  int64_t device_rows = 0;
  int64_t steps_without_host_logits = 0;

 private:
  FakeExecutor inner_;
  DeviceSamplingLimits limits_;
  std::vector<DeviceSampleResult> results_;
};

struct Req {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  uint64_t seed = 0;
};

using Outputs = std::map<std::string, std::vector<std::vector<int32_t>>>;
using Logprobs = std::map<std::string, std::vector<float>>;

void drive(Executor& exec, const std::vector<Req>& reqs, Outputs& tokens, Logprobs& lps) {
  CoreConfig cfg = small_core_config();
  EngineCore core(cfg, exec);
  ASSERT_TRUE(core.initialize().ok());
  auto link = std::make_shared<EngineLink>();
  uint64_t key = 1;
  for (const Req& r : reqs) {
    auto req = std::make_unique<RequestState>();
    req->key = key++;
    req->id = r.id;
    req->params = r.params;
    req->seed = r.seed;
    req->sink = std::make_shared<RequestSink>(r.id, r.params, static_cast<int>(r.prompt.size()),
                                              std::span<const int32_t>(), nullptr, link);
    tokens[r.id].resize(r.params.n);
    core.add_request(std::move(req), r.prompt);
  }
  std::vector<SeqEvent> events;
  for (int step = 0; step < 10000 && core.has_work(); ++step) {
    events.clear();
    ASSERT_TRUE(core.step(events).ok());
    for (const SeqEvent& e : events) {
      if (e.token >= 0) tokens[e.sink->id][e.index].push_back(e.token);
      if (e.logprobs) {
        lps[e.sink->id].push_back(e.logprobs->logprob);
        for (const auto& [id, lp] : e.logprobs->top) lps[e.sink->id].push_back(static_cast<float>(id) + lp);
      }
      for (const LogprobData& d : e.prompt_logprobs) lps[e.sink->id + "/prompt"].push_back(d.logprob);
    }
  }
  EXPECT_FALSE(core.has_work());
}

std::vector<Req> mixed_requests() {
  std::mt19937 rng(9);
  std::vector<Req> out;
  for (int i = 0; i < 14; ++i) {
    Req r;
    r.id = "r" + std::to_string(i);
    r.prompt = random_prompt(rng, 3 + i * 3 % 17);
    r.params = greedy(6 + i % 5);
    r.seed = 100 + i;
    switch (i % 7) {
      case 1: r.params.temperature = 0.8f, r.params.top_k = 8; break;
      case 2: r.params.temperature = 1.0f, r.params.top_p = 0.7f, r.params.min_p = 0.05f; break;
      case 3: r.params.repetition_penalty = 1.4f, r.params.frequency_penalty = 0.5f; break;
      case 4: r.params.n = 3, r.params.temperature = 0.9f; break;
      case 5: r.params.min_tokens = 4, r.params.logit_bias = {{kFakeEos, 20.0f}}, r.params.logprobs = 3; break;
      case 6: r.params.prompt_logprobs = 2, r.params.presence_penalty = 1.0f; break;
      default: break;
    }
    out.push_back(r);
  }
  return out;
}

TEST(EngineCoreDeviceSampling, SameOutputsAsHostSampling) {
  const std::vector<Req> reqs = mixed_requests();
  FakeExecutor host;
  Outputs host_tokens;
  Logprobs host_lps;
  drive(host, reqs, host_tokens, host_lps);

  DeviceSamplingFake device({64, 4096, 16});
  Outputs dev_tokens;
  Logprobs dev_lps;
  drive(device, reqs, dev_tokens, dev_lps);
  EXPECT_EQ(dev_tokens, host_tokens);
  EXPECT_EQ(dev_lps, host_lps);
  EXPECT_GT(device.device_rows, 0);
  EXPECT_GT(device.steps_without_host_logits, 0) << "pure device steps should not copy logits";
}

TEST(EngineCoreDeviceSampling, OverTheLimitsFallsBackToTheHost) {
  const std::vector<Req> reqs = mixed_requests();
  FakeExecutor host;
  Outputs host_tokens;
  Logprobs host_lps;
  drive(host, reqs, host_tokens, host_lps);
  // Two rows, one scratch row, few edits per step: most rows go to the host.
  DeviceSamplingFake device({2, 8, 1});
  Outputs dev_tokens;
  Logprobs dev_lps;
  drive(device, reqs, dev_tokens, dev_lps);
  EXPECT_EQ(dev_tokens, host_tokens);
  EXPECT_EQ(dev_lps, host_lps);
  EXPECT_GT(device.device_rows, 0);
}

}  // namespace
}  // namespace osprey::testing
