// An attention step's inputs (ops::AttentionBatch's arrays) built on the
// host from query lengths, KV lengths, pages and the page size: the one place
// the GPU tests and benchmarks do that arithmetic. No GoogleTest here, so
// gpu_op_bench can use it too; gpu_test_util.h includes it and adds the
// device copy (DeviceAttentionBatch).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "ops/backend.h"

namespace osprey::gpu_test {

// One attention step's inputs on the host in ops::AttentionBatch's layout
// (CSR over sequences), built one sequence at a time with add_seq.
struct HostAttentionBatch {
  std::vector<int32_t> q_indptr{0}, kv_lens, block_indptr{0}, block_indices, positions, slots;
  int max_q_len = 0, max_kv_len = 0;

  // Appends a sequence whose q_len query tokens are the last q_len of its
  // kv_len positions, its KV in `pages` (page i: positions [i * block_size,
  // (i + 1) * block_size)). Slots address those rows when write_kv, else are
  // -1 (this step's K/V already in the pages). kv_len 0 with q_len 1 is a
  // padded sequence: its token at position 0, slot -1.
  void add_seq(int q_len, int kv_len, std::span<const int32_t> pages, int block_size, bool write_kv) {
    const int first = std::max(kv_len - q_len, 0);
    for (int i = 0; i < q_len; ++i) {
      const int pos = first + i;
      positions.push_back(pos);
      slots.push_back(
          write_kv && kv_len > 0 ? pages[static_cast<size_t>(pos / block_size)] * block_size + pos % block_size : -1);
    }
    q_indptr.push_back(static_cast<int32_t>(positions.size()));
    kv_lens.push_back(kv_len);
    block_indices.insert(block_indices.end(), pages.begin(), pages.end());
    block_indptr.push_back(static_cast<int32_t>(block_indices.size()));
    max_q_len = std::max(max_q_len, q_len);
    max_kv_len = std::max(max_kv_len, kv_len);
  }

  // add_seq with pages of the sequence's own: the next ceil(kv_len /
  // block_size) page numbers [first, first + n), first = block_indices.size()
  // (so a batch built only this way uses pages 0 .. block_indices.size() - 1,
  // each sequence a range of its own), in order, or permuted by std::shuffle
  // with *shuffle (which advances).
  void add_seq_own_pages(int q_len, int kv_len, int block_size, bool write_kv, std::mt19937* shuffle = nullptr) {
    std::vector<int32_t> pages(static_cast<size_t>((kv_len + block_size - 1) / block_size));
    std::iota(pages.begin(), pages.end(), static_cast<int32_t>(block_indices.size()));
    if (shuffle != nullptr) std::shuffle(pages.begin(), pages.end(), *shuffle);
    add_seq(q_len, kv_len, pages, block_size, write_kv);
  }

  // Pages of sequence s (a view into block_indices).
  std::span<const int32_t> pages_of(int s) const {
    const auto b = static_cast<size_t>(block_indptr[static_cast<size_t>(s)]);
    const auto e = static_cast<size_t>(block_indptr[static_cast<size_t>(s) + 1]);
    return std::span<const int32_t>(block_indices).subspan(b, e - b);
  }
  int num_tokens() const { return static_cast<int>(positions.size()); }
  int num_seqs() const { return static_cast<int>(kv_lens.size()); }

  // The counts and maxima, no arrays.
  ops::AttentionBatch sizes() const {
    ops::AttentionBatch b;
    b.num_seqs = num_seqs();
    b.num_tokens = num_tokens();
    b.max_q_len = max_q_len;
    b.max_kv_len = max_kv_len;
    return b;
  }
  // A view for the CPU backend: host pointers into this object.
  ops::AttentionBatch host() const {
    ops::AttentionBatch b = sizes();
    b.q_indptr = q_indptr.data();
    b.kv_lens = kv_lens.data();
    b.block_indptr = block_indptr.data();
    b.block_indices = block_indices.data();
    b.positions = positions.data();
    b.slot_mapping = slots.data();
    return b;
  }
};

}  // namespace osprey::gpu_test
