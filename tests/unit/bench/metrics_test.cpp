// Metrics on synthetic timelines with hand-computed answers.
#include "bench/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace osprey::bench {
namespace {

// An ok request: sent at `send`, token chunks at `chunks`, ended at `end`.
RequestRecord ok_request(double send, std::vector<double> chunks, double end, int out, int in = 10) {
  RequestRecord r;
  r.send_s = send;
  r.chunk_s = std::move(chunks);
  r.first_token_s = r.chunk_s.empty() ? -1 : r.chunk_s.front();
  r.end_s = end;
  r.output_tokens = out;
  r.expected_output_tokens = out;
  r.prompt_tokens = in;
  r.usage_reported = true;
  return r;
}

TEST(Percentile, LinearInterpolationLikeNumpy) {
  const std::vector<double> x = {4, 1, 3, 2};  // sorted: 1 2 3 4
  // numpy.percentile([1,2,3,4], q): rank = q/100 * 3.
  EXPECT_DOUBLE_EQ(percentile(x, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(x, 50), 2.5);
  EXPECT_NEAR(percentile(x, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile(x, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(x, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{7}, 99), 7.0);
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{}, 50), 0.0);
  // 0..100: percentile p is exactly p.
  std::vector<double> h;
  for (int i = 100; i >= 0; --i) h.push_back(i);
  EXPECT_NEAR(percentile(h, 95), 95.0, 1e-12);
  EXPECT_NEAR(percentile(h, 37.5), 37.5, 1e-12);
}

TEST(Summarize, MeanStdMinMax) {
  const Distribution d = summarize({2, 4, 4, 4, 5, 5, 7, 9});
  EXPECT_EQ(d.count, 8);
  EXPECT_DOUBLE_EQ(d.mean, 5.0);
  EXPECT_DOUBLE_EQ(d.stddev, 2.0);  // population standard deviation
  EXPECT_DOUBLE_EQ(d.min, 2.0);
  EXPECT_DOUBLE_EQ(d.max, 9.0);
  EXPECT_DOUBLE_EQ(d.p50, 4.5);
}

TEST(Metrics, TtftTpotItlE2eOnATimeline) {
  // A: sent 0, tokens at 0.1, 0.2, 0.4, 0.5 -> TTFT 0.1, E2E 0.5, TPOT (0.5-0.1)/3, ITL 0.1 0.2 0.1
  // B: sent 1.0, tokens at 1.3, 1.4 -> TTFT 0.3, E2E 0.4 (end 1.4), TPOT 0.1, ITL 0.1
  std::vector<RequestRecord> rs = {ok_request(0.0, {0.1, 0.2, 0.4, 0.5}, 0.5, 4, 100),
                                   ok_request(1.0, {1.3, 1.4}, 1.4, 2, 50)};
  const RunMetrics m = compute_metrics(rs, Slo{});
  EXPECT_EQ(m.num_requests, 2);
  EXPECT_EQ(m.num_ok, 2);
  EXPECT_EQ(m.num_failed, 0);
  EXPECT_DOUBLE_EQ(m.duration_s, 1.4);
  EXPECT_EQ(m.total_input_tokens, 150);
  EXPECT_EQ(m.total_output_tokens, 6);
  EXPECT_NEAR(m.request_throughput, 2 / 1.4, 1e-12);
  EXPECT_NEAR(m.output_throughput, 6 / 1.4, 1e-12);
  EXPECT_NEAR(m.input_throughput, 150 / 1.4, 1e-12);
  EXPECT_NEAR(m.total_throughput, 156 / 1.4, 1e-12);
  EXPECT_NEAR(m.ttft_s.mean, 0.2, 1e-12);
  EXPECT_NEAR(m.ttft_s.max, 0.3, 1e-12);
  EXPECT_NEAR(m.e2e_s.mean, 0.45, 1e-12);
  EXPECT_NEAR(m.tpot_s.mean, (0.4 / 3 + 0.1) / 2, 1e-12);
  EXPECT_EQ(m.itl_s.count, 4);  // 3 gaps of A + 1 of B
  EXPECT_NEAR(m.itl_s.mean, (0.1 + 0.2 + 0.1 + 0.1) / 4, 1e-12);
  EXPECT_NEAR(m.itl_s.max, 0.2, 1e-12);
  EXPECT_NEAR(m.itl_s.p50, 0.1, 1e-12);
  EXPECT_FALSE(m.has_slo);
}

TEST(Metrics, SustainedThroughputCountsTokensWhileEveryStreamIsBusy) {
  // Two streams. A and B start at 0; C is sent when A ends (1.0: the window
  // opens), D when C ends, E (the last send, 3.0: the window closes) when B ends.
  std::vector<RequestRecord> rs = {
      ok_request(0.0, {0.5, 0.9}, 0.9, 2),
      ok_request(0.0, {0.5, 1.5, 2.5}, 2.5, 6),  // 2 tokens per chunk
      ok_request(1.0, {1.2, 1.8}, 1.9, 2),
      ok_request(2.0, {2.2, 2.9, 3.5}, 3.5, 3),
      ok_request(3.0, {3.2}, 3.2, 1),
  };
  const RunMetrics m = compute_metrics(rs, Slo{}, 2);
  EXPECT_DOUBLE_EQ(m.sustained_window_s, 2.0);
  // In [1, 3): B 1.5 and 2.5 (2 tokens each), C 1.2 and 1.8, D 2.2 and 2.9.
  EXPECT_NEAR(m.sustained_output_throughput, 8.0 / 2.0, 1e-12);
  EXPECT_NEAR(m.output_throughput, 14.0 / 3.5, 1e-12);  // the whole run, unchanged
  // Open loop, or no request beyond the streams: no window.
  EXPECT_EQ(compute_metrics(rs, Slo{}).sustained_window_s, 0.0);
  EXPECT_EQ(compute_metrics(rs, Slo{}, 5).sustained_output_throughput, 0.0);
  // A failed request's chunks do not count.
  rs[1].error = ErrorKind::kTimeout;
  EXPECT_NEAR(compute_metrics(rs, Slo{}, 2).sustained_output_throughput, 4.0 / 2.0, 1e-12);
}

TEST(Metrics, FailuresAreCountedByKindAndLeftOutOfLatencies) {
  std::vector<RequestRecord> rs = {ok_request(0.0, {0.1, 0.2}, 0.2, 2)};
  RequestRecord http;
  http.send_s = 0.5;
  http.end_s = 2.0;  // extends the duration
  http.error = ErrorKind::kHttpStatus;
  http.http_status = 503;
  RequestRecord disc = ok_request(0.0, {0.05}, 0.3, 1);
  disc.error = ErrorKind::kDisconnect;
  RequestRecord to;
  to.error = ErrorKind::kTimeout;
  rs.push_back(http);
  rs.push_back(disc);
  rs.push_back(to);
  const RunMetrics m = compute_metrics(rs, Slo{});
  EXPECT_EQ(m.num_ok, 1);
  EXPECT_EQ(m.num_failed, 3);
  EXPECT_EQ(m.errors.at("http_503"), 1);
  EXPECT_EQ(m.errors.at("disconnect"), 1);
  EXPECT_EQ(m.errors.at("timeout"), 1);
  EXPECT_DOUBLE_EQ(m.duration_s, 2.0);
  EXPECT_EQ(m.ttft_s.count, 1);
  EXPECT_NEAR(m.ttft_s.mean, 0.1, 1e-12);
  EXPECT_EQ(m.total_output_tokens, 2);
}

TEST(Metrics, OutputLengthMismatchIsReported) {
  RequestRecord r = ok_request(0, {0.1, 0.2}, 0.2, 2);
  r.expected_output_tokens = 3;
  EXPECT_EQ(compute_metrics(std::vector<RequestRecord>{r}, Slo{}).num_output_mismatch, 1);
}

TEST(Goodput, RequestsMeetingEverySlo) {
  // TTFTs 0.1, 0.3, 0.15; TPOTs 0.04, 0.04, 0.1 (3 tokens each).
  std::vector<RequestRecord> rs = {ok_request(0.0, {0.1, 0.14, 0.18}, 0.18, 3),
                                   ok_request(0.0, {0.3, 0.34, 0.38}, 0.38, 3),
                                   ok_request(0.0, {0.15, 0.25, 0.35}, 0.35, 3)};
  RequestRecord failed;
  failed.error = ErrorKind::kConnect;
  failed.end_s = 0.4;
  rs.push_back(failed);
  auto slo = parse_slo("ttft=200ms,tpot=50ms");
  ASSERT_TRUE(slo.ok());
  const RunMetrics m = compute_metrics(rs, *slo);
  EXPECT_TRUE(m.has_slo);
  EXPECT_EQ(m.num_good, 1);  // only the first meets both
  EXPECT_DOUBLE_EQ(m.duration_s, 0.4);
  EXPECT_NEAR(m.goodput, 1 / 0.4, 1e-12);
  EXPECT_NEAR(m.good_fraction, 0.25, 1e-12);
  // TTFT alone: the first and the third.
  EXPECT_EQ(compute_metrics(rs, *parse_slo("ttft=0.2s")).num_good, 2);
  // E2E alone.
  EXPECT_EQ(compute_metrics(rs, *parse_slo("e2e=360ms")).num_good, 2);
}

TEST(Slo, Parsing) {
  auto s = parse_slo("ttft=200ms, tpot=0.05s,e2el=1500");
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(*s->ttft_s, 0.2, 1e-12);
  EXPECT_NEAR(*s->tpot_s, 0.05, 1e-12);
  EXPECT_NEAR(*s->e2e_s, 1.5, 1e-12);
  EXPECT_TRUE(parse_slo("")->empty());
  EXPECT_NEAR(*parse_slo("tpot:250us")->tpot_s, 250e-6, 1e-15);
  EXPECT_FALSE(parse_slo("ttft").ok());
  EXPECT_FALSE(parse_slo("foo=1ms").ok());
  EXPECT_FALSE(parse_slo("ttft=abc").ok());
  EXPECT_FALSE(parse_slo("ttft=-3ms").ok());
  EXPECT_FALSE(parse_slo("ttft=5h").ok());
}

}  // namespace
}  // namespace osprey::bench
