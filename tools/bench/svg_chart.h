// A small SVG line-chart writer for benchmark reports: latency CDFs and
// throughput / tail latency against load. Self-contained SVG 1.1 text.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace osprey::bench {

struct ChartSeries {
  std::string name;
  std::vector<double> x, y;  // same length; drawn in order
};

struct ChartSpec {
  std::string title, x_label, y_label;
  bool log_x = false;                   // log10 x axis (x values must be > 0; others are dropped)
  std::vector<std::string> x_category;  // non-empty: x values are indices 0..n-1 labelled with these
  int width = 720, height = 440;
};

std::string render_line_chart(const ChartSpec& spec, const std::vector<ChartSeries>& series);

// Empirical CDF of samples as (value, fraction <= value) points, at most
// max_points of them (evenly spaced in rank), sorted by value.
std::pair<std::vector<double>, std::vector<double>> cdf_points(std::vector<double> samples, size_t max_points = 400);

// Escapes &, <, >, " for SVG text.
std::string svg_escape(const std::string& s);

}  // namespace osprey::bench
