#include "sampling/sampler.h"

#include <algorithm>

#include "core/check.h"
#include "sampling/rng.h"

namespace osprey {

SampleResult Sampler::sample(const float* raw, const SampleInput& in) {
  const SamplingParams& p = *in.params;
  std::span<const float> raw_row(raw, vocab_);
  SampleResult r;
  // Plain greedy needs no processed copy of the row.
  const bool plain = p.logit_bias.empty() && static_cast<int>(in.output.size()) >= p.min_tokens &&
                     p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f;
  if (plain && p.temperature <= 1e-5f) {
    r.token = argmax(raw_row);
    if (p.logprobs >= 0) r.logprobs = compute_logprobs(raw_row, r.token, p.logprobs);
    return r;
  }
  std::copy(raw, raw + vocab_, scratch_.begin());
  std::span<float> row(scratch_);
  if (!p.logit_bias.empty()) apply_logit_bias(row, p.logit_bias);
  if (static_cast<int>(in.output.size()) < p.min_tokens) mask_tokens(row, in.stop_ids);
  if (in.penalties) {
    OSP_CHECK_EQ(in.penalties->num_folded(), static_cast<int>(in.prompt.size() + in.output.size()));
    apply_repetition_penalty(row, *in.penalties, p.repetition_penalty);
    apply_frequency_presence(row, *in.penalties, p.frequency_penalty, p.presence_penalty);
  } else {
    apply_repetition_penalty(row, in.prompt, in.output, p.repetition_penalty);
    apply_frequency_presence(row, in.output, p.frequency_penalty, p.presence_penalty);
  }

  if (p.temperature <= 1e-5f) {
    r.token = argmax(row);
  } else {
    truncate_distribution(row, p.temperature, p.min_p, p.top_k, p.top_p, candidates_);
    r.token = draw(candidates_, sampling_uniform(in.seed, in.seq_index, in.position));
  }
  if (p.logprobs >= 0) r.logprobs = compute_logprobs(raw_row, r.token, p.logprobs);
  return r;
}

}  // namespace osprey
