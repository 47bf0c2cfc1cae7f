// Device-side sampling description: what a backend's sampler needs to turn
// one row of raw logits into a token for one sequence, as plain data (no
// pointers into host structures), so it can be uploaded as one array.
//
// Semantics (the same as Sampler::sample, src/sampling/sampler.h):
//   processed = raw; processed[id] += bias (bias section); processed[id] = -inf
//   (mask section, min_tokens); repetition penalty on the rep section's ids
//   (unique ids of prompt + output; x > 0 ? x / p : x * p); processed[id] -=
//   count * frequency + presence (freq section: unique output ids and counts).
//   temperature <= kGreedyTemperature: argmax of processed (ties: lowest id).
//   Otherwise the distribution exp((x - max) / T) over finite x, cut by
//   min-p, top-k (ties: lower id) and top-p (keep a token while the mass of
//   the better ones is below top_p), drawn with u = sampling_uniform(seed,
//   seq_index, position) (sampling/rng.h). A device walks the kept tokens in
//   id order for the draw (the host walks them by probability when top-k or
//   top-p cut), so seeded draws are reproducible on one backend, not across
//   backends, except without truncation. Logprobs: log_softmax of the RAW row.
//
// The data types are C++17 (CUDA sources include this header); the host
// helpers below (device_sampling.cpp) are C++20.
#pragma once

#include <cstdint>
#include <vector>
#if __cplusplus >= 202002L
#include <span>
#endif

namespace osprey {

struct SamplingParams;
class PenaltyState;

inline constexpr float kGreedyTemperature = 1e-5f;
// Top logprobs a device sampler returns per row at most (the API's limit).
inline constexpr int kMaxDeviceTopLogprobs = 20;

// One sampled token. Edits live in DeviceSampleEdits from edit_begin on, in
// sections: num_bias (id, value), num_mask (id), num_rep (id), num_freq (id,
// count as value).
struct DeviceSampleRow {
  int32_t logit_row = 0;        // row of the step's logits
  int32_t top_k = 0;            // <= 0: off
  float temperature = 0.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t num_logprobs = -1;    // -1: off; else the top entries wanted (<= kMaxDeviceTopLogprobs)
  int32_t edit_begin = 0;
  int32_t num_bias = 0;
  int32_t num_mask = 0;
  int32_t num_rep = 0;
  int32_t num_freq = 0;
  int32_t scratch_row = -1;     // row of the processed-logits scratch; -1: no edits
  int32_t seq_index = 0;
  uint64_t seed = 0;
  int64_t position = 0;         // position of the token being sampled
};

// The flat edit arrays of one step's rows (ids[i] with vals[i]; vals unused
// for mask and rep entries).
struct DeviceSampleEdits {
  std::vector<int32_t> ids;
  std::vector<float> vals;
  void clear() {
    ids.clear();
    vals.clear();
  }
};

// What a device sampler returns for one row (host copy).
struct DeviceSampleResult {
  int32_t token = 0;
  float logprob = 0.0f;  // of token, raw log_softmax (when num_logprobs >= 0)
  int32_t rank = 0;
  int32_t top_ids[kMaxDeviceTopLogprobs];
  float top_logprobs[kMaxDeviceTopLogprobs];
};

#if __cplusplus >= 202002L
// Whether a device sampler handles these parameters (else the row is
// sampled on the host from copied logits).
bool device_can_sample(const SamplingParams& p);

// Appends the row of one sampled token: fills `row` (its edit_begin and
// counts; logit_row, scratch_row are the caller's) and appends its edits.
// stop_ids: ids masked while output.size() < min_tokens. Lists the penalty
// sections from scratch (sorts prompt + output): for one-off rows and tests.
void make_device_sample_row(const SamplingParams& p, std::span<const int32_t> prompt,
                            std::span<const int32_t> output, std::span<const int32_t> stop_ids, uint64_t seed,
                            int seq_index, int64_t position, DeviceSampleRow& row, DeviceSampleEdits& edits);
// The same row from the sequence's incremental penalty state (the engine's
// way): `penalties` must have folded the prompt and the num_output output
// tokens (PenaltyState::sync); the edits are identical to the above.
void make_device_sample_row(const SamplingParams& p, const PenaltyState& penalties, int num_output,
                            std::span<const int32_t> stop_ids, uint64_t seed, int seq_index, int64_t position,
                            DeviceSampleRow& row, DeviceSampleEdits& edits);
#endif

}  // namespace osprey
