// PenaltyState (src/sampling/penalty_state.h): the incremental ids and counts
// of the repetition / presence / frequency penalties give exactly what the
// from-scratch computation gives (device edit lists and host-processed
// logits), over long random sequences folded in random chunks, with forks
// (a copied state diverging), and through the engine with n > 1 forks and
// preemption by recompute and by swap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "core_harness.h"
#include "sampling/device_sampling.h"
#include "sampling/logits_processors.h"
#include "sampling/penalty_state.h"

namespace osprey::testing {
namespace {

// The old way, written out independently: sorted distinct ids of prompt +
// output, and sorted (id, count) of the output.
std::vector<int32_t> scratch_rep(std::span<const int32_t> tokens) {
  std::vector<int32_t> v(tokens.begin(), tokens.end());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}
std::map<int32_t, int32_t> scratch_counts(std::span<const int32_t> output) {
  std::map<int32_t, int32_t> m;
  for (int32_t t : output) ++m[t];
  return m;
}

// A sequence under test: its tokens and state.
struct Track {
  std::vector<int32_t> tokens;
  int num_prompt = 0;
  PenaltyState state;
};

void expect_state_matches(const Track& t, const SamplingParams& p, int vocab, std::mt19937& rng,
                          const std::string& what) {
  ASSERT_EQ(t.state.num_folded(), static_cast<int>(t.tokens.size())) << what;
  const std::span<const int32_t> all(t.tokens);
  const std::span<const int32_t> prompt = all.first(static_cast<size_t>(t.num_prompt));
  const std::span<const int32_t> output = all.subspan(static_cast<size_t>(t.num_prompt));
  // The sections themselves.
  if (p.repetition_penalty != 1.0f) {
    const auto want = scratch_rep(all);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), t.state.rep_ids().begin(), t.state.rep_ids().end())) << what;
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    const auto want = scratch_counts(output);
    ASSERT_EQ(t.state.output_ids().size(), want.size()) << what;
    ASSERT_EQ(t.state.output_counts().size(), want.size()) << what;
    size_t i = 0;
    for (const auto& [id, c] : want) {
      EXPECT_EQ(t.state.output_ids()[i], id) << what;
      EXPECT_EQ(t.state.output_counts()[i], c) << what;
      ++i;
    }
  }
  // Device rows: identical edits to the span-based (sorting) builder.
  const std::vector<int32_t> stops = {0, 3};
  DeviceSampleRow a, b;
  DeviceSampleEdits ea, eb;
  make_device_sample_row(p, prompt, output, stops, 9, 1, static_cast<int64_t>(all.size()), a, ea);
  make_device_sample_row(p, t.state, static_cast<int>(output.size()), stops, 9, 1, static_cast<int64_t>(all.size()), b,
                         eb);
  EXPECT_EQ(ea.ids, eb.ids) << what;
  EXPECT_EQ(ea.vals, eb.vals) << what;
  EXPECT_EQ(a.num_bias, b.num_bias) << what;
  EXPECT_EQ(a.num_mask, b.num_mask) << what;
  EXPECT_EQ(a.num_rep, b.num_rep) << what;
  EXPECT_EQ(a.num_freq, b.num_freq) << what;
  // Host logits: bit-identical after both penalties.
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  std::vector<float> x(static_cast<size_t>(vocab));
  for (auto& v : x) v = d(rng);
  std::vector<float> y = x;
  apply_repetition_penalty(x, prompt, output, p.repetition_penalty);
  apply_frequency_presence(x, output, p.frequency_penalty, p.presence_penalty);
  apply_repetition_penalty(y, t.state, p.repetition_penalty);
  apply_frequency_presence(y, t.state, p.frequency_penalty, p.presence_penalty);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << what;
}

TEST(PenaltyState, RandomLongSequencesWithForksMatchFromScratch) {
  std::mt19937 rng(2024);
  const int vocab = 3000;
  for (int trial = 0; trial < 12; ++trial) {
    SamplingParams p;
    p.repetition_penalty = trial % 3 == 2 ? 1.0f : 1.3f;
    p.frequency_penalty = trial % 3 == 1 ? 0.0f : 0.4f;
    p.presence_penalty = trial % 2 ? 0.25f : 0.0f;
    if (trial % 4 == 3) p.repetition_penalty = 0.8f, p.frequency_penalty = -0.5f;
    p.min_tokens = 5;
    // Narrow id ranges repeat a lot; wide ones hardly at all.
    const int id_range = trial % 2 ? 50 : vocab;
    std::uniform_int_distribution<int> id(0, id_range - 1);
    std::vector<Track> tracks(1);
    tracks[0].num_prompt = 1 + static_cast<int>(rng() % 1500);
    for (int i = 0; i < tracks[0].num_prompt; ++i) tracks[0].tokens.push_back(id(rng));
    for (int step = 0; step < 120; ++step) {
      // A fork now and then: the copy diverges from here.
      if (rng() % 25 == 0 && tracks.size() < 4) {
        Track copy = tracks[rng() % tracks.size()];
        tracks.push_back(std::move(copy));
      }
      for (size_t k = 0; k < tracks.size(); ++k) {
        Track& t = tracks[k];
        // One new token mostly; sometimes a chunk (folded at once).
        const int add = rng() % 10 == 0 ? 1 + static_cast<int>(rng() % 40) : 1;
        for (int i = 0; i < add; ++i) t.tokens.push_back(id(rng));
        t.state.sync(p, t.tokens, t.num_prompt);
        expect_state_matches(
            t, p, vocab, rng,
            "trial " + std::to_string(trial) + " step " + std::to_string(step) + " track " + std::to_string(k));
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(PenaltyState, FoldsNothingTwiceAndPromptOnlyHasNoCounts) {
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  p.presence_penalty = 0.5f;
  PenaltyState s;
  std::vector<int32_t> tokens = {5, 3, 5, 9};
  s.sync(p, tokens, 4);
  EXPECT_EQ(s.num_folded(), 4);
  EXPECT_EQ(std::vector<int32_t>(s.rep_ids().begin(), s.rep_ids().end()), (std::vector<int32_t>{3, 5, 9}));
  EXPECT_TRUE(s.output_ids().empty());
  s.sync(p, tokens, 4);  // nothing new
  EXPECT_EQ(s.rep_ids().size(), 3u);
  tokens.push_back(9);
  tokens.push_back(1);
  tokens.push_back(9);
  s.sync(p, tokens, 4);
  EXPECT_EQ(std::vector<int32_t>(s.rep_ids().begin(), s.rep_ids().end()), (std::vector<int32_t>{1, 3, 5, 9}));
  EXPECT_EQ(std::vector<int32_t>(s.output_ids().begin(), s.output_ids().end()), (std::vector<int32_t>{1, 9}));
  EXPECT_EQ(std::vector<int32_t>(s.output_counts().begin(), s.output_counts().end()), (std::vector<int32_t>{1, 2}));
}

// Through the engine: requests with penalties (n > 1 forks among them) in a
// pool small enough to preempt, by recompute and by swap, against
// reference_generate (the sampler's from-scratch path).
void add_penalty_requests(CoreHarness& h) {
  std::mt19937 rng(77);
  for (int i = 0; i < 7; ++i) {
    SamplingParams p;
    p.max_tokens = 24;
    p.ignore_eos = true;
    switch (i % 4) {
      case 0:
        p.temperature = 0.0f, p.repetition_penalty = 1.4f;
        break;
      case 1:
        p.temperature = 0.8f, p.frequency_penalty = 0.6f, p.presence_penalty = 0.3f;
        break;
      case 2:
        p.temperature = 0.9f, p.repetition_penalty = 1.2f, p.frequency_penalty = 0.5f, p.n = 3;
        break;
      case 3:
        p.temperature = 0.0f, p.presence_penalty = 1.5f, p.n = 2;
        break;
    }
    h.add("r" + std::to_string(i), random_prompt(rng, 6 + i), p, 0, 500 + i);
  }
}

TEST(PenaltyState, EngineWithForksAndPreemptionMatchesReference) {
  for (int swap_blocks : {0, 64}) {
    CoreConfig c = small_core_config();
    c.num_blocks = 16;
    c.num_swap_blocks = swap_blocks;
    CoreHarness h(c);
    add_penalty_requests(h);
    h.run(20000);
    EXPECT_GT(h.core().scheduler().num_preemptions(), 0) << "swap blocks " << swap_blocks;
    if (swap_blocks > 0) {
      EXPECT_GT(h.core().scheduler().num_swap_outs(), 0);
    }
    h.expect_matches_reference();
    h.expect_pool_free();
  }
}

}  // namespace
}  // namespace osprey::testing
