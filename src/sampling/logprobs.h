// Logprobs of one row of RAW logits (before any processing): log_softmax.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace osprey {

struct LogprobData {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int rank = 0;  // 1 + number of tokens with a strictly higher logit
  std::vector<std::pair<int32_t, float>> top;  // top_k (id, logprob), best first, ties to lower id
};

// log(sum(exp(logits))), computed stably.
double log_sum_exp(std::span<const float> logits);

// The logprob of `token` and the top_k most likely tokens of the row.
LogprobData compute_logprobs(std::span<const float> logits, int32_t token, int top_k);

}  // namespace osprey
