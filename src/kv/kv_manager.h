// KvManager: the kv/ facade the Scheduler uses. Owns the BlockPool and the
// PrefixCache and keeps per-sequence BlockTables consistent with them.
//
// Invariants:
//   - Every page id in a live BlockTable holds one reference on that page.
//   - Pages registered in the prefix cache are full and never written again;
//     a shared (ref > 1) page is never written: allocate() copies it first.
//   - free() of every table returns the pool to num_free() == num_blocks().
//   - Host swap slots (num_swap_blocks, 0: swap off) are held by swapped-out
//     sequences only; swap_in() or drop_swapped() of every such sequence
//     returns num_free_swap_blocks() to num_swap_blocks().
// Single-threaded (the engine loop).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/prefix_cache.h"

namespace osprey {

struct KvStats {
  int64_t query_tokens = 0;   // prompt tokens looked up in the prefix cache
  int64_t hit_tokens = 0;     // of which served from cached pages
  int64_t evictions = 0;      // cached pages reused for other contents
  int64_t cow_copies = 0;
  int64_t swap_outs = 0;      // tables swapped out to host slots
  int64_t swap_ins = 0;
  int64_t swapped_out_pages = 0;
};

class KvManager {
 public:
  KvManager(int num_blocks, int block_size, bool enable_prefix_caching, uint64_t salt, int num_swap_blocks = 0);

  int num_blocks() const { return pool_.num_blocks(); }
  int block_size() const { return block_size_; }
  int num_free_blocks() const { return pool_.num_free(); }
  bool prefix_caching() const { return prefix_caching_; }
  const KvStats& stats() const { return stats_; }
  const BlockPool& pool() const { return pool_; }
  const PrefixCache& cache() const { return cache_; }
  int num_swap_blocks() const { return num_swap_blocks_; }
  int num_free_swap_blocks() const { return static_cast<int>(free_swap_.size()); }

  static int blocks_for(int num_tokens, int block_size) { return (num_tokens + block_size - 1) / block_size; }

  // For an empty table: takes references on the cached pages of the longest
  // cached prefix of `tokens`, at most (tokens.size() - 1) / block_size full
  // blocks so that at least one token is left to compute. Returns the number
  // of tokens matched (a multiple of block_size; 0 when caching is off).
  int match_prefix(BlockTable& table, std::span<const int32_t> tokens);

  // Makes the table hold pages for positions [0, num_computed + num_new) with
  // every page to be written (positions >= num_computed) owned exclusively;
  // appends the needed copy-on-write requests to `copies`. Returns false, and
  // changes nothing, when the pool has too few free pages.
  bool allocate(BlockTable& table, int num_computed, int num_new, std::vector<BlockCopy>& copies);
  // Pages allocate() would take from the pool.
  int pages_needed(const BlockTable& table, int num_computed, int num_new) const;

  // dst (empty) shares every page of src.
  void fork(const BlockTable& src, BlockTable& dst);

  // Offers the table's full, computed blocks (positions < num_computed) to
  // the prefix cache. tokens: the sequence's tokens, at least num_computed.
  void cache_blocks(BlockTable& table, std::span<const int32_t> tokens, int num_computed);

  // Swap out: when the host pool has a slot for each of the pages holding
  // positions [0, num_computed), appends one copy {page -> host slot} per page
  // to `copies` (to run before anything else of the step writes a page), puts
  // the slots in `host_blocks` (empty before; slot i holds page i), frees the
  // table and returns true. Otherwise changes nothing and returns false.
  bool swap_out(BlockTable& table, int num_computed, std::vector<int32_t>& host_blocks,
                std::vector<BlockCopy>& copies);
  // Swap in, for an empty table: takes fresh pages for positions
  // [0, num_swapped + num_new), appends copies {host slot i -> page i} to
  // `copies`, returns the host slots to the pool and clears host_blocks.
  // Returns false, changing nothing, when the pool has too few free pages.
  // The slots may be reused from the next step on (a step never swaps out and
  // in at once: the scheduler admits nothing in a step that preempted).
  bool swap_in(BlockTable& table, std::vector<int32_t>& host_blocks, int num_swapped, int num_new,
               std::vector<BlockCopy>& copies);
  // Returns a swapped-out sequence's host slots (it finished while swapped).
  void drop_swapped(std::vector<int32_t>& host_blocks);

  // Drops every reference of the table (last page first, so a sequence's
  // tail is evicted before its more shareable head) and clears it.
  void free(BlockTable& table);

 private:
  int32_t take_page();

  int block_size_;
  bool prefix_caching_;
  uint64_t salt_;
  BlockPool pool_;
  PrefixCache cache_;
  int num_swap_blocks_ = 0;
  std::vector<int32_t> free_swap_;  // free host slots (a stack)
  KvStats stats_;
};

}  // namespace osprey
