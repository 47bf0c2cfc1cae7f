#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace osprey {

double log_sum_exp(std::span<const float> logits) {
  float m = -std::numeric_limits<float>::infinity();
  for (float l : logits) m = std::max(m, l);
  if (!std::isfinite(m)) return m;
  double s = 0.0;
  for (float l : logits) s += std::exp(static_cast<double>(l) - m);
  return m + std::log(s);
}

LogprobData compute_logprobs(std::span<const float> logits, int32_t token, int top_k) {
  LogprobData d;
  d.token_id = token;
  const double lse = log_sum_exp(logits);
  const float lt = logits[token];
  d.logprob = static_cast<float>(lt - lse);
  int rank = 1;
  for (float l : logits)
    if (l > lt) ++rank;
  d.rank = rank;
  if (top_k > 0) {
    const int vocab = static_cast<int>(logits.size());
    const int k = std::min(top_k, vocab);
    std::vector<int32_t> ids(vocab);
    for (int i = 0; i < vocab; ++i) ids[i] = i;
    auto better = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), better);
    d.top.reserve(k);
    for (int i = 0; i < k; ++i) d.top.emplace_back(ids[i], static_cast<float>(logits[ids[i]] - lse));
  }
  return d;
}

}  // namespace osprey
