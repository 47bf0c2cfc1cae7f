#include "bench/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace osprey::bench {

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

std::string tick_label(double v) {
  char b[32];
  if (v != 0 && std::fabs(v) >= 1e6)
    std::snprintf(b, sizeof b, "%.4gM", v / 1e6);
  else if (v != 0 && std::fabs(v) >= 1e4)
    std::snprintf(b, sizeof b, "%.4gk", v / 1e3);
  else if (v != 0 && std::fabs(v) < 1e-2)
    std::snprintf(b, sizeof b, "%.1e", v);
  else
    std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

// "Nice" linear ticks covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 6) {
  std::vector<double> t;
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (raw <= step) break;
  }
  // From the last tick at or below lo to the first at or above hi, so that
  // every value lies inside the axis.
  const double first = std::floor(lo / step) * step, last = std::ceil(hi / step - 1e-9) * step;
  for (double v = first; v <= last + step * 1e-9; v += step) t.push_back(v);
  return t;
}

}  // namespace

std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::pair<std::vector<double>, std::vector<double>> cdf_points(std::vector<double> v, size_t max_points) {
  std::pair<std::vector<double>, std::vector<double>> out;
  if (v.empty() || max_points < 2) return out;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const size_t k = std::min(n, max_points);
  for (size_t i = 0; i < k; ++i) {
    const size_t idx = k == 1 ? n - 1 : i * (n - 1) / (k - 1);
    out.first.push_back(v[idx]);
    out.second.push_back(static_cast<double>(idx + 1) / static_cast<double>(n));
  }
  return out;
}

std::string render_line_chart(const ChartSpec& spec, const std::vector<ChartSeries>& series) {
  const double W = spec.width, H = spec.height;
  const double left = 70, right = 170, top = 40, bottom = 55;
  const double pw = W - left - right, ph = H - top - bottom;
  const bool cat = !spec.x_category.empty();
  auto tx = [&](double x) { return spec.log_x ? std::log10(x) : x; };
  auto usable = [&](double x, double y) { return std::isfinite(x) && std::isfinite(y) && (!spec.log_x || x > 0); };
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = 0, y1 = -x0;
  for (const auto& s : series)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!usable(s.x[i], s.y[i])) continue;
      x0 = std::min(x0, tx(s.x[i]));
      x1 = std::max(x1, tx(s.x[i]));
      y1 = std::max(y1, s.y[i]);
      y0 = std::min(y0, s.y[i]);
    }
  if (cat) {
    x0 = -0.5;
    x1 = static_cast<double>(spec.x_category.size()) - 0.5;
  }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1;
  if (!std::isfinite(y1)) y1 = 1;
  if (x1 <= x0) x1 = x0 + 1;
  const auto yt = nice_ticks(y0, y1 > y0 ? y1 : y0 + 1);
  y0 = yt.front();
  y1 = yt.back();
  if (y1 <= y0) y1 = y0 + 1;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };

  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + svg_escape(spec.title) +
       "</text>\n";
  // Grid and y ticks.
  for (double v : yt) {
    s += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + pw) + "\" y1=\"" + num(py(v)) + "\" y2=\"" + num(py(v)) +
         "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + num(left - 6) + "\" y=\"" + num(py(v) + 4) + "\" text-anchor=\"end\">" + tick_label(v) +
         "</text>\n";
  }
  // x ticks.
  std::vector<std::pair<double, std::string>> xt;
  if (cat) {
    for (size_t i = 0; i < spec.x_category.size(); ++i) xt.emplace_back(static_cast<double>(i), spec.x_category[i]);
  } else if (spec.log_x) {
    for (double e = std::floor(x0); e <= std::ceil(x1); e += 1) xt.emplace_back(e, tick_label(std::pow(10.0, e)));
    if (xt.size() > 1) {
      x0 = std::min(x0, xt.front().first);
      x1 = std::max(x1, xt.back().first);
    }
  } else {
    for (double v : nice_ticks(x0, x1)) xt.emplace_back(v, tick_label(v));
    x0 = std::min(x0, xt.front().first);
    x1 = std::max(x1, xt.back().first);
  }
  for (const auto& [v, label] : xt) {
    s += "<line x1=\"" + num(px(v)) + "\" x2=\"" + num(px(v)) + "\" y1=\"" + num(top) + "\" y2=\"" + num(top + ph) +
         "\" stroke=\"#eee\"/>\n";
    s += "<text x=\"" + num(px(v)) + "\" y=\"" + num(top + ph + 16) + "\" text-anchor=\"middle\">" +
         svg_escape(label) + "</text>\n";
  }
  s += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
       "\" fill=\"none\" stroke=\"black\"/>\n";
  s += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(H - 12) + "\" text-anchor=\"middle\">" +
       svg_escape(spec.x_label) + "</text>\n";
  s += "<text transform=\"translate(16," + num(top + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       svg_escape(spec.y_label) + "</text>\n";
  // Series and legend.
  for (size_t k = 0; k < series.size(); ++k) {
    const auto& se = series[k];
    const char* color = kColors[k % (sizeof kColors / sizeof kColors[0])];
    std::string pts;
    for (size_t i = 0; i < std::min(se.x.size(), se.y.size()); ++i) {
      if (!usable(se.x[i], se.y[i])) continue;
      pts += num(px(tx(se.x[i]))) + "," + num(py(se.y[i])) + " ";
    }
    if (!pts.empty()) {
      s += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
      if (cat || se.x.size() <= 32) {
        for (size_t i = 0; i < std::min(se.x.size(), se.y.size()); ++i)
          if (usable(se.x[i], se.y[i]))
            s += "<circle cx=\"" + num(px(tx(se.x[i]))) + "\" cy=\"" + num(py(se.y[i])) + "\" r=\"3\" fill=\"" +
                 color + "\"/>\n";
      }
    }
    const double ly = top + 10 + 18 * static_cast<double>(k);
    s += "<line x1=\"" + num(left + pw + 12) + "\" x2=\"" + num(left + pw + 32) + "\" y1=\"" + num(ly) + "\" y2=\"" +
         num(ly) + "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    s += "<text x=\"" + num(left + pw + 36) + "\" y=\"" + num(ly + 4) + "\">" + svg_escape(se.name) + "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

}  // namespace osprey::bench
