// ForwardBatch: everything the model needs for one step, already on the
// backend's device (built by the engine's batch builder).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/backend.h"

namespace osprey {

struct ForwardBatch {
  const int32_t* token_ids = nullptr;  // [attn.num_tokens]
  ops::AttentionBatch attn;            // positions, pages, slot mapping
  // Rows of the step whose logits are wanted (e.g. the last token of each
  // sequence that finishes its prompt or decodes).
  const int32_t* logit_rows = nullptr;  // [num_logit_rows]
  int num_logit_rows = 0;
};

// The paged KV cache of a whole model: one LayerKv per layer, same page ids.
struct KvCache {
  int num_blocks = 0;
  int block_size = 0;
  std::vector<ops::LayerKv> layers;
};

}  // namespace osprey
