// Reports: JSON keys, CSV rows, SVG charts.
#include "bench/report.h"

#include <gtest/gtest.h>

#include "bench/svg_chart.h"

namespace osprey::bench {
namespace {

RunMetrics sample_metrics() {
  RequestRecord r;
  r.send_s = 0;
  r.chunk_s = {0.1, 0.3};
  r.first_token_s = 0.1;
  r.end_s = 0.3;
  r.output_tokens = 2;
  r.prompt_tokens = 5;
  return compute_metrics(std::vector<RequestRecord>{r}, *parse_slo("ttft=200ms"));
}

TEST(Report, JsonKeysInMilliseconds) {
  const auto j = metrics_to_json(sample_metrics());
  EXPECT_EQ(j["completed"], 1);
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(j["p99_itl_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["mean_e2el_ms"].get<double>(), 300, 1e-9);
  EXPECT_EQ(j["good_requests"], 1);
  EXPECT_NEAR(j["output_throughput"].get<double>(), 2 / 0.3, 1e-9);
}

TEST(Report, CsvOneRowPerRun) {
  const auto m = sample_metrics();
  const std::string csv = metrics_csv({"request_rate", "max_concurrency"}, {{"inf", "0"}, {"2", "8"}}, {m, m});
  size_t lines = 0;
  for (char c : csv) lines += c == '\n';
  EXPECT_EQ(lines, 3u);
  EXPECT_EQ(csv.rfind("request_rate,max_concurrency,num_requests,", 0), 0u);
  EXPECT_NE(csv.find("\n2,8,1,1,0,"), std::string::npos) << csv;
  // Same number of fields in every line.
  std::vector<size_t> commas;
  size_t n = 0;
  for (char c : csv) {
    if (c == ',') ++n;
    if (c == '\n') commas.push_back(n), n = 0;
  }
  EXPECT_EQ(commas[0], commas[1]);
  EXPECT_EQ(commas[1], commas[2]);
  // The last column: the all-streams-busy rate, empty without a window.
  EXPECT_NE(csv.find(",sustained_output_throughput\n"), std::string::npos);
  auto m2 = m;
  m2.sustained_window_s = 2.0;
  m2.sustained_output_throughput = 1234.25;
  const std::string csv2 = metrics_csv({"k"}, {{"a"}}, {m2});
  EXPECT_NE(csv2.find(",1234\n"), std::string::npos) << csv2;  // %.4g
}

TEST(Svg, CdfPointsAndChart) {
  auto [x, y] = cdf_points({3, 1, 2, 4}, 400);
  EXPECT_EQ(x, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(y, (std::vector<double>{0.25, 0.5, 0.75, 1.0}));
  std::vector<double> many(10000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<double>(i);
  auto [mx, my] = cdf_points(many, 100);
  EXPECT_EQ(mx.size(), 100u);
  EXPECT_EQ(mx.back(), 9999);
  EXPECT_EQ(my.back(), 1.0);
  ChartSpec spec;
  spec.title = "TTFT <CDF> & more";
  spec.x_label = "ms";
  spec.y_label = "fraction";
  const std::string svg = render_line_chart(spec, {{"rate=1", {1, 2, 3}, {0.3, 0.6, 1.0}}, {"empty", {}, {}}});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("TTFT &lt;CDF&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  spec.x_category = {"1", "2", "inf"};
  const std::string cat = render_line_chart(spec, {{"tok/s", {0, 1, 2}, {10, 20, 25}}});
  EXPECT_NE(cat.find(">inf</text>"), std::string::npos);
  EXPECT_EQ(cat.find("nan"), std::string::npos);
  // Nothing to draw still gives a valid document.
  EXPECT_NE(render_line_chart(spec, {}).find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace osprey::bench
