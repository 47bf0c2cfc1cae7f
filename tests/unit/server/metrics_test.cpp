// ServerMetrics: every metric of issue 5 item 5 is exposed under its osprey:*
// name, and the new counters and histograms count what they should.
#include <gtest/gtest.h>

#include <string>

#include "server/metrics.h"

namespace osprey::server {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(Metrics, EveryRequiredMetricIsExposed) {
  ServerMetrics m("m");
  const std::string text = m.render(EngineStats{}, ServerGauges{});
  // name -> Prometheus type, as documented in docs/server.md.
  const std::pair<const char*, const char*> required[] = {
      {"osprey:num_requests_running", "gauge"},
      {"osprey:num_requests_waiting", "gauge"},
      {"osprey:num_preemptions_total", "counter"},
      {"osprey:num_swap_outs_total", "counter"},
      {"osprey:cpu_cache_usage_perc", "gauge"},
      {"osprey:kv_cache_usage_perc", "gauge"},
      {"osprey:prefix_cache_queries_total", "counter"},
      {"osprey:prefix_cache_hits_total", "counter"},
      {"osprey:prompt_tokens_total", "counter"},
      {"osprey:generation_tokens_total", "counter"},
      {"osprey:time_to_first_token_seconds", "histogram"},
      {"osprey:inter_token_latency_seconds", "histogram"},
      {"osprey:request_time_per_output_token_seconds", "histogram"},
      {"osprey:e2e_request_latency_seconds", "histogram"},
      {"osprey:request_queue_time_seconds", "histogram"},
      {"osprey:request_prompt_tokens", "histogram"},
      {"osprey:request_generation_tokens", "histogram"},
      {"osprey:request_success_total", "counter"},
      {"osprey:http_requests_total", "counter"},
      {"osprey:http_errors_total", "counter"},
  };
  for (const auto& [name, type] : required)
    EXPECT_TRUE(has_line(text, std::string("# TYPE ") + name + " " + type)) << name << "\n" << text;
  // Histograms render even when empty.
  EXPECT_TRUE(has_line(text, "osprey:request_queue_time_seconds_count{model_name=\"m\"} 0")) << text;
}

TEST(Metrics, SwapUsage) {
  ServerMetrics m("m");
  EngineStats s;
  s.num_swap_blocks = 8;
  s.num_free_swap_blocks = 6;
  s.num_swap_outs = 3;
  const std::string text = m.render(s, ServerGauges{});
  EXPECT_TRUE(has_line(text, "osprey:cpu_cache_usage_perc{model_name=\"m\"} 0.25")) << text;
  EXPECT_TRUE(has_line(text, "osprey:num_swap_outs_total{model_name=\"m\"} 3")) << text;
}

TEST(Metrics, QueueTimePromptAndErrors) {
  ServerMetrics m("m");
  m.observe_queue_time(0.4);
  m.observe_queue_time(3.0);
  EXPECT_EQ(m.queue_time_count(), 2u);
  // A prompt is counted once per engine request, not once per choice.
  m.observe_prompt(7);
  m.observe_finished(FinishReason::kLength, 3, 1.0, 0.1);
  m.observe_finished(FinishReason::kAbort, 2, 1.0, 0.1);
  m.observe_finished(FinishReason::kAbort, 0, 1.0, -1.0);
  m.count_http(200);
  m.count_http(413);
  m.count_http(413);
  m.count_http(503);
  const std::string text = m.render(EngineStats{}, ServerGauges{});
  EXPECT_TRUE(has_line(text, "osprey:request_queue_time_seconds_bucket{model_name=\"m\",le=\"0.3\"} 0")) << text;
  EXPECT_TRUE(has_line(text, "osprey:request_queue_time_seconds_bucket{model_name=\"m\",le=\"0.5\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "osprey:request_queue_time_seconds_bucket{model_name=\"m\",le=\"5\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "osprey:request_queue_time_seconds_sum{model_name=\"m\"} 3.4")) << text;
  EXPECT_TRUE(has_line(text, "osprey:prompt_tokens_total{model_name=\"m\"} 7")) << text;
  EXPECT_TRUE(has_line(text, "osprey:request_prompt_tokens_count{model_name=\"m\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "osprey:generation_tokens_total{model_name=\"m\"} 5")) << text;
  EXPECT_TRUE(has_line(text, "osprey:request_generation_tokens_count{model_name=\"m\"} 3")) << text;
  EXPECT_TRUE(has_line(text, "osprey:request_success_total{model_name=\"m\",finished_reason=\"abort\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "osprey:request_success_total{model_name=\"m\",finished_reason=\"length\"} 1")) << text;
  // TPOT only for sequences with at least 2 tokens: (1.0 - 0.1) / 2 and (1.0 - 0.1) / 1.
  EXPECT_TRUE(has_line(text, "osprey:request_time_per_output_token_seconds_count{model_name=\"m\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "osprey:http_errors_total{code=\"413\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "osprey:http_errors_total{code=\"503\"} 1")) << text;
  EXPECT_EQ(text.find("osprey:http_errors_total{code=\"200\"}"), std::string::npos) << text;
  EXPECT_TRUE(has_line(text, "osprey:http_requests_total{code=\"200\"} 1")) << text;
}

}  // namespace
}  // namespace osprey::server
