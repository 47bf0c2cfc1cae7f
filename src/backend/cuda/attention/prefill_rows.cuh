// Block bookkeeping shared by the prefill attention kernels (wmma, mma.sync
// and wgmma): which rows a block owns and where their q lives.
//
// A prefill block owns kM consecutive rows of one (sequence, KV head): row
// (t - q_begin) * group + j is query token t's head kvh * group + j, so the
// G query heads of a KV head share every K/V tile.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace osprey::cuda {

struct PrefillRows {
  int group;       // query heads per KV head
  int q_begin;     // the sequence's first token in the step
  int total_rows;  // the sequence's query tokens x group
  int row0;        // the block's first row
};

// Longest first: block b's row tile counts down from the last one with
// (sequence, KV head) fastest, so every sequence and KV head's longest
// causal tile is issued before any shorter one.
__device__ __forceinline__ void prefill_block_longest_first(const PagedAttentionArgs& a, int tiles_per_seq, int b,
                                                            int& seq, int& kvh, int& tile) {
  const int per_rank = a.num_seqs * a.hk;
  const int rank = b / per_rank;
  const int rem = b - rank * per_rank;
  seq = rem / a.hk;
  kvh = rem - seq * a.hk;
  tile = tiles_per_seq - 1 - rank;
}

// Rows of tile `tile` (kM rows a tile) of sequence seq (any KV head). The
// block has nothing to do when row0 >= total_rows.
__device__ __forceinline__ PrefillRows prefill_rows(const PagedAttentionArgs& a, int seq, int tile, int kM) {
  PrefillRows p;
  p.group = a.hq / a.hk;
  p.q_begin = a.q_indptr[seq];
  p.total_rows = (a.q_indptr[seq + 1] - p.q_begin) * p.group;
  p.row0 = tile * kM;
  return p;
}

// Element offset of the sequence's query token t (counted from q_begin),
// head j of KV head kvh's group, in a [num_tokens, hq, kHd] tensor (q or
// out).
template <int kHd>
__device__ __forceinline__ int64_t prefill_head_offset(const PagedAttentionArgs& a, const PrefillRows& p, int kvh,
                                                       int t, int j) {
  const int token = p.q_begin + t;
  const int head = kvh * p.group + j;
  return (static_cast<int64_t>(token) * a.hq + head) * kHd;
}

// Element offset of block row r (KV head kvh) in a [num_tokens, hq, kHd]
// tensor (q or out), or -1 for a row past the sequence.
template <int kHd>
__device__ __forceinline__ int64_t prefill_row_offset(const PagedAttentionArgs& a, const PrefillRows& p, int kvh,
                                                      int r) {
  const int grow = p.row0 + r;
  if (grow >= p.total_rows) return -1;
  return prefill_head_offset<kHd>(a, p, kvh, grow / p.group, grow % p.group);
}

// The 16-byte chunk c of block row r's q (head_dim kHd, KV head kvh), or
// nullptr for a row past the sequence (to be zero-filled).
template <class T, int kHd>
__device__ __forceinline__ const T* prefill_q_chunk(const PagedAttentionArgs& a, const PrefillRows& p, int kvh, int r,
                                                    int c) {
  const int64_t off = prefill_row_offset<kHd>(a, p, kvh, r);
  return off < 0 ? nullptr : static_cast<const T*>(a.q) + off + c * 8;
}

}  // namespace osprey::cuda
