#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "sampling/logits_processors.h"
#include "sampling/logprobs.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "sampling/stop_strings.h"

namespace osprey {
namespace {

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Processors, RepetitionPenaltyMatchesDefinition) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, -1.0f, 3.0f};
  std::vector<int32_t> prompt = {0, 1, 1}, output = {3};
  apply_repetition_penalty(l, prompt, output, 2.0f);
  EXPECT_FLOAT_EQ(l[0], 1.0f);   // positive: divided
  EXPECT_FLOAT_EQ(l[1], -4.0f);  // negative: multiplied, once despite repeats
  EXPECT_FLOAT_EQ(l[2], 1.0f);   // untouched
  EXPECT_FLOAT_EQ(l[3], -2.0f);
  EXPECT_FLOAT_EQ(l[4], 3.0f);
}

TEST(Processors, FrequencyPresenceOnOutputOnly) {
  std::vector<float> l(4, 1.0f);
  std::vector<int32_t> output = {1, 1, 1, 2};
  apply_frequency_presence(l, output, 0.5f, 0.25f);
  EXPECT_FLOAT_EQ(l[0], 1.0f);
  EXPECT_FLOAT_EQ(l[1], 1.0f - 3 * 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[2], 1.0f - 0.5f - 0.25f);
}

TEST(Processors, LogitBiasAndMask) {
  std::vector<float> l(4, 0.0f);
  apply_logit_bias(l, {{1, 5.0f}, {3, -2.0f}, {99, 1.0f}});
  EXPECT_FLOAT_EQ(l[1], 5.0f);
  EXPECT_FLOAT_EQ(l[3], -2.0f);
  const int32_t ids[] = {1};
  mask_tokens(l, ids);
  EXPECT_TRUE(std::isinf(l[1]) && l[1] < 0);
}

TEST(Processors, ArgmaxTiesGoToLowestId) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  EXPECT_EQ(argmax(l), 1);
}

// NaN never wins, wherever it sits: a NaN first entry (which used to seed
// every lane of the vectorised pass and hide the maximum), NaNs around the
// maximum in the 8-wide body and the tail, all NaN (0), all -inf (0).
TEST(Processors, ArgmaxSkipsNanAnywhere) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> l(21, 0.5f);
  l[0] = nan;
  l[13] = 7.0f;
  EXPECT_EQ(argmax(l), 13);
  l[13] = nan;
  l[20] = 6.0f;  // the tail past the last 8-wide group
  EXPECT_EQ(argmax(l), 20);
  std::vector<float> all_nan(19, nan), all_inf(19, -inf);
  EXPECT_EQ(argmax(all_nan), 0);
  EXPECT_EQ(argmax(all_inf), 0);
  all_inf[11] = -1.0f;
  EXPECT_EQ(argmax(all_inf), 11);
}

// Straightforward reference: softmax with temperature, min-p, then top-k,
// then top-p over the renormalised survivors.
std::map<int32_t, double> reference_dist(const std::vector<float>& l, float t, float min_p, int k, float p) {
  const int n = static_cast<int>(l.size());
  std::vector<double> prob(n);
  const double m = *std::max_element(l.begin(), l.end());
  double z = 0;
  for (int i = 0; i < n; ++i) z += prob[i] = std::exp((l[i] - m) / t);
  for (auto& x : prob) x /= z;
  const double pmax = *std::max_element(prob.begin(), prob.end());
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i)
    if (prob[i] >= min_p * pmax) ids.push_back(i);
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return prob[a] != prob[b] ? prob[a] > prob[b] : a < b; });
  if (k > 0 && k < static_cast<int>(ids.size())) ids.resize(k);
  double mass = 0;
  for (int32_t id : ids) mass += prob[id];
  std::map<int32_t, double> out;
  double before = 0;
  for (int32_t id : ids) {
    if (!out.empty() && before >= p * mass) break;
    out[id] = prob[id];
    before += prob[id];
  }
  double s = 0;
  for (auto& [id, x] : out) s += x;
  for (auto& [id, x] : out) x /= s;
  return out;
}

TEST(Processors, TruncationMatchesReference) {
  struct Case {
    float t, min_p;
    int k;
    float p;
  };
  for (Case c : {Case{1.0f, 0.0f, 0, 1.0f}, Case{0.7f, 0.0f, 5, 1.0f}, Case{1.3f, 0.0f, 0, 0.8f},
                 Case{1.0f, 0.1f, 0, 1.0f}, Case{0.9f, 0.05f, 10, 0.9f}, Case{2.0f, 0.0f, 1, 0.5f}}) {
    auto l = random_logits(50, 11);
    Candidates cand;
    truncate_distribution(l, c.t, c.min_p, c.k, c.p, cand);
    auto ref = reference_dist(l, c.t, c.min_p, c.k, c.p);
    ASSERT_EQ(cand.ids.size(), ref.size()) << c.t << " " << c.min_p << " " << c.k << " " << c.p;
    for (size_t i = 0; i < cand.ids.size(); ++i) {
      ASSERT_TRUE(ref.count(cand.ids[i]));
      EXPECT_NEAR(cand.weights[i] / cand.total, ref[cand.ids[i]], 1e-9);
    }
  }
}

TEST(Processors, DrawFollowsTheDistribution) {
  auto l = random_logits(8, 5);
  Candidates cand;
  truncate_distribution(l, 1.0f, 0.0f, 0, 1.0f, cand);
  std::vector<int> counts(8, 0);
  const int kDraws = 200000;
  for (int i = 0; i < kDraws; ++i) ++counts[draw(cand, sampling_uniform(1, 0, i))];
  for (size_t i = 0; i < cand.ids.size(); ++i)
    EXPECT_NEAR(counts[cand.ids[i]] / double(kDraws), cand.weights[i] / cand.total, 0.01);
}

TEST(Logprobs, SumToOneAndRank) {
  auto l = random_logits(100, 3);
  LogprobData d = compute_logprobs(l, 7, 100);
  double s = 0;
  for (auto& [id, lp] : d.top) s += std::exp(static_cast<double>(lp));
  EXPECT_NEAR(s, 1.0, 1e-5);
  int rank = 1;
  for (float x : l) rank += x > l[7];
  EXPECT_EQ(d.rank, rank);
  EXPECT_NEAR(d.logprob, l[7] - log_sum_exp(l), 1e-5);
  for (size_t i = 1; i < d.top.size(); ++i) EXPECT_GE(d.top[i - 1].second, d.top[i].second);
}

TEST(Sampler, SeededIsReproducibleAndIndependentStreams) {
  Sampler s(64);
  auto l = random_logits(64, 9);
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<int32_t> prompt = {1, 2, 3};
  auto run = [&](uint64_t seed, int index) {
    std::vector<int32_t> out;
    for (int pos = 0; pos < 30; ++pos) {
      SampleInput in;
      in.params = &p;
      in.prompt = prompt;
      in.seed = seed;
      in.seq_index = index;
      in.position = 3 + pos;
      out.push_back(s.sample(l.data(), in).token);
    }
    return out;
  };
  EXPECT_EQ(run(5, 0), run(5, 0));
  EXPECT_NE(run(5, 0), run(6, 0));
  EXPECT_NE(run(5, 0), run(5, 1));
}

TEST(Sampler, GreedyIgnoresSeedAndMinTokensMasksStops) {
  Sampler s(8);
  std::vector<float> l = {9.0f, 1.0f, 2.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.min_tokens = 2;
  const int32_t stops[] = {0};
  SampleInput in;
  in.params = &p;
  in.stop_ids = stops;
  EXPECT_EQ(s.sample(l.data(), in).token, 3);  // EOS (0) masked: no output yet
  std::vector<int32_t> out = {3, 3};
  in.output = out;
  EXPECT_EQ(s.sample(l.data(), in).token, 0);
  p.logprobs = 2;
  auto r = s.sample(l.data(), in);
  ASSERT_TRUE(r.logprobs);
  EXPECT_EQ(r.logprobs->rank, 1);
  EXPECT_EQ(r.logprobs->top.size(), 2u);
}

TEST(StopStrings, HoldsBackPossibleStartAndCutsAtMatch) {
  StopStringMatcher m({"STOP", "xy"}, false);
  auto r = m.append("abc S");
  EXPECT_EQ(r.emit, "abc ");  // "S" could start "STOP"
  r = m.append("T");
  EXPECT_EQ(r.emit, "");
  r = m.append("Oq");
  EXPECT_EQ(r.emit, "STOq");  // not a stop after all
  r = m.append("ST");
  EXPECT_EQ(r.emit, "");
  r = m.append("OP and more");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.stop, "STOP");
  EXPECT_EQ(r.emit, "");
}

TEST(StopStrings, IncludeStopAndFlush) {
  StopStringMatcher m({"end"}, true);
  auto r = m.append("the e");
  EXPECT_EQ(r.emit, "the ");
  r = m.append("nd.");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.emit, "end");
  StopStringMatcher f({"zz"}, false);
  EXPECT_EQ(f.append("abz").emit, "ab");
  EXPECT_EQ(f.flush(), "z");
}

TEST(StopStrings, EveryTokenSplitGivesTheSameResult) {
  const std::string text = "one two <|end|> three";
  for (size_t cut1 = 0; cut1 <= text.size(); ++cut1)
    for (size_t cut2 = cut1; cut2 <= text.size(); ++cut2) {
      StopStringMatcher m({"<|end|>"}, false);
      std::string out;
      bool matched = false;
      for (auto piece : {text.substr(0, cut1), text.substr(cut1, cut2 - cut1), text.substr(cut2)}) {
        if (matched) break;
        auto r = m.append(piece);
        out += r.emit;
        matched = r.matched;
        if (!matched) {
          EXPECT_EQ(out.find('<'), std::string::npos) << "partial stop leaked";
        }
      }
      EXPECT_TRUE(matched);
      EXPECT_EQ(out, "one two ");
    }
}

TEST(SamplingParams, ValidateNamesTheField) {
  SamplingParams p;
  EXPECT_TRUE(p.validate(100).ok());
  p.top_p = 0.0f;
  EXPECT_NE(p.validate(100).message().find("top_p"), std::string::npos);
  p = SamplingParams{};
  p.logit_bias[100] = 1.0f;
  EXPECT_NE(p.validate(100).message().find("logit_bias"), std::string::npos);
  p = SamplingParams{};
  p.min_tokens = 20;
  EXPECT_FALSE(p.validate(100).ok());
}

}  // namespace
}  // namespace osprey
