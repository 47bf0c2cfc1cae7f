#include "sampling/logits_processors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "sampling/penalty_state.h"

namespace osprey {

void apply_logit_bias(std::span<float> logits, const std::map<int32_t, float>& bias) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (const auto& [id, b] : bias)
    if (id >= 0 && id < vocab) logits[id] += b;
}

void mask_tokens(std::span<float> logits, std::span<const int32_t> ids) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (int32_t id : ids)
    if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
}

void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> prompt,
                              std::span<const int32_t> output, float penalty) {
  if (penalty == 1.0f) return;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::unordered_set<int32_t> seen;
  seen.reserve(prompt.size() + output.size());
  auto visit = [&](int32_t id) {
    if (id < 0 || id >= vocab || !seen.insert(id).second) return;
    float& l = logits[id];
    l = l > 0 ? l / penalty : l * penalty;
  };
  for (int32_t id : prompt) visit(id);
  for (int32_t id : output) visit(id);
}

void apply_frequency_presence(std::span<float> logits, std::span<const int32_t> output, float frequency,
                              float presence) {
  if (frequency == 0.0f && presence == 0.0f) return;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::unordered_map<int32_t, int> counts;
  for (int32_t id : output)
    if (id >= 0 && id < vocab) ++counts[id];
  for (const auto& [id, c] : counts) logits[id] -= static_cast<float>(c) * frequency + presence;
}

void apply_repetition_penalty(std::span<float> logits, const PenaltyState& state, float penalty) {
  if (penalty == 1.0f) return;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (int32_t id : state.rep_ids()) {
    if (id < 0 || id >= vocab) continue;
    float& l = logits[id];
    l = l > 0 ? l / penalty : l * penalty;
  }
}

void apply_frequency_presence(std::span<float> logits, const PenaltyState& state, float frequency, float presence) {
  if (frequency == 0.0f && presence == 0.0f) return;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  const std::span<const int32_t> ids = state.output_ids();
  const std::span<const int32_t> counts = state.output_counts();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= 0 && ids[i] < vocab) logits[ids[i]] -= static_cast<float>(counts[i]) * frequency + presence;
}

int32_t argmax(std::span<const float> logits) {
  // Pass 1: the maximum, with 8 independent lanes so the compiler can keep
  // them in one vector register (no NaN handling needed: a NaN never wins a
  // comparison, as in the scalar loop; the lanes start at -inf, not at
  // logits[0], which may be a NaN that nothing would then replace). Pass 2:
  // its first index (ties: lowest id).
  const size_t n = logits.size();
  if (n == 0) return 0;
  float lane[8];
  for (float& l : lane) l = -std::numeric_limits<float>::infinity();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
  }
  float best = lane[0];
  for (int j = 1; j < 8; ++j) best = lane[j] > best ? lane[j] : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (size_t k = 0; k < n; ++k) {
    if (logits[k] == best) return static_cast<int32_t>(k);
  }
  return 0;  // every value is NaN
}

void truncate_distribution(std::span<const float> logits, float temperature, float min_p, int top_k,
                           float top_p, Candidates& out) {
  out.ids.clear();
  out.weights.clear();
  out.total = 0.0;
  const int vocab = static_cast<int>(logits.size());
  float m = -std::numeric_limits<float>::infinity();
  for (float l : logits) m = std::max(m, l);
  if (!std::isfinite(m)) {  // everything masked: fall back to greedy over the row
    out.ids.push_back(argmax(logits));
    out.weights.push_back(1.0);
    out.total = 1.0;
    return;
  }
  const double inv_t = 1.0 / static_cast<double>(temperature);
  const bool use_k = top_k > 0 && top_k < vocab;
  const bool use_p = top_p < 1.0f;
  const bool use_min_p = min_p > 0.0f;
  // Tokens whose tempered probability relative to the best is below min_p go.
  const double min_scaled = use_min_p ? std::log(static_cast<double>(min_p)) : -std::numeric_limits<double>::infinity();
  for (int i = 0; i < vocab; ++i) {
    if (!std::isfinite(logits[i]) && logits[i] < 0) continue;
    const double s = (static_cast<double>(logits[i]) - m) * inv_t;
    if (s < min_scaled) continue;
    const double w = std::exp(s);
    if (!(w > 0.0)) continue;
    out.ids.push_back(i);
    out.weights.push_back(w);
  }
  if (use_k || use_p) {
    // Order by probability descending, ties to the lower id.
    std::vector<int> order(out.ids.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    auto better = [&](int a, int b) {
      if (out.weights[a] != out.weights[b]) return out.weights[a] > out.weights[b];
      return out.ids[a] < out.ids[b];
    };
    size_t keep = order.size();
    if (use_k && static_cast<size_t>(top_k) < keep) {
      std::nth_element(order.begin(), order.begin() + top_k, order.end(), better);
      keep = static_cast<size_t>(top_k);
      order.resize(keep);
    }
    std::sort(order.begin(), order.end(), better);
    std::vector<int32_t> ids(order.size());
    std::vector<double> w(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      ids[i] = out.ids[order[i]];
      w[i] = out.weights[order[i]];
    }
    if (use_p) {
      double total = 0.0;
      for (double x : w) total += x;
      // Keep a token while the mass strictly before it is below top_p.
      double before = 0.0;
      size_t n = 0;
      while (n < w.size() && (n == 0 || before < static_cast<double>(top_p) * total)) before += w[n++];
      ids.resize(n);
      w.resize(n);
    }
    out.ids = std::move(ids);
    out.weights = std::move(w);
  }
  for (double x : out.weights) out.total += x;
  if (out.ids.empty()) {  // min-p removes nothing that is the max itself; defensive
    out.ids.push_back(argmax(logits));
    out.weights.push_back(1.0);
    out.total = 1.0;
  }
}

int32_t draw(const Candidates& c, double u) {
  const double target = u * c.total;
  double acc = 0.0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    acc += c.weights[i];
    if (acc > target) return c.ids[i];
  }
  return c.ids.back();
}

}  // namespace osprey
