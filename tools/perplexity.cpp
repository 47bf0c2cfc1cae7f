#include "perplexity.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>

namespace osprey::cli {

namespace {

constexpr const char* kFormat = "osprey-perplexity-1";

// Mean and standard error of the mean of xs (0 error for fewer than 2).
void mean_and_stderr(std::span<const double> xs, double& mean, double& err) {
  mean = 0;
  err = 0;
  if (xs.empty()) return;
  double sum = 0;
  for (double x : xs) sum += x;
  mean = sum / static_cast<double>(xs.size());
  if (xs.size() < 2) return;
  double sq = 0;
  for (double x : xs) sq += (x - mean) * (x - mean);
  const double var = sq / static_cast<double>(xs.size() - 1);
  err = std::sqrt(var / static_cast<double>(xs.size()));
}

}  // namespace

Expected<PerplexityPlan> plan_perplexity(size_t num_text_tokens, int ctx, int score_from, std::vector<int32_t> prefix,
                                         int max_windows) {
  PerplexityPlan p;
  const int np = static_cast<int>(prefix.size());
  if (ctx < 2 || ctx <= np) {
    return invalid_argument("--ctx " + std::to_string(ctx) + " leaves no text tokens in a window (" +
                            std::to_string(np) + " prefix tokens; at least 2 tokens a window)");
  }
  const int first_allowed = std::max(1, np);
  if (score_from < 0) score_from = std::max(first_allowed, ctx / 2);
  if (score_from < first_allowed || score_from >= ctx) {
    return invalid_argument("--score-from must be in [" + std::to_string(first_allowed) + ", " +
                            std::to_string(ctx - 1) + "] for --ctx " + std::to_string(ctx) + ", got " +
                            std::to_string(score_from));
  }
  p.ctx = ctx;
  p.score_from = score_from;
  p.prefix = std::move(prefix);
  p.stride = ctx - np;
  const size_t whole = num_text_tokens / static_cast<size_t>(p.stride);
  if (whole == 0) {
    return invalid_argument("the text has " + std::to_string(num_text_tokens) +
                            " tokens, fewer than one window of " + std::to_string(p.stride) +
                            " (lower --ctx or give a longer text)");
  }
  size_t n = whole;
  if (max_windows > 0) n = std::min(n, static_cast<size_t>(max_windows));
  p.num_windows = static_cast<int>(std::min<size_t>(n, 1u << 30));
  return p;
}

std::vector<int32_t> window_tokens(const PerplexityPlan& plan, std::span<const int32_t> text_ids, int w) {
  std::vector<int32_t> out(plan.prefix);
  const size_t begin = static_cast<size_t>(w) * static_cast<size_t>(plan.stride);
  const auto slice = text_ids.subspan(begin, static_cast<size_t>(plan.stride));
  out.insert(out.end(), slice.begin(), slice.end());
  return out;
}

PerplexityStats summarize(std::span<const ScoredToken> tokens) {
  PerplexityStats s;
  s.count = static_cast<int64_t>(tokens.size());
  if (tokens.empty()) return s;
  std::vector<double> nll;
  nll.reserve(tokens.size());
  int64_t hits = 0;
  for (const ScoredToken& t : tokens) {
    nll.push_back(t.nll);
    if (t.top1 == t.token) ++hits;
  }
  mean_and_stderr(nll, s.mean_nll, s.stderr_nll);
  s.ppl = std::exp(s.mean_nll);
  s.ppl_err = s.ppl * s.stderr_nll;
  s.top1 = static_cast<double>(hits) / static_cast<double>(s.count);
  return s;
}

Expected<PerplexityComparison> compare(std::span<const ScoredToken> run, std::span<const ScoredToken> base) {
  if (run.size() != base.size()) {
    return invalid_argument("the runs scored different numbers of tokens (" + std::to_string(run.size()) + " vs " +
                            std::to_string(base.size()) + "): compare runs of the same text, --ctx and --score-from");
  }
  if (run.empty()) return invalid_argument("no scored tokens to compare");
  PerplexityComparison c;
  c.count = static_cast<int64_t>(run.size());
  std::vector<double> d;
  d.reserve(run.size());
  int64_t same = 0;
  double abs_sum = 0;
  for (size_t i = 0; i < run.size(); ++i) {
    if (run[i].token != base[i].token) {
      return invalid_argument("scored token " + std::to_string(i) + " differs between the runs (" +
                              std::to_string(run[i].token) + " vs " + std::to_string(base[i].token) +
                              "): compare runs of the same text and tokenizer");
    }
    d.push_back(run[i].nll - base[i].nll);
    abs_sum += std::abs(d.back());
    if (run[i].top1 == base[i].top1) ++same;
  }
  mean_and_stderr(d, c.mean_dnll, c.stderr_dnll);
  c.ppl_ratio = std::exp(c.mean_dnll);
  c.mean_abs_dnll = abs_sum / static_cast<double>(c.count);
  c.same_top1 = static_cast<double>(same) / static_cast<double>(c.count);
  return c;
}

std::string scores_to_json(const PerplexityPlan& plan, std::span<const ScoredToken> tokens) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["ctx"] = plan.ctx;
  j["score_from"] = plan.score_from;
  j["prefix"] = plan.prefix;
  j["windows"] = plan.num_windows;
  auto& tok = j["token"] = nlohmann::ordered_json::array();
  auto& nll = j["nll"] = nlohmann::ordered_json::array();
  auto& top = j["top1"] = nlohmann::ordered_json::array();
  for (const ScoredToken& t : tokens) {
    tok.push_back(t.token);
    nll.push_back(t.nll);
    top.push_back(t.top1);
  }
  return j.dump() + "\n";
}

Expected<std::vector<ScoredToken>> scores_from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corrupt("not a JSON object");
  const auto fmt = j.find("format");
  if (fmt == j.end() || !fmt->is_string() || fmt->get<std::string>() != kFormat) {
    return corrupt(std::string("\"format\" is not \"") + kFormat + "\" (not a file written by --save)");
  }
  const auto array_of = [&](const char* key) -> const nlohmann::json* {
    const auto it = j.find(key);
    return it != j.end() && it->is_array() ? &*it : nullptr;
  };
  const nlohmann::json* tok = array_of("token");
  const nlohmann::json* nll = array_of("nll");
  const nlohmann::json* top = array_of("top1");
  if (!tok || !nll || !top) return corrupt("\"token\", \"nll\" and \"top1\" must be arrays");
  if (tok->size() != nll->size() || tok->size() != top->size()) {
    return corrupt("\"token\", \"nll\" and \"top1\" differ in length");
  }
  std::vector<ScoredToken> out(tok->size());
  for (size_t i = 0; i < out.size(); ++i) {
    const auto& t = (*tok)[i];
    const auto& n = (*nll)[i];
    const auto& p = (*top)[i];
    if (!t.is_number_integer() || !p.is_number_integer() || !n.is_number()) {
      return corrupt("entry " + std::to_string(i) + " is not (integer token, number nll, integer top1)");
    }
    const int64_t tv = t.get<int64_t>();
    const int64_t pv = p.get<int64_t>();
    const double nv = n.get<double>();
    if (tv < 0 || tv > INT32_MAX || pv < 0 || pv > INT32_MAX || !std::isfinite(nv)) {
      return corrupt("entry " + std::to_string(i) + " is out of range (token ids in [0, 2^31), nll finite)");
    }
    out[i] = {static_cast<int32_t>(tv), nv, static_cast<int32_t>(pv)};
  }
  return out;
}

}  // namespace osprey::cli
