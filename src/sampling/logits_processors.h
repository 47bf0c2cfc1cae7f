// Logits processors, applied in place to one row of logits [vocab] (F32), in
// the order sample_token() uses (the order vLLM applies them):
//   logit bias -> min_tokens stop masking -> repetition penalty ->
//   frequency/presence penalties -> (greedy argmax | temperature -> min-p ->
//   top-k -> top-p -> draw).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

namespace osprey {

class PenaltyState;

// logits[id] += bias for each entry (ids outside [0, vocab) are ignored).
void apply_logit_bias(std::span<float> logits, const std::map<int32_t, float>& bias);

// Sets the logits of `ids` to -inf (min_tokens: stop ids cannot be sampled yet).
void mask_tokens(std::span<float> logits, std::span<const int32_t> ids);

// Hugging Face / vLLM repetition penalty over every token in prompt or output:
// a positive logit is divided by `penalty`, a negative one multiplied.
void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> prompt,
                              std::span<const int32_t> output, float penalty);

// OpenAI: logit -= count * frequency + (count > 0) * presence, counts over the output only.
void apply_frequency_presence(std::span<float> logits, std::span<const int32_t> output, float frequency,
                              float presence);

// The same two from a sequence's incremental state (sampling/penalty_state.h),
// synced to the prompt and output: O(distinct ids), identical results.
void apply_repetition_penalty(std::span<float> logits, const PenaltyState& state, float penalty);
void apply_frequency_presence(std::span<float> logits, const PenaltyState& state, float frequency, float presence);

// Argmax; ties go to the lowest id.
int32_t argmax(std::span<const float> logits);

// Candidate tokens that survive temperature, min-p, top-k and top-p, with
// their unnormalised probabilities. `order_by_prob` lists them by probability
// descending (ties: lower id first); otherwise (no truncation) in id order.
struct Candidates {
  std::vector<int32_t> ids;
  std::vector<double> weights;  // exp((logit - max) / T), > 0
  double total = 0.0;
};
// temperature > 0. top_k <= 0 or >= vocab: off; top_p >= 1: off; min_p <= 0: off.
void truncate_distribution(std::span<const float> logits, float temperature, float min_p, int top_k,
                           float top_p, Candidates& out);

// The candidate at which the cumulative weight first exceeds u * total (u in [0, 1)).
int32_t draw(const Candidates& c, double u);

}  // namespace osprey
