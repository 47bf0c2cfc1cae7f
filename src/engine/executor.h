// Executor: what the engine loop needs from a model on a backend. The model
// executor (model_executor.h) wraps Model; tests use a fake that fabricates
// logits from the token history it finds in its own paged "KV".
#pragma once

#include <cstdint>
#include <vector>

#include "kv/block_table.h"
#include "osprey/status.h"

namespace osprey {

// One step's inputs as host arrays (the batch builder's output). Layout as
// ops::AttentionBatch (src/ops/backend.h): sequences in order, tokens of a
// sequence contiguous.
struct StepBatch {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_kv_len = 0;
  int max_q_len = 0;
  std::vector<int32_t> token_ids;      // [num_tokens]
  std::vector<int32_t> positions;      // [num_tokens]
  std::vector<int32_t> slot_mapping;   // [num_tokens] page * block_size + row
  std::vector<int32_t> q_indptr;       // [num_seqs + 1]
  std::vector<int32_t> kv_lens;        // [num_seqs] after this step's writes
  std::vector<int32_t> block_indptr;   // [num_seqs + 1]
  std::vector<int32_t> block_indices;  // [block_indptr[num_seqs]]
  std::vector<int32_t> logit_rows;     // token rows whose logits are wanted
  std::vector<BlockCopy> copies;       // page copies to run before the forward
  // Swap copies of whole pages (every layer's K and V), run in this order:
  // swap_out {device page src -> host slot dst}, then copies, then swap_in
  // {host slot src -> device page dst}, then the forward.
  std::vector<BlockCopy> swap_out;
  std::vector<BlockCopy> swap_in;

  void clear();
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual int vocab_size() const = 0;
  // Allocates num_blocks KV pages of block_size tokens and buffers for steps of
  // up to max_tokens tokens and max_logit_rows logit rows. Called once.
  virtual Status initialize(int num_blocks, int block_size, int max_tokens, int max_logit_rows) = 0;
  // Allocates num_host_blocks host slots of one page each (every layer's K
  // and V) for swapping; called after initialize() when swap is configured.
  virtual Status initialize_swap(int num_host_blocks) {
    (void)num_host_blocks;
    return unsupported("this executor cannot swap KV pages to host memory");
  }
  // Runs batch.swap_out, batch.copies, batch.swap_in, then the forward. Returns the logits of batch.logit_rows,
  // [logit_rows.size(), vocab] F32 in HOST memory, valid until the next call.
  // A batch without tokens runs only its copies (and returns null).
  // This is the one place logits cross to the host: a device backend copies
  // them here (or, later, samples on the device and returns only ids).
  virtual Expected<const float*> execute(const StepBatch& batch) = 0;
};

}  // namespace osprey
