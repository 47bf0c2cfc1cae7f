// EngineCore + Scheduler + KvManager over the fake executor: outputs must
// equal the unbatched, unpaged reference under every scheduling condition.
#include <gtest/gtest.h>

#include <random>

#include "core_harness.h"

namespace osprey::testing {
namespace {

TEST(EngineCore, SingleGreedyRequestMatchesReference) {
  CoreHarness h(small_core_config());
  std::mt19937 rng(1);
  h.add("a", random_prompt(rng, 10), greedy(20));
  h.run();
  h.expect_matches_reference();
  h.expect_pool_free();
}

TEST(EngineCore, BatchMatchesReferenceAndRespectsBudget) {
  CoreConfig c = small_core_config();
  CoreHarness h(c);
  std::mt19937 rng(2);
  for (int i = 0; i < 20; ++i) {
    SamplingParams p = greedy(1 + static_cast<int>(rng() % 30));
    p.ignore_eos = (i % 3 == 0);
    h.add("r" + std::to_string(i), random_prompt(rng, 1 + static_cast<int>(rng() % 50)), p);
  }
  h.run();
  h.expect_matches_reference();
  h.expect_pool_free();
  EXPECT_EQ(h.max_step_tokens(), c.scheduler.max_num_batched_tokens);  // chunked prefill fills the budget
}

TEST(EngineCore, ChunkedPrefillSplitsLongPrompt) {
  CoreConfig c = small_core_config();
  c.scheduler.max_num_batched_tokens = 8;
  c.num_blocks = 128;
  CoreHarness h(c);
  std::mt19937 rng(3);
  h.add("long", random_prompt(rng, 100), greedy(5));
  ASSERT_TRUE(h.step().ok());
  EXPECT_EQ(h.core().last_schedule().num_tokens, 8);
  EXPECT_FALSE(h.core().last_schedule().seqs[0].sample);
  h.run();
  EXPECT_GE(h.num_steps(), 100 / 8 + 4);
  h.expect_matches_reference();
  h.expect_pool_free();
}

TEST(EngineCore, ChunkedPrefillOffSchedulesWholePrompts) {
  CoreConfig c = small_core_config();
  c.scheduler.enable_chunked_prefill = false;
  c.scheduler.max_num_batched_tokens = 40;
  CoreHarness h(c);
  std::mt19937 rng(4);
  for (int i = 0; i < 6; ++i) h.add("r" + std::to_string(i), random_prompt(rng, 30), greedy(6));
  while (h.core().has_work()) {
    ASSERT_TRUE(h.step().ok());
    for (const auto& ss : h.core().last_schedule().seqs)
      EXPECT_TRUE(ss.num_new == 1 || ss.num_new == 30) << ss.num_new;
  }
  h.expect_matches_reference();
  h.expect_pool_free();
}

TEST(EngineCore, PrefixCacheHitReusesPagesAndKeepsOutput) {
  CoreConfig c = small_core_config();
  CoreHarness h(c);
  std::mt19937 rng(5);
  auto prompt = random_prompt(rng, 21);
  h.add("first", prompt, greedy(8));
  h.run();
  auto second = prompt;
  second.push_back(9);
  h.add("second", second, greedy(8));
  h.add("same", prompt, greedy(8));
  h.run();
  h.expect_matches_reference();
  // 21 tokens: 5 full blocks of 4 are cached after the first request.
  EXPECT_EQ(h.core().kv().stats().hit_tokens, 20 + 20);
  h.expect_pool_free();
}

TEST(EngineCore, PrefixCachingOffGivesSameOutputs) {
  CoreConfig on = small_core_config(), off = small_core_config();
  off.enable_prefix_caching = false;
  std::mt19937 rng(6);
  auto shared = random_prompt(rng, 17);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    auto p = shared;
    auto tail = random_prompt(rng, 1 + i);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  CoreHarness a(on), b(off);
  for (int i = 0; i < 8; ++i) {
    a.add("r" + std::to_string(i), prompts[i], greedy(10));
    b.add("r" + std::to_string(i), prompts[i], greedy(10));
  }
  a.run();
  b.run();
  a.expect_matches_reference();
  b.expect_matches_reference();
  EXPECT_GT(a.core().kv().stats().hit_tokens, 0);
  EXPECT_EQ(b.core().kv().stats().hit_tokens, 0);
}

TEST(EngineCore, PreemptionResumesWithIdenticalOutput) {
  CoreConfig c = small_core_config();
  c.num_blocks = 12;  // 48 tokens for 6 requests that want up to 35 each
  CoreHarness h(c);
  std::mt19937 rng(7);
  for (int i = 0; i < 6; ++i) {
    SamplingParams p = greedy(25);
    p.ignore_eos = true;
    h.add("r" + std::to_string(i), random_prompt(rng, 10), p);
  }
  h.run();
  EXPECT_GT(h.core().scheduler().num_preemptions(), 0);
  h.expect_matches_reference();
  h.expect_pool_free();
}

TEST(EngineCore, SeededSamplingSurvivesPreemptionAndBatching) {
  CoreConfig c = small_core_config();
  c.num_blocks = 14;
  CoreHarness h(c);
  std::mt19937 rng(8);
  for (int i = 0; i < 6; ++i) {
    SamplingParams p;
    p.temperature = 0.9f;
    p.top_k = 20;
    p.top_p = 0.9f;
    p.max_tokens = 20;
    p.ignore_eos = true;
    h.add("r" + std::to_string(i), random_prompt(rng, 9), p, 0, 1000 + i);
  }
  h.run();
  EXPECT_GT(h.core().scheduler().num_preemptions(), 0);
  h.expect_matches_reference();
}

TEST(EngineCore, LoneSequenceThatOutgrowsPoolFinishesWithLength) {
  CoreConfig c = small_core_config();
  c.num_blocks = 4;  // 16 tokens
  CoreHarness h(c);
  std::mt19937 rng(9);
  SamplingParams p = greedy(100);
  p.ignore_eos = true;
  h.add("big", random_prompt(rng, 6), p);
  h.run();
  auto& r = h.results()["big"][0];
  EXPECT_EQ(r.finish, FinishReason::kLength);
  // The pool holds positions 0..15; the token sampled from position 15 is the last.
  EXPECT_EQ(r.tokens.size(), 16u - 6u + 1u);
  h.expect_pool_free();
}

TEST(EngineCore, ForkSharesPromptPagesAndCopiesPartialPage) {
  CoreConfig c = small_core_config();
  c.enable_prefix_caching = false;
  CoreHarness h(c);
  std::mt19937 rng(10);
  SamplingParams p;
  p.n = 4;
  p.temperature = 1.0f;
  p.max_tokens = 12;
  p.ignore_eos = true;
  h.add("n4", random_prompt(rng, 10), p, 0, 99);  // 10 = 2 full pages + a partial one
  ASSERT_TRUE(h.step().ok());                      // the prompt, then the fork
  EXPECT_EQ(h.core().scheduler().num_running(), 4);
  // 3 pages shared by 4 sequences.
  EXPECT_EQ(h.core().kv().num_free_blocks(), c.num_blocks - 3);
  ASSERT_TRUE(h.step().ok());
  // Three writers copied the shared partial page; the last writer kept it.
  EXPECT_EQ(h.exec().num_copies, 3);
  EXPECT_EQ(h.core().kv().num_free_blocks(), c.num_blocks - 6);
  h.run();
  h.expect_matches_reference();
  auto& seqs = h.results()["n4"];
  EXPECT_NE(seqs[0].tokens, seqs[1].tokens);
  h.expect_pool_free();
}

TEST(EngineCore, PriorityAdmitsBeforeArrivalOrder) {
  CoreConfig c = small_core_config();
  c.scheduler.max_num_seqs = 1;
  CoreHarness h(c);
  std::mt19937 rng(11);
  h.add("low", random_prompt(rng, 5), greedy(3), 5);
  h.add("high", random_prompt(rng, 5), greedy(3), -1);
  ASSERT_TRUE(h.step().ok());
  ASSERT_EQ(h.core().last_schedule().seqs.size(), 1u);
  EXPECT_EQ(h.core().last_schedule().seqs[0].seq->req->id, "high");
  h.run();
  h.expect_matches_reference();
}

TEST(EngineCore, PreemptsLowestPriorityNewest) {
  CoreConfig c = small_core_config();
  c.num_blocks = 9;
  CoreHarness h(c);
  std::mt19937 rng(12);
  SamplingParams p = greedy(25);  // 29 tokens: fits the 36-token pool alone
  p.ignore_eos = true;
  h.add("a", random_prompt(rng, 4), p, 0);
  h.add("b", random_prompt(rng, 4), p, 1);  // lower priority (larger value)
  h.add("c", random_prompt(rng, 4), p, 0);
  std::string first_victim;
  while (h.core().has_work() && first_victim.empty()) {
    ASSERT_TRUE(h.step().ok());
    if (!h.core().last_schedule().preempted.empty())
      first_victim = h.core().last_schedule().preempted[0]->req->id;
  }
  EXPECT_EQ(first_victim, "b");
  h.run();
  h.expect_matches_reference();
  h.expect_pool_free();
}

TEST(EngineCore, CancellationAtEveryStage) {
  CoreConfig c = small_core_config();
  c.scheduler.max_num_batched_tokens = 8;
  c.scheduler.max_num_seqs = 2;
  CoreHarness h(c);
  std::mt19937 rng(13);
  SamplingParams p = greedy(30);
  p.ignore_eos = true;
  h.add("decoding", random_prompt(rng, 3), p);
  h.add("prefilling", random_prompt(rng, 40), p);
  h.add("waiting", random_prompt(rng, 5), p);
  SamplingParams pn = p;
  pn.n = 3;
  h.add("waiting_n", random_prompt(rng, 5), pn);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.step().ok());
  ASSERT_FALSE(h.results()["decoding"][0].tokens.empty());
  ASSERT_TRUE(h.results()["prefilling"][0].tokens.empty());
  h.abort("decoding");
  h.abort("prefilling");
  h.abort("waiting");
  h.abort("waiting_n");
  for (const char* id : {"decoding", "prefilling", "waiting"}) {
    EXPECT_EQ(h.results()[id][0].finish, FinishReason::kAbort) << id;
  }
  for (auto& s : h.results()["waiting_n"]) EXPECT_EQ(s.finish, FinishReason::kAbort);
  EXPECT_FALSE(h.core().has_work());
  h.expect_pool_free();
  // Cancelling again, or something unknown, is harmless.
  std::vector<SeqEvent> ev;
  EXPECT_FALSE(h.core().abort_request(1, ev));  // "decoding" had key 1
  EXPECT_TRUE(ev.empty());
}

TEST(EngineCore, MinTokensSuppressesEosAndStopIds) {
  CoreHarness h(small_core_config());
  std::mt19937 rng(14);
  for (int i = 0; i < 10; ++i) {
    SamplingParams p = greedy(12);
    p.min_tokens = 6;
    p.stop_token_ids = {5, 7, 11, 13, 17, 19, 23, 29, 31};
    h.add("r" + std::to_string(i), random_prompt(rng, 6), p);
  }
  h.run();
  h.expect_matches_reference();
  for (auto& [id, seqs] : h.results()) EXPECT_GE(seqs[0].tokens.size(), 6u) << id;
}

TEST(EngineCore, PromptLogprobsAreComputedForEveryPromptToken) {
  CoreConfig c = small_core_config();
  c.scheduler.max_prompt_logprob_rows = 5;  // forces several chunks
  CoreHarness h(c);
  std::mt19937 rng(15);
  auto prompt = random_prompt(rng, 23);
  SamplingParams p = greedy(3);
  p.prompt_logprobs = 2;
  p.logprobs = 3;
  h.add("lp", prompt, p);
  h.run();
  auto& plp = h.prompt_logprobs()["lp"];
  ASSERT_EQ(plp.size(), prompt.size() - 1);
  std::vector<float> logits(kFakeVocab);
  for (size_t j = 1; j < prompt.size(); ++j) {
    std::vector<int32_t> hist(prompt.begin(), prompt.begin() + j);
    fake_logits(hist, logits.data());
    LogprobData want = compute_logprobs(logits, prompt[j], 2);
    EXPECT_EQ(plp[j - 1].token_id, prompt[j]);
    EXPECT_FLOAT_EQ(plp[j - 1].logprob, want.logprob);
    EXPECT_EQ(plp[j - 1].top.size(), 2u);
  }
  auto& r = h.results()["lp"][0];
  ASSERT_EQ(r.logprobs.size(), r.tokens.size());
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    EXPECT_EQ(r.logprobs[i].rank, 1);  // greedy picks the top raw logit (no penalties)
    EXPECT_EQ(r.logprobs[i].top.size(), 3u);
    EXPECT_EQ(r.logprobs[i].top[0].first, r.tokens[i]);
  }
  h.expect_matches_reference();
}

TEST(EngineCore, ExecutorFailureFinishesEverythingWithError) {
  CoreHarness h(small_core_config());
  std::mt19937 rng(16);
  h.add("a", random_prompt(rng, 5), greedy(10));
  h.add("b", random_prompt(rng, 5), greedy(10));
  ASSERT_TRUE(h.step().ok());
  h.exec().fail_next = true;
  EXPECT_FALSE(h.step().ok());
  EXPECT_EQ(h.results()["a"][0].finish, FinishReason::kError);
  EXPECT_EQ(h.results()["b"][0].finish, FinishReason::kError);
  h.expect_pool_free();
}

// Thousands of requests with random lengths, n, priorities and
// cancellations through a small pool: every surviving sequence equals its
// reference, no invariant breaks, and no page leaks.
TEST(EngineCore, RandomizedStressNoLeaks) {
  CoreConfig c = small_core_config();
  c.num_blocks = 48;
  c.scheduler.max_num_seqs = 16;
  c.scheduler.max_num_batched_tokens = 24;
  c.max_model_len = 64;
  CoreHarness h(c);
  std::mt19937 rng(17);
  // A few shared prefixes so that the prefix cache is exercised.
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back(random_prompt(rng, 4 + 4 * i));
  int submitted = 0;
  std::vector<std::string> live;
  const int kRequests = 2000;
  while (submitted < kRequests || h.core().has_work()) {
    const int arrivals = submitted < kRequests ? static_cast<int>(rng() % 4) : 0;
    for (int a = 0; a < arrivals; ++a) {
      std::vector<int32_t> prompt;
      if (rng() % 2) prompt = prefixes[rng() % prefixes.size()];
      auto tail = random_prompt(rng, 1 + static_cast<int>(rng() % 20));
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      SamplingParams p;
      p.temperature = (rng() % 2) ? 0.0f : 0.8f;
      p.max_tokens = 1 + static_cast<int>(rng() % 16);
      p.n = (rng() % 8 == 0) ? 2 + static_cast<int>(rng() % 3) : 1;
      p.ignore_eos = rng() % 4 == 0;
      const std::string id = "s" + std::to_string(submitted++);
      h.add(id, prompt, p, static_cast<int>(rng() % 3), rng());
      live.push_back(id);
    }
    if (!live.empty() && rng() % 10 == 0) h.abort(live[rng() % live.size()]);
    if (h.core().has_work()) {
      ASSERT_TRUE(h.step().ok());
    }
  }
  h.expect_matches_reference();
  h.expect_pool_free();
  EXPECT_GT(h.core().scheduler().num_preemptions(), 0);
  EXPECT_GT(h.core().kv().stats().hit_tokens, 0);
  int aborted = 0;
  for (auto& [id, seqs] : h.results())
    for (auto& s : seqs) {
      EXPECT_NE(s.finish, FinishReason::kNone) << id;
      aborted += s.finish == FinishReason::kAbort;
    }
  EXPECT_GT(aborted, 0);
}

}  // namespace
}  // namespace osprey::testing
