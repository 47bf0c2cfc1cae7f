// Test driver for Model::forward on any backend: several sequences, each
// with its own pages (taken from a shared pool in an interleaved, reversed
// order so pages are never contiguous), step inputs copied to the backend's
// device through pre-allocated buffers. One step feeds any tokens to any
// sequences and returns the logits of each fed sequence's last token.
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
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

// The same tests/fixtures model on two backends that differ in one fusion
// (a: on, b: off): a 40-token and a 5-token prompt, then 4 decode steps of
// both sequences fed b's greedy tokens; every step's logits within max_nmse
// of b's. `tag` names the case in failures.
inline void expect_fused_forward_matches(Model& a, Model& b, double max_nmse, const std::string& tag) {
  BatchRunner ra(a, 2, 64, 48), rb(b, 2, 64, 48);
  std::vector<int32_t> p0, p1;
  for (int i = 0; i < 40; ++i) p0.push_back((i * 37 + 11) % 512);
  for (int i = 0; i < 5; ++i) p1.push_back((i * 101 + 3) % 512);
  std::vector<std::vector<int32_t>> feed = {p0, p1};
  for (int step = 0; step < 5; ++step) {
    const auto la = ra.step(feed), lb = rb.step(feed);
    ASSERT_EQ(la.size(), lb.size());
    for (size_t s = 0; s < la.size(); ++s) {
      const ErrorStats e = error_stats(la[s].data(), lb[s].data(), la[s].size());
      EXPECT_LE(e.nmse, max_nmse) << tag << " step " << step << " seq " << s << " (max rel " << e.max_rel << ")";
    }
    feed = {{argmax(lb[0])}, {argmax(lb[1])}};  // both runs continue with the same tokens
  }
}

// A dummy Llama-3.2-1B loaded as `dtype` (tag names it in the log) against
// the same weights in fp32 on the GPU: activations and KV in `act`, half the
// KV bytes; 32 prompt tokens, 8 greedy steps with logits NMSE <= max_nmse;
// a greedy divergence only at a near-tie (top-2 gap <= tie_frac * max |logit|).
inline void expect_dummy_1b_agrees_with_fp32(const char* dtype, DType act, const char* tag, double max_nmse,
                                             double tie_frac) {
  ASSERT_GT(cuda::device_count(), 0);
  auto be = cuda::make_cuda_backend({});
  ASSERT_NE(be, nullptr);
  auto load = [&](const char* dt) {
    ModelLoadOptions o;
    o.load_format = "dummy";
    o.dtype = dt;
    o.dummy_seed = 5;
    return Model::load("llama-3.2-1b", *be, o);
  };
  auto mf = load("float32");
  ASSERT_TRUE(mf.ok()) << mf.status().to_string();
  auto mh = load(dtype);
  ASSERT_TRUE(mh.ok()) << mh.status().to_string();
  EXPECT_EQ((*mh)->activation_dtype(), act);
  EXPECT_EQ((*mh)->kv_dtype(), act);
  EXPECT_EQ((*mh)->kv_bytes_per_token() * 2, (*mf)->kv_bytes_per_token());
  std::vector<int32_t> prompt;
  std::mt19937 rng(3);
  for (int i = 0; i < 32; ++i) prompt.push_back(static_cast<int32_t>(rng() % 128000));
  BatchRunner rf(**mf, 1, 48, 32), rh(**mh, 1, 48, 32);
  std::vector<float> lf = rf.step({prompt})[0], lh = rh.step({prompt})[0];
  for (int s = 0; s < 8; ++s) {
    const ErrorStats e = error_stats(lh.data(), lf.data(), lf.size());
    std::printf("dummy llama-3.2-1b step %d: %s vs fp32 logits nmse %.3g max rel %.3g\n", s, tag, e.nmse, e.max_rel);
    EXPECT_LE(e.nmse, max_nmse) << "step " << s;
    const int tf = argmax(lf), th = argmax(lh);
    if (tf != th) {
      std::vector<float> sorted = lf;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      double max_abs = 0;
      for (float v : lf) max_abs = std::max(max_abs, std::fabs(double{v}));
      EXPECT_LE(sorted[0] - sorted[1], tie_frac * max_abs) << "greedy diverges at step " << s << " away from a near-tie";
      break;
    }
    lf = rf.step({{tf}})[0];
    lh = rh.step({{th}})[0];
  }
}

}  // namespace osprey::gpu_test
