#include "server/openai_format.h"

#include <gtest/gtest.h>

#include <cmath>

#include "server/metrics.h"

namespace osprey::server {
namespace {

using json = nlohmann::ordered_json;

ResponseMeta meta() {
  return {"chatcmpl-x", 1700000000, "m", "fp_test"};
}

TEST(Format, ChatResponseShape) {
  Usage u;
  u.prompt_tokens = 5;
  u.completion_tokens = 3;
  u.cached_tokens = 2;
  json choices = json::array({chat_choice(0, "hey", nullptr, FinishReason::kStop)});
  json r = chat_response(meta(), choices, u);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"], "chatcmpl-x");
  EXPECT_EQ(r["created"], 1700000000);
  EXPECT_EQ(r["system_fingerprint"], "fp_test");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
  EXPECT_EQ(r["usage"]["total_tokens"], 8);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

TEST(Format, ChunksAndSse) {
  json c = chat_chunk(meta(), 1, {{"content", "a"}}, nullptr, FinishReason::kNone, true);
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["index"], 1);
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "a");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
  json f = chat_chunk(meta(), 0, json::object(), nullptr, FinishReason::kLength, false);
  EXPECT_EQ(f["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(f.contains("usage"));
  json t = completion_chunk(meta(), 0, "x", nullptr, FinishReason::kNone, false);
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "x");
  Usage u;
  u.prompt_tokens = 1;
  json uc = usage_chunk(meta(), true, u);
  EXPECT_TRUE(uc["choices"].empty());
  EXPECT_EQ(uc["usage"]["total_tokens"], 1);
  const std::string e = sse_event(json{{"a", 1}});
  EXPECT_EQ(e, "data: {\"a\":1}\n\n");
  EXPECT_STREQ(kSseDone, "data: [DONE]\n\n");
}

TEST(Format, ChatLogprobs) {
  TokenLogprob t;
  t.token_id = 7;
  t.token = "h\xc3";  // a token ending in a partial code point
  t.logprob = -INFINITY;
  t.top = {{7, -0.25f, "hi"}};
  json j = chat_logprobs_json({t});
  ASSERT_EQ(j["content"].size(), 1u);
  EXPECT_EQ(j["content"][0]["logprob"], -9999.0);
  EXPECT_EQ(j["content"][0]["bytes"], json({104, 195}));
  EXPECT_EQ(j["content"][0]["top_logprobs"][0]["token"], "hi");
  EXPECT_DOUBLE_EQ(j["content"][0]["top_logprobs"][0]["logprob"].get<double>(), -0.25);
  // Dumping replaces the invalid byte instead of throwing.
  EXPECT_NO_THROW(sse_event(j));
}

TEST(Format, CompletionLogprobsOffsets) {
  TokenLogprob a, b;
  a.token = "ab";
  a.logprob = -1.0f;
  b.token = "c";
  b.logprob = -2.0f;
  b.top = {{1, -2.0f, "c"}, {2, -3.0f, "d"}};
  json out;
  size_t offset = 10;
  append_completion_logprobs(out, {a, b}, offset, true);
  EXPECT_EQ(out["tokens"], json({"ab", "c"}));
  EXPECT_EQ(out["text_offset"], json({10, 12}));
  EXPECT_TRUE(out["token_logprobs"][0].is_null());
  EXPECT_TRUE(out["top_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(out["token_logprobs"][1].get<double>(), -2.0);
  EXPECT_DOUBLE_EQ(out["top_logprobs"][1]["d"].get<double>(), -3.0);
  EXPECT_EQ(offset, 13u);
}

TEST(Metrics, PrometheusText) {
  ServerMetrics m("my\"model");
  m.count_http(200);
  m.count_http(200);
  m.count_http(400);
  m.observe_ttft(0.003);
  m.observe_prompt(10);
  m.observe_finished(FinishReason::kStop, 5, 1.0, 0.2);
  EngineStats s;
  s.num_running = 3;
  s.kv_usage = 0.25;
  s.prefix_hit_tokens = 7;
  ServerGauges g;
  g.ready = true;
  const std::string text = m.render(s, g);
  EXPECT_NE(text.find("osprey:num_requests_running{model_name=\"my\\\"model\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("osprey:kv_cache_usage_perc{model_name=\"my\\\"model\"} 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("osprey:prefix_cache_hits_total{model_name=\"my\\\"model\"} 7\n"), std::string::npos);
  EXPECT_NE(text.find("osprey:http_requests_total{code=\"200\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("osprey:http_requests_total{code=\"400\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("osprey:request_success_total{model_name=\"my\\\"model\",finished_reason=\"stop\"} 1\n"),
            std::string::npos);
  // 0.003 s falls in the 0.005 bucket and every later one, not in 0.001.
  EXPECT_NE(text.find("osprey:time_to_first_token_seconds_bucket{model_name=\"my\\\"model\",le=\"0.001\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("osprey:time_to_first_token_seconds_bucket{model_name=\"my\\\"model\",le=\"0.005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("osprey:time_to_first_token_seconds_bucket{model_name=\"my\\\"model\",le=\"+Inf\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("osprey:prompt_tokens_total{model_name=\"my\\\"model\"} 10\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE osprey:e2e_request_latency_seconds histogram\n"), std::string::npos);
  // TPOT: (1.0 - 0.2) / 4 = 0.2 s observed once.
  EXPECT_NE(text.find("osprey:request_time_per_output_token_seconds_count{model_name=\"my\\\"model\"} 1\n"),
            std::string::npos);
}

}  // namespace
}  // namespace osprey::server
