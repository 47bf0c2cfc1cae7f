// Scheduler policies over the fake executor: priority aging (no starvation)
// and swap-to-host preemption (identical output, slots returned).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core_harness.h"

namespace osprey::testing {
namespace {

SamplingParams fixed_len(int max_tokens) {
  SamplingParams p = greedy(max_tokens);
  p.ignore_eos = true;
  return p;
}

std::unique_ptr<CoreHarness> load_harness(int aging_steps) {
  CoreConfig c = small_core_config();
  c.scheduler.max_num_seqs = 1;
  c.scheduler.aging_steps = aging_steps;
  return std::make_unique<CoreHarness>(c);
}

// Runs `steps` steps, one sequence at a time, with a new priority-0 request
// arriving every step (more arrivals than the engine can serve) and a
// priority-10 request that arrived first. Returns the step (1-based) at which
// "low" finished, or 0 if it did not finish under the load.
int low_finish_step_under_load(CoreHarness& h, int steps) {
  std::mt19937 rng(21);
  h.add("low", random_prompt(rng, 5), fixed_len(3), 10);
  int finished_at = 0;
  for (int s = 0; s < steps; ++s) {
    h.add("high" + std::to_string(s), random_prompt(rng, 5), fixed_len(3), 0);
    EXPECT_TRUE(h.step().ok());
    if (s == 0) {
      // Arriving together, priorities still decide.
      EXPECT_EQ(h.core().last_schedule().seqs.at(0).seq->req->id, "high0");
    }
    if (!finished_at && h.results()["low"][0].finish != FinishReason::kNone) finished_at = s + 1;
  }
  return finished_at;
}

TEST(Scheduler, AgingLowPriorityFinishesUnderContinuousHighPriorityLoad) {
  constexpr int kAging = 8, kSteps = 400;
  auto h = load_harness(kAging);
  const int at = low_finish_step_under_load(*h, kSteps);
  ASSERT_GT(at, 0) << "low-priority request starved";
  // It overtakes every high-priority request arriving after step
  // (10 - 0) * kAging = 80; those before it take 3 steps each (one at a time).
  EXPECT_LE(at, (10 * kAging + 1) * 3 + 3);
  // The load was real: high-priority requests were still waiting.
  EXPECT_GT(h->core().scheduler().num_waiting(), 50);
  h->run();
  h->expect_matches_reference();
  h->expect_pool_free();
}

TEST(Scheduler, WithoutAgingStrictPrioritiesStarve) {
  // The property the aging test relies on is real: without aging the same
  // load starves the low-priority request.
  auto h = load_harness(0);
  EXPECT_EQ(low_finish_step_under_load(*h, 400), 0);
  h->run();
  h->expect_matches_reference();
}

// Runs to the end; the ids in the order their first tokens came (one
// sequence runs at a time, so each step produces at most one first token).
std::vector<std::string> first_token_order(CoreHarness& h, const std::vector<std::string>& ids) {
  std::vector<std::string> order;
  while (h.core().has_work()) {
    EXPECT_TRUE(h.step().ok());
    for (const auto& id : ids)
      if (!h.results()[id][0].tokens.empty() && std::find(order.begin(), order.end(), id) == order.end())
        order.push_back(id);
  }
  return order;
}

TEST(Scheduler, AgingKeepsPriorityOrderForSimultaneousArrivals) {
  CoreConfig c = small_core_config();
  c.scheduler.max_num_seqs = 1;
  c.scheduler.aging_steps = 4;
  CoreHarness h(c);
  std::mt19937 rng(22);
  // Age the clock first, so that ranks include a nonzero arrival step.
  h.add("warm", random_prompt(rng, 5), fixed_len(6));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(h.step().ok());
  h.add("p2", random_prompt(rng, 5), fixed_len(1), 2);
  h.add("p0", random_prompt(rng, 5), fixed_len(1), 0);
  h.add("p1", random_prompt(rng, 5), fixed_len(1), 1);
  EXPECT_EQ(first_token_order(h, {"p0", "p1", "p2"}), (std::vector<std::string>{"p0", "p1", "p2"}));
  h.expect_matches_reference();
}

TEST(Scheduler, AgedRequestIsOrderedBeforeLaterHigherPriority) {
  CoreConfig c = small_core_config();
  c.scheduler.max_num_seqs = 1;
  c.scheduler.aging_steps = 2;
  CoreHarness h(c);
  std::mt19937 rng(23);
  h.add("busy", random_prompt(rng, 5), fixed_len(10));
  ASSERT_TRUE(h.step().ok());                                 // step 1: busy runs
  h.add("old_low", random_prompt(rng, 5), fixed_len(1), 2);   // rank 2*2 + 1 = 5
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(h.step().ok());     // 5 steps later
  h.add("new_high", random_prompt(rng, 5), fixed_len(1), 0);  // rank 0 + 6 = 6
  h.add("newer_high", random_prompt(rng, 5), fixed_len(1), -1);  // rank -2 + 6 = 4
  EXPECT_EQ(first_token_order(h, {"old_low", "new_high", "newer_high"}),
            (std::vector<std::string>{"newer_high", "old_low", "new_high"}));
}

// --- swap ---

void add_mixed_requests(CoreHarness& h) {
  std::mt19937 rng(31);
  for (int i = 0; i < 6; ++i) h.add("g" + std::to_string(i), random_prompt(rng, 10), fixed_len(25));
  for (int i = 0; i < 3; ++i) {
    SamplingParams p;
    p.temperature = 0.9f;
    p.top_k = 20;
    p.max_tokens = 20;
    p.ignore_eos = true;
    h.add("s" + std::to_string(i), random_prompt(rng, 9), p, 0, 1000 + i);
  }
  SamplingParams pn = fixed_len(15);
  pn.n = 2;
  pn.temperature = 1.0f;
  h.add("n2", random_prompt(rng, 7), pn, 1, 77);
}

CoreConfig swap_config(int num_blocks, int num_swap_blocks) {
  CoreConfig c = small_core_config();
  c.num_blocks = num_blocks;
  c.num_swap_blocks = num_swap_blocks;
  return c;
}

std::map<std::string, std::vector<std::vector<int32_t>>> tokens_of(CoreHarness& h) {
  std::map<std::string, std::vector<std::vector<int32_t>>> out;
  for (auto& [id, seqs] : h.results())
    for (auto& s : seqs) out[id].push_back(s.tokens);
  return out;
}

TEST(SwapPreemption, OutputIdenticalWithSwapRecomputeAndNoPreemption) {
  CoreHarness roomy(swap_config(256, 0));
  CoreHarness recompute(swap_config(14, 0));
  CoreHarness swap(swap_config(14, 64));
  CoreHarness swap_small(swap_config(14, 5));  // full at times: falls back to recompute
  for (CoreHarness* h : {&roomy, &recompute, &swap, &swap_small}) {
    add_mixed_requests(*h);
    h->run();
    h->expect_matches_reference();
    h->expect_pool_free();
    EXPECT_EQ(h->core().kv().num_free_swap_blocks(), h->core().kv().num_swap_blocks());
  }
  EXPECT_EQ(roomy.core().scheduler().num_preemptions(), 0);
  EXPECT_GT(recompute.core().scheduler().num_preemptions(), 0);
  EXPECT_EQ(recompute.core().scheduler().num_swap_outs(), 0);
  // Every preemption swapped when there was room.
  EXPECT_GT(swap.core().scheduler().num_swap_outs(), 0);
  EXPECT_EQ(swap.core().scheduler().num_swap_outs(), swap.core().scheduler().num_preemptions());
  EXPECT_GT(swap.exec().num_swap_out_pages, 0);
  EXPECT_EQ(swap.exec().num_swap_in_pages, swap.exec().num_swap_out_pages);
  EXPECT_EQ(swap.core().kv().stats().swap_ins, swap.core().kv().stats().swap_outs);
  // Swapping resumes without recomputing: fewer prompt positions computed.
  EXPECT_LT(swap.core().stats().num_prompt_tokens, recompute.core().stats().num_prompt_tokens);
  // A small swap space mixes both.
  EXPECT_GT(swap_small.core().scheduler().num_swap_outs(), 0);
  EXPECT_LT(swap_small.core().scheduler().num_swap_outs(), swap_small.core().scheduler().num_preemptions());

  const auto ref = tokens_of(roomy);
  EXPECT_EQ(tokens_of(recompute), ref);
  EXPECT_EQ(tokens_of(swap), ref);
  EXPECT_EQ(tokens_of(swap_small), ref);
}

TEST(SwapPreemption, WithoutPrefixCachingAndChunkingStillIdentical) {
  CoreConfig c = swap_config(14, 64);
  c.enable_prefix_caching = false;
  c.scheduler.enable_chunked_prefill = false;
  CoreHarness h(c);
  add_mixed_requests(h);
  h.run();
  EXPECT_GT(h.core().scheduler().num_swap_outs(), 0);
  h.expect_matches_reference();
  h.expect_pool_free();
  EXPECT_EQ(h.core().kv().num_free_swap_blocks(), 64);
}

TEST(SwapPreemption, AbortWhileSwappedReturnsHostSlots) {
  CoreHarness h(swap_config(12, 64));
  std::mt19937 rng(32);
  for (int i = 0; i < 6; ++i) h.add("r" + std::to_string(i), random_prompt(rng, 10), fixed_len(25));
  std::string victim;
  for (int s = 0; s < 200 && victim.empty(); ++s) {
    ASSERT_TRUE(h.step().ok());
    for (Sequence* seq : h.core().scheduler().waiting())
      if (seq->swapped()) victim = seq->req->id;
  }
  ASSERT_FALSE(victim.empty());
  const int free_before = h.core().kv().num_free_swap_blocks();
  EXPECT_LT(free_before, 64);
  h.abort(victim);
  EXPECT_GT(h.core().kv().num_free_swap_blocks(), free_before);
  EXPECT_EQ(h.results()[victim][0].finish, FinishReason::kAbort);
  h.run();
  h.expect_matches_reference();
  h.expect_pool_free();
  EXPECT_EQ(h.core().kv().num_free_swap_blocks(), 64);
}

// Random arrivals, n, priorities and cancellations through a small pool with
// a small swap space: outputs equal the reference, nothing leaks.
TEST(SwapPreemption, RandomizedStressNoLeaks) {
  CoreConfig c = small_core_config();
  c.num_blocks = 40;
  c.num_swap_blocks = 12;
  c.scheduler.max_num_seqs = 16;
  c.scheduler.max_num_batched_tokens = 24;
  c.scheduler.aging_steps = 16;
  c.max_model_len = 64;
  CoreHarness h(c);
  std::mt19937 rng(33);
  int submitted = 0;
  std::vector<std::string> live;
  const int kRequests = 600;
  while (submitted < kRequests || h.core().has_work()) {
    const int arrivals = submitted < kRequests ? static_cast<int>(rng() % 4) : 0;
    for (int a = 0; a < arrivals; ++a) {
      SamplingParams p;
      p.temperature = (rng() % 2) ? 0.0f : 0.8f;
      p.max_tokens = 1 + static_cast<int>(rng() % 16);
      p.n = (rng() % 8 == 0) ? 2 + static_cast<int>(rng() % 3) : 1;
      p.ignore_eos = rng() % 4 == 0;
      const std::string id = "s" + std::to_string(submitted++);
      h.add(id, random_prompt(rng, 1 + static_cast<int>(rng() % 30)), p, static_cast<int>(rng() % 3), rng());
      live.push_back(id);
    }
    if (!live.empty() && rng() % 10 == 0) h.abort(live[rng() % live.size()]);
    if (h.core().has_work()) {
      ASSERT_TRUE(h.step().ok());
    }
  }
  h.expect_matches_reference();
  h.expect_pool_free();
  EXPECT_GT(h.core().scheduler().num_swap_outs(), 0);
  EXPECT_GT(h.core().scheduler().num_preemptions(), h.core().scheduler().num_swap_outs());
  EXPECT_EQ(h.core().kv().num_free_swap_blocks(), c.num_swap_blocks);
}

}  // namespace
}  // namespace osprey::testing
