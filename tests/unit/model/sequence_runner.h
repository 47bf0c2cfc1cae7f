// Test driver: runs one sequence through Model::forward with a trivially
// paged KV cache (pages 0..N-1 in order), one prefill and then decode steps.
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

#include "model/model.h"

namespace osprey::testing {

class SequenceRunner {
 public:
  SequenceRunner(Model& model, int max_len, int block_size = 16) : model_(model), block_size_(block_size) {
    const int num_blocks = (max_len + block_size - 1) / block_size;
    kv_ = model.allocate_kv(num_blocks, block_size);
    model.reserve(max_len, max_len);
    blocks_.resize(static_cast<size_t>(num_blocks));
    std::iota(blocks_.begin(), blocks_.end(), 0);
    std::reverse(blocks_.begin(), blocks_.end());  // pages out of order on purpose
  }
  ~SequenceRunner() { model_.free_kv(kv_); }
  const KvCache& kv() const { return kv_; }

  // Feeds `ids` after the tokens already in the cache. Returns logits of every
  // fed position when all_logits, else of the last one: [rows * vocab].
  std::vector<float> feed(const std::vector<int32_t>& ids, bool all_logits) {
    const int n = static_cast<int>(ids.size());
    std::vector<int32_t> positions(n), slots(n), rows;
    for (int i = 0; i < n; ++i) {
      positions[i] = len_ + i;
      const int p = len_ + i;
      slots[i] = blocks_[static_cast<size_t>(p / block_size_)] * block_size_ + p % block_size_;
    }
    if (all_logits) {
      rows.resize(n);
      std::iota(rows.begin(), rows.end(), 0);
    } else {
      rows = {n - 1};
    }
    len_ += n;
    const int used_blocks = (len_ + block_size_ - 1) / block_size_;
    std::vector<int32_t> q_indptr = {0, n}, kv_lens = {len_}, block_indptr = {0, used_blocks};
    ForwardBatch b;
    b.token_ids = ids.data();
    b.attn.num_seqs = 1;
    b.attn.num_tokens = n;
    b.attn.max_kv_len = len_;
    b.attn.max_q_len = n;
    b.attn.q_indptr = q_indptr.data();
    b.attn.kv_lens = kv_lens.data();
    b.attn.block_indptr = block_indptr.data();
    b.attn.block_indices = blocks_.data();
    b.attn.positions = positions.data();
    b.attn.slot_mapping = slots.data();
    b.logit_rows = rows.data();
    b.num_logit_rows = static_cast<int>(rows.size());
    Tensor logits = model_.forward(b, kv_);
    const float* p = logits.data_as<float>();
    return std::vector<float>(p, p + logits.numel());
  }

  // Greedy continuation of `prompt` for `steps` tokens (lowest id wins ties).
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int steps) {
    std::vector<int32_t> out;
    std::vector<float> logits = feed(prompt, false);
    for (int s = 0; s < steps; ++s) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      if (s + 1 < steps) logits = feed({next}, false);
    }
    return out;
  }

 private:
  Model& model_;
  int block_size_;
  KvCache kv_;
  std::vector<int32_t> blocks_;
  int len_ = 0;
};

}  // namespace osprey::testing
