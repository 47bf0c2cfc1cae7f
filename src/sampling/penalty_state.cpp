#include "sampling/penalty_state.h"

#include <algorithm>

#include "core/check.h"
#include "osprey/engine.h"

namespace osprey {

bool uses_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

void PenaltyState::sync(const SamplingParams& p, std::span<const int32_t> tokens, int num_prompt) {
  if (!initialized_) {
    initialized_ = true;
    track_rep_ = p.repetition_penalty != 1.0f;
    track_freq_ = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  }
  const int n = static_cast<int>(tokens.size());
  OSP_CHECK_LE(num_folded_, n);
  if (n == num_folded_) return;
  if (track_rep_) merge(rep_ids_, nullptr, tokens.subspan(static_cast<size_t>(num_folded_)));
  const int out_begin = std::max(num_folded_, num_prompt);
  if (track_freq_ && out_begin < n) merge(out_ids_, &out_counts_, tokens.subspan(static_cast<size_t>(out_begin)));
  num_folded_ = n;
}

void PenaltyState::merge(std::vector<int32_t>& ids, std::vector<int32_t>* counts, std::span<const int32_t> add) {
  // The new ids, sorted, distinct, with their counts (scratch reused across
  // calls on this thread: steady-state steps allocate nothing here).
  thread_local std::vector<int32_t> nid, ncnt;
  nid.assign(add.begin(), add.end());
  std::sort(nid.begin(), nid.end());
  ncnt.clear();
  size_t m = 0;
  for (size_t i = 0; i < nid.size();) {
    size_t j = i;
    while (j < nid.size() && nid[j] == nid[i]) ++j;
    nid[m++] = nid[i];
    ncnt.push_back(static_cast<int32_t>(j - i));
    i = j;
  }
  nid.resize(m);
  // Ids not yet present, then a merge from the back in place: O(old + new).
  const size_t old = ids.size();
  size_t absent = 0;
  for (size_t i = 0, k = 0; k < m; ++k) {
    while (i < old && ids[i] < nid[k]) ++i;
    if (i == old || ids[i] != nid[k]) ++absent;
  }
  ids.resize(old + absent);
  if (counts) counts->resize(old + absent);
  size_t r = old, w = old + absent, k = m;
  while (k > 0) {
    const int32_t x = nid[k - 1];
    --w;
    if (r > 0 && ids[r - 1] > x) {
      --r;
      ids[w] = ids[r];
      if (counts) (*counts)[w] = (*counts)[r];
      continue;
    }
    int32_t c = ncnt[k - 1];
    if (r > 0 && ids[r - 1] == x) {
      --r;
      if (counts) c += (*counts)[r];
    }
    ids[w] = x;
    if (counts) (*counts)[w] = c;
    --k;
  }
  OSP_CHECK_EQ(w, r);  // the ids below every new one stay where they were
}

}  // namespace osprey
