#include "sampling/device_sampling.h"

#include <algorithm>

#include "osprey/engine.h"
#include "sampling/penalty_state.h"

namespace osprey {

bool device_can_sample(const SamplingParams& p) { return p.logprobs <= kMaxDeviceTopLogprobs; }

namespace {

// Scalars, logit bias and min_tokens mask: everything but the penalty sections.
void begin_row(const SamplingParams& p, int num_output, std::span<const int32_t> stop_ids, uint64_t seed,
               int seq_index, int64_t position, DeviceSampleRow& row, DeviceSampleEdits& edits) {
  row.top_k = p.top_k;
  row.temperature = p.temperature;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  row.repetition_penalty = p.repetition_penalty;
  row.presence_penalty = p.presence_penalty;
  row.frequency_penalty = p.frequency_penalty;
  row.num_logprobs = p.logprobs < 0 ? -1 : std::min(p.logprobs, kMaxDeviceTopLogprobs);
  row.seed = seed;
  row.seq_index = seq_index;
  row.position = position;
  row.edit_begin = static_cast<int32_t>(edits.ids.size());
  row.num_bias = row.num_mask = row.num_rep = row.num_freq = 0;
  for (const auto& [id, b] : p.logit_bias) {
    edits.ids.push_back(id);
    edits.vals.push_back(b);
    ++row.num_bias;
  }
  if (num_output < p.min_tokens) {
    for (int32_t id : stop_ids) {
      edits.ids.push_back(id);
      edits.vals.push_back(0.0f);
      ++row.num_mask;
    }
  }
}

}  // namespace

void make_device_sample_row(const SamplingParams& p, std::span<const int32_t> prompt,
                            std::span<const int32_t> output, std::span<const int32_t> stop_ids, uint64_t seed,
                            int seq_index, int64_t position, DeviceSampleRow& row, DeviceSampleEdits& edits) {
  // Sorting scratch, reused across calls so steady-state steps allocate nothing.
  thread_local std::vector<int32_t> sorted;
  begin_row(p, static_cast<int>(output.size()), stop_ids, seed, seq_index, position, row, edits);
  if (p.repetition_penalty != 1.0f) {
    // Each distinct id of prompt + output once.
    sorted.assign(prompt.begin(), prompt.end());
    sorted.insert(sorted.end(), output.begin(), output.end());
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    for (int32_t id : sorted) {
      edits.ids.push_back(id);
      edits.vals.push_back(0.0f);
      ++row.num_rep;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    // (id, count) over the output.
    sorted.assign(output.begin(), output.end());
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size();) {
      size_t j = i;
      while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
      edits.ids.push_back(sorted[i]);
      edits.vals.push_back(static_cast<float>(j - i));
      ++row.num_freq;
      i = j;
    }
  }
}

void make_device_sample_row(const SamplingParams& p, const PenaltyState& penalties, int num_output,
                            std::span<const int32_t> stop_ids, uint64_t seed, int seq_index, int64_t position,
                            DeviceSampleRow& row, DeviceSampleEdits& edits) {
  begin_row(p, num_output, stop_ids, seed, seq_index, position, row, edits);
  if (p.repetition_penalty != 1.0f) {
    const std::span<const int32_t> ids = penalties.rep_ids();
    edits.ids.insert(edits.ids.end(), ids.begin(), ids.end());
    edits.vals.insert(edits.vals.end(), ids.size(), 0.0f);
    row.num_rep = static_cast<int32_t>(ids.size());
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    const std::span<const int32_t> ids = penalties.output_ids();
    const std::span<const int32_t> counts = penalties.output_counts();
    edits.ids.insert(edits.ids.end(), ids.begin(), ids.end());
    for (int32_t c : counts) edits.vals.push_back(static_cast<float>(c));
    row.num_freq = static_cast<int32_t>(ids.size());
  }
}

}  // namespace osprey
