// The pure part of `osprey perplexity` (tools/perplexity.h): windows,
// statistics, paired comparison and the --save file, against values worked
// out by hand. The whole command runs against transformers in
// tests/cli/perplexity_cli_test.py.
#include "perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

namespace osprey::cli {
namespace {

TEST(Perplexity, WindowsTakeThePrefixAndWholeSlicesOnly) {
  auto p = plan_perplexity(23, 8, -1, {99}, 0);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->stride, 7);
  EXPECT_EQ(p->num_windows, 3);  // 21 of the 23 tokens; the last 2 make no whole window
  EXPECT_EQ(p->score_from, 4);
  std::vector<int32_t> ids(23);
  std::iota(ids.begin(), ids.end(), 0);
  EXPECT_EQ(window_tokens(*p, ids, 0), (std::vector<int32_t>{99, 0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(window_tokens(*p, ids, 2), (std::vector<int32_t>{99, 14, 15, 16, 17, 18, 19, 20}));

  auto capped = plan_perplexity(23, 8, 6, {}, 2);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->stride, 8);
  EXPECT_EQ(capped->num_windows, 2);
  EXPECT_EQ(capped->score_from, 6);
  EXPECT_EQ(window_tokens(*capped, ids, 1), (std::vector<int32_t>{8, 9, 10, 11, 12, 13, 14, 15}));
}

TEST(Perplexity, DefaultScoreFromIsHalfButAfterThePrefix) {
  EXPECT_EQ(plan_perplexity(10, 2, -1, {}, 0)->score_from, 1);
  EXPECT_EQ(plan_perplexity(100, 5, -1, {7, 8, 9}, 0)->score_from, 3);  // 5 / 2 = 2 < |prefix|
  EXPECT_EQ(plan_perplexity(1000, 512, -1, {1}, 0)->score_from, 256);
}

TEST(Perplexity, BadPlansAreRefusedWithReasons) {
  EXPECT_FALSE(plan_perplexity(100, 1, -1, {}, 0).ok());        // ctx < 2
  EXPECT_FALSE(plan_perplexity(100, 3, -1, {1, 2, 3}, 0).ok());  // prefix fills the window
  EXPECT_FALSE(plan_perplexity(100, 8, 0, {}, 0).ok());          // position 0 has no context
  EXPECT_FALSE(plan_perplexity(100, 8, 1, {5, 6}, 0).ok());      // inside the prefix
  EXPECT_FALSE(plan_perplexity(100, 8, 8, {}, 0).ok());          // past the window
  auto short_text = plan_perplexity(6, 8, -1, {}, 0);
  ASSERT_FALSE(short_text.ok());
  EXPECT_NE(short_text.status().message().find("fewer than one window"), std::string::npos);
  EXPECT_TRUE(plan_perplexity(8, 8, -1, {}, 0).ok());
}

TEST(Perplexity, StatisticsByHand) {
  // nll 1, 2, 3, 6: mean 3, sample variance (4 + 1 + 0 + 9) / 3 = 14 / 3.
  const std::vector<ScoredToken> t = {{5, 1.0, 5}, {6, 2.0, 1}, {7, 3.0, 7}, {8, 6.0, 2}};
  const PerplexityStats s = summarize(t);
  EXPECT_EQ(s.count, 4);
  EXPECT_DOUBLE_EQ(s.mean_nll, 3.0);
  EXPECT_NEAR(s.stderr_nll, std::sqrt(14.0 / 3.0 / 4.0), 1e-12);
  EXPECT_NEAR(s.ppl, std::exp(3.0), 1e-9);
  EXPECT_NEAR(s.ppl_err, std::exp(3.0) * s.stderr_nll, 1e-9);
  EXPECT_DOUBLE_EQ(s.top1, 0.5);
  const PerplexityStats one = summarize(std::vector<ScoredToken>{{1, 0.5, 1}});
  EXPECT_DOUBLE_EQ(one.stderr_nll, 0.0);
  EXPECT_EQ(summarize({}).count, 0);
}

TEST(Perplexity, PairedComparison) {
  const std::vector<ScoredToken> base = {{5, 1.0, 5}, {6, 2.0, 1}, {7, 3.0, 7}};
  const std::vector<ScoredToken> run = {{5, 1.5, 5}, {6, 1.5, 6}, {7, 4.0, 7}};
  auto c = compare(run, base);
  ASSERT_TRUE(c.ok());
  // differences +0.5, -0.5, +1.0: mean 1/3, |d| mean 2/3.
  EXPECT_NEAR(c->mean_dnll, 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(c->ppl_ratio, std::exp(1.0 / 3.0), 1e-12);
  EXPECT_NEAR(c->mean_abs_dnll, 2.0 / 3.0, 1e-12);
  const double var = ((0.5 - 1.0 / 3) * (0.5 - 1.0 / 3) + (-0.5 - 1.0 / 3) * (-0.5 - 1.0 / 3) +
                      (1.0 - 1.0 / 3) * (1.0 - 1.0 / 3)) / 2.0;
  EXPECT_NEAR(c->stderr_dnll, std::sqrt(var / 3.0), 1e-12);
  EXPECT_NEAR(c->same_top1, 2.0 / 3.0, 1e-12);
  auto self = compare(base, base);
  ASSERT_TRUE(self.ok());
  EXPECT_DOUBLE_EQ(self->ppl_ratio, 1.0);
  EXPECT_DOUBLE_EQ(self->same_top1, 1.0);

  EXPECT_FALSE(compare(std::span(run).first(2), base).ok());  // different counts
  std::vector<ScoredToken> other = run;
  other[1].token = 9;
  auto bad = compare(other, base);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("scored token 1"), std::string::npos);
  EXPECT_FALSE(compare({}, {}).ok());
}

TEST(Perplexity, SavedScoresRoundTrip) {
  PerplexityPlan p;
  p.ctx = 8;
  p.score_from = 4;
  p.prefix = {1};
  p.stride = 7;
  p.num_windows = 1;
  const std::vector<ScoredToken> t = {{5, 1.25, 5}, {6, 0.1 + 0.2, 1}, {7, 3e-9, 7}, {8, -1e-7, 2}};
  auto back = scores_from_json(scores_to_json(p, t));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ((*back)[i].token, t[i].token);
    EXPECT_EQ((*back)[i].nll, t[i].nll);  // doubles written to round-trip exactly
    EXPECT_EQ((*back)[i].top1, t[i].top1);
  }
}

TEST(Perplexity, MalformedSavedScoresAreRefused) {
  for (const char* bad : {
           "",
           "[]",
           "{\"format\": \"something-else\", \"token\": [], \"nll\": [], \"top1\": []}",
           "{\"format\": \"osprey-perplexity-1\", \"token\": [1], \"nll\": [0.5]}",
           "{\"format\": \"osprey-perplexity-1\", \"token\": [1, 2], \"nll\": [0.5], \"top1\": [1]}",
           "{\"format\": \"osprey-perplexity-1\", \"token\": [-1], \"nll\": [0.5], \"top1\": [1]}",
           "{\"format\": \"osprey-perplexity-1\", \"token\": [4294967296], \"nll\": [0.5], \"top1\": [1]}",
           "{\"format\": \"osprey-perplexity-1\", \"token\": [1.5], \"nll\": [0.5], \"top1\": [1]}",
           "{\"format\": \"osprey-perplexity-1\", \"token\": [1], \"nll\": [\"x\"], \"top1\": [1]}",
           "{\"format\": \"osprey-perplexity-1\", \"token\": [1], \"nll\": [0.5], \"top1\": [null]}",
           "{\"format\": \"osprey-perplexity-1\", \"token\": {}, \"nll\": [], \"top1\": []}",
           "{\"format\": \"osprey-perplexity-1\", \"token\": [1], \"nll\": [1e999], \"top1\": [1]}",
       }) {
    auto r = scores_from_json(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << bad;
    }
  }
}

}  // namespace
}  // namespace osprey::cli
