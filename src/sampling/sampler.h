// Sampler: turns one row of raw logits into a token for one sequence,
// applying the request's SamplingParams (see logits_processors.h for the
// order) with randomness drawn from (seed, seq_index, position) only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "osprey/engine.h"
#include "sampling/logits_processors.h"
#include "sampling/logprobs.h"
#include "sampling/penalty_state.h"

namespace osprey {

struct SampleInput {
  const SamplingParams* params = nullptr;
  std::span<const int32_t> prompt;    // prompt token ids
  std::span<const int32_t> output;    // tokens generated so far by this sequence
  // Ids that end the sequence (EOS unless ignore_eos, stop_token_ids):
  // masked while output.size() < min_tokens.
  std::span<const int32_t> stop_ids;
  // When set: the sequence's penalty state, synced to prompt + output; the
  // penalties read it (O(distinct ids)) instead of scanning the spans.
  const PenaltyState* penalties = nullptr;
  uint64_t seed = 0;
  int seq_index = 0;
  int64_t position = 0;               // position of the token being sampled
};

struct SampleResult {
  int32_t token = 0;
  std::optional<LogprobData> logprobs;  // when params->logprobs >= 0 (raw logits)
};

class Sampler {
 public:
  explicit Sampler(int vocab_size) : vocab_(vocab_size), scratch_(vocab_size) {}
  int vocab_size() const { return vocab_; }
  // raw: [vocab] logits of the row, not modified.
  SampleResult sample(const float* raw, const SampleInput& in);

 private:
  int vocab_;
  std::vector<float> scratch_;
  Candidates candidates_;
};

}  // namespace osprey
