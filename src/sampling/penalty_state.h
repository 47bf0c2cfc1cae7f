// PenaltyState: what the repetition, presence and frequency penalties need of
// one sequence, kept up to date as its tokens become known, so that a
// sampling step costs O(new tokens + distinct ids) instead of sorting the
// whole prompt and output again.
//
// Invariants, for the first num_folded() tokens of the sequence (prompt
// first, num_prompt of them, then the output):
//   rep_ids():       each distinct id of those tokens once, ascending (kept
//                    only when the repetition penalty is on);
//   output_ids():    each distinct id of the output tokens once, ascending,
//   output_counts(): its number of occurrences in the output (both kept only
//                    when the frequency or presence penalty is on).
// These are exactly the sections make_device_sample_row lists from scratch
// (same ids, same order). A forked sequence copies its parent's state.
// Tokens once folded must never change; the engine folds only known tokens
// (never a pending placeholder of asynchronous scheduling).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace osprey {

struct SamplingParams;

// Whether p needs the tokens of the sequence (any penalty on).
bool uses_penalties(const SamplingParams& p);

class PenaltyState {
 public:
  // Folds tokens [num_folded(), tokens.size()) in; tokens: the sequence's
  // known tokens, the first num_prompt of them its prompt. The first call
  // fixes which sections are kept (from p; a request's p never changes).
  // Costs O(k log k + distinct ids) for k new tokens (one prompt sort on the
  // first call); allocates only when a section outgrows its capacity.
  void sync(const SamplingParams& p, std::span<const int32_t> tokens, int num_prompt);

  int num_folded() const { return num_folded_; }
  std::span<const int32_t> rep_ids() const { return rep_ids_; }
  std::span<const int32_t> output_ids() const { return out_ids_; }
  std::span<const int32_t> output_counts() const { return out_counts_; }

 private:
  // Adds the sorted ids `add` (duplicates allowed) to the sorted distinct
  // ids `ids`; with counts (parallel to ids), also adds each occurrence.
  static void merge(std::vector<int32_t>& ids, std::vector<int32_t>* counts, std::span<const int32_t> add);

  bool initialized_ = false;
  bool track_rep_ = false;
  bool track_freq_ = false;
  int num_folded_ = 0;
  std::vector<int32_t> rep_ids_;
  std::vector<int32_t> out_ids_;
  std::vector<int32_t> out_counts_;
};

}  // namespace osprey
