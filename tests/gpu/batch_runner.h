// Test driver for Model::forward on any backend: several sequences, each
// with its own pages (taken from a shared pool in an interleaved, reversed
// order so pages are never contiguous), step inputs copied to the backend's
// device through pre-allocated buffers. One step feeds any tokens to any
// sequences and returns the logits of each fed sequence's last token.
#pragma once

#include <algorithm>
#include <map>
#include <vector>

#include "gpu_test_util.h"
#include "model/model.h"

namespace osprey::gpu_test {

class BatchRunner {
 public:
  // Up to max_tokens tokens per step and max_len tokens per sequence.
  BatchRunner(Model& model, int num_seqs, int max_len, int max_tokens, int block_size = 16)
      : model_(model), be_(model.backend()), block_size_(block_size), max_tokens_(max_tokens) {
    const int pages_per_seq = (max_len + block_size - 1) / block_size;
    const int num_blocks = pages_per_seq * num_seqs;
    kv_ = model.allocate_kv(num_blocks, block_size);
    model.reserve(max_tokens, std::max(max_tokens, num_seqs));
    // Sequence s owns pages num_blocks - 1 - (i * num_seqs + s): interleaved, descending.
    seqs_.resize(static_cast<size_t>(num_seqs));
    for (int s = 0; s < num_seqs; ++s) {
      for (int i = 0; i < pages_per_seq; ++i)
        seqs_[static_cast<size_t>(s)].pages.push_back(num_blocks - 1 - (i * num_seqs + s));
    }
    const size_t cap = static_cast<size_t>(std::max(max_tokens, num_blocks) + num_seqs + 1) * sizeof(int32_t);
    for (auto* m : {&d_ids_, &d_pos_, &d_slots_, &d_qptr_, &d_kvlen_, &d_bptr_, &d_bidx_, &d_rows_}) {
      m->reset(new DeviceMem(be_, cap));
    }
  }
  ~BatchRunner() { model_.free_kv(kv_); }

  // feeds[s] = tokens for sequence s this step (empty: not in the step).
  // Returns one row of logits per sequence with tokens, in sequence order;
  // with all_rows, one row per fed token instead.
  std::vector<std::vector<float>> step(const std::vector<std::vector<int32_t>>& feeds, bool all_rows = false) {
    std::vector<int32_t> ids, pos, slots, qptr{0}, kvlen, bptr{0}, bidx, rows;
    int max_q = 0, max_kv = 0;
    for (size_t s = 0; s < feeds.size(); ++s) {
      if (feeds[s].empty()) continue;
      Seq& q = seqs_[s];
      for (size_t i = 0; i < feeds[s].size(); ++i) {
        const int p = q.len + static_cast<int>(i);
        ids.push_back(feeds[s][i]);
        pos.push_back(p);
        slots.push_back(q.pages[static_cast<size_t>(p / block_size_)] * block_size_ + p % block_size_);
        if (all_rows) rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      }
      q.len += static_cast<int>(feeds[s].size());
      if (!all_rows) rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      qptr.push_back(static_cast<int32_t>(ids.size()));
      kvlen.push_back(q.len);
      const int used = (q.len + block_size_ - 1) / block_size_;
      bidx.insert(bidx.end(), q.pages.begin(), q.pages.begin() + used);
      bptr.push_back(static_cast<int32_t>(bidx.size()));
      max_q = std::max(max_q, static_cast<int>(feeds[s].size()));
      max_kv = std::max(max_kv, q.len);
    }
    EXPECT_LE(static_cast<int>(ids.size()), max_tokens_);
    auto put = [&](std::unique_ptr<DeviceMem>& m, const std::vector<int32_t>& v) {
      be_.copy_to_device(m->get(), v.data(), v.size() * sizeof(int32_t));
      return m->as<int32_t>();
    };
    ForwardBatch b;
    b.token_ids = put(d_ids_, ids);
    b.attn.num_seqs = static_cast<int>(kvlen.size());
    b.attn.num_tokens = static_cast<int>(ids.size());
    b.attn.max_kv_len = max_kv;
    b.attn.max_q_len = max_q;
    b.attn.q_indptr = put(d_qptr_, qptr);
    b.attn.kv_lens = put(d_kvlen_, kvlen);
    b.attn.block_indptr = put(d_bptr_, bptr);
    b.attn.block_indices = put(d_bidx_, bidx);
    b.attn.positions = put(d_pos_, pos);
    b.attn.slot_mapping = put(d_slots_, slots);
    b.logit_rows = put(d_rows_, rows);
    b.num_logit_rows = static_cast<int>(rows.size());
    Tensor logits = model_.forward(b, kv_);
    const int64_t vocab = logits.cols();
    std::vector<float> host(static_cast<size_t>(logits.numel()));
    be_.copy_to_host(host.data(), logits.data(), host.size() * sizeof(float));
    std::vector<std::vector<float>> out;
    for (size_t r = 0; r < rows.size(); ++r) out.emplace_back(host.begin() + r * vocab, host.begin() + (r + 1) * vocab);
    return out;
  }

 private:
  struct Seq {
    std::vector<int32_t> pages;
    int len = 0;
  };
  Model& model_;
  ops::Backend& be_;
  int block_size_;
  int max_tokens_;
  KvCache kv_;
  std::vector<Seq> seqs_;
  std::unique_ptr<DeviceMem> d_ids_, d_pos_, d_slots_, d_qptr_, d_kvlen_, d_bptr_, d_bidx_, d_rows_;
};

inline int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace osprey::gpu_test
