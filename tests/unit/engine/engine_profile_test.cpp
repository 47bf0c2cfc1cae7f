// EngineConfig::profile through the real engine on the CPU (the llama GGUF
// fixture): outputs (greedy and seeded sampling, with logprobs) equal those
// of an unprofiled engine token for token; Engine::profile() counts the
// steps of each phase and one call per step of the per-forward ops, every
// layer's ops once per layer; reset_profile() clears it; the ceilings were
// measured; an unprofiled engine reports nothing.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "osprey/engine.h"

namespace osprey {
namespace {

EngineConfig config(bool profile) {
  EngineConfig c;
  c.model_path = std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/gguf_llama/F32.gguf";
  c.num_threads = 1;
  c.kv_cache_bytes = int64_t{4} << 20;
  c.max_model_len = 128;
  c.max_num_seqs = 8;
  c.profile = profile;
  return c;
}

struct Outcome {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

void collect(RequestStream& s, Outcome& out) {
  while (auto o = s.next())
    for (const auto& c : o->outputs) {
      out.ids.insert(out.ids.end(), c.token_ids.begin(), c.token_ids.end());
      for (const auto& lp : c.logprobs) out.logprobs.push_back(lp.logprob);
    }
}

// Three prompts, the second sampled with a seed; submitted together (the
// batch composition depends on timing) or each after the previous finished.
std::vector<Outcome> run(Engine& e, bool together) {
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 13, 200, 7}, {42, 43}, {300, 1, 2, 3, 4, 5, 6, 7, 8}};
  std::vector<Outcome> out(prompts.size());
  std::vector<std::shared_ptr<RequestStream>> streams(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt_token_ids = prompts[i];
    r.params.max_tokens = 6;
    r.params.ignore_eos = true;
    r.params.logprobs = 2;
    r.params.temperature = i == 1 ? 0.8f : 0.0f;
    if (i == 1) r.params.seed = 1234;
    auto s = e.submit(r);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return {};
    streams[i] = *s;
    if (!together) collect(*streams[i], out[i]);
  }
  if (together)
    for (size_t i = 0; i < prompts.size(); ++i) collect(*streams[i], out[i]);
  return out;
}

TEST(EngineProfile, SameOutputsAndCountsPerPhase) {
  auto plain = Engine::create(config(false));
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  auto prof = Engine::create(config(true));
  ASSERT_TRUE(prof.ok()) << prof.status().to_string();
  // One at a time: the same steps, so bit-identical logprobs.
  const std::vector<Outcome> want = run(**plain, false), got = run(**prof, false);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_EQ(want.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].ids.size(), 6u) << i;
    EXPECT_EQ(got[i].ids, want[i].ids) << i;
    EXPECT_EQ(got[i].logprobs, want[i].logprobs) << i;
  }
  // Together: batches form by timing; greedy and seeded ids are batch-invariant.
  const std::vector<Outcome> got_together = run(**prof, true);
  ASSERT_EQ(got_together.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got_together[i].ids, want[i].ids) << i;
    ASSERT_EQ(got_together[i].logprobs.size(), want[i].logprobs.size());
    for (size_t k = 0; k < want[i].logprobs.size(); ++k)
      EXPECT_NEAR(got_together[i].logprobs[k], want[i].logprobs[k], 1e-4);
  }
  EXPECT_TRUE((*plain)->profile().entries.empty());

  const ProfileReport r = (*prof)->profile();
  EXPECT_GT(r.copy_gbs, 0.0);
  EXPECT_GT(r.gemm_tflops, 0.0);
  EXPECT_FALSE(r.gemm_shape.empty());
  EXPECT_GE(r.prefill_steps, 1);
  EXPECT_GE(r.decode_steps, 5);  // 6 tokens: the first from the prefill
  EXPECT_EQ(r.untimed_calls, 0);
  // phase -> group -> calls
  std::map<std::string, std::map<std::string, int64_t>> calls;
  std::map<std::string, int64_t> matmuls;
  for (const ProfileEntry& e : r.entries) {
    calls[e.phase][e.group] = e.calls;
    if (e.group.rfind("matmul ", 0) == 0) {
      matmuls[e.phase] += e.calls;
      EXPECT_GT(e.flops, 0.0);
    }
    EXPECT_GE(e.total_ms, 0.0);
    EXPECT_GT(e.bytes, 0.0) << e.group;
  }
  const int64_t L = 2;  // layers of the fixture
  for (const auto& [phase, steps] : {std::pair<std::string, int64_t>{"prefill", r.prefill_steps},
                                     std::pair<std::string, int64_t>{"decode", r.decode_steps}}) {
    auto& c = calls[phase];
    EXPECT_EQ(c["embedding"], steps) << phase;
    EXPECT_EQ(c["attention"], L * steps) << phase;
    EXPECT_EQ(c["add_rms_norm"], (2 * L - 1) * steps) << phase;
    EXPECT_EQ(c["silu_mul"], L * steps) << phase;
    const int64_t per_layer = c.count("qkv_rope_kv_write") ? 4 : 6;
    EXPECT_EQ(matmuls[phase], (per_layer * L + 1) * steps) << phase;
  }
  // Attention FLOPs come from the step's lengths: present in both phases.
  for (const ProfileEntry& e : r.entries)
    if (e.group == "attention") {
      EXPECT_GT(e.flops, 0.0) << e.phase;
    }
  (*prof)->reset_profile();
  const ProfileReport cleared = (*prof)->profile();
  EXPECT_TRUE(cleared.entries.empty());
  EXPECT_EQ(cleared.prefill_steps + cleared.decode_steps, 0);
  EXPECT_GT(cleared.copy_gbs, 0.0);  // the ceilings stay
}

}  // namespace
}  // namespace osprey
