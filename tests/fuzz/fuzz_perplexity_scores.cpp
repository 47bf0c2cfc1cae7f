// libFuzzer target: `osprey perplexity --compare` files (tools/perplexity.h,
// scores_from_json). Whatever it accepts must survive a save and a read
// again unchanged, and compare against itself as identical; it must never
// crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "perplexity.h"

using namespace osprey::cli;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto scores = scores_from_json(text);
  if (!scores.ok()) return 0;
  PerplexityPlan plan;
  plan.ctx = 2;
  plan.score_from = 1;
  plan.stride = 2;
  plan.num_windows = 1;
  auto again = scores_from_json(scores_to_json(plan, *scores));
  if (!again.ok() || again->size() != scores->size()) std::abort();
  for (size_t i = 0; i < scores->size(); ++i) {
    const ScoredToken& a = (*scores)[i];
    const ScoredToken& b = (*again)[i];
    if (a.token != b.token || a.top1 != b.top1 || a.nll != b.nll) std::abort();
  }
  (void)summarize(*scores);
  auto self = compare(*scores, *again);
  if (!scores->empty() && (!self.ok() || self->mean_dnll != 0.0 || self->same_top1 != 1.0)) std::abort();
  return 0;
}
