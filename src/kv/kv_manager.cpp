#include "kv/kv_manager.h"

#include "core/check.h"

namespace osprey {

KvManager::KvManager(int num_blocks, int block_size, bool enable_prefix_caching, uint64_t salt, int num_swap_blocks)
    : block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      salt_(salt),
      pool_(num_blocks),
      cache_(num_blocks, block_size),
      num_swap_blocks_(num_swap_blocks) {
  OSP_CHECK_GT(block_size, 0);
  OSP_CHECK_GE(num_swap_blocks, 0);
  // Slot 0 on top: slots are handed out in increasing order at first.
  for (int32_t s = num_swap_blocks - 1; s >= 0; --s) free_swap_.push_back(s);
}

int32_t KvManager::take_page() {
  const int32_t b = pool_.pop_free();
  if (cache_.is_cached(b)) {
    cache_.evict(b);
    ++stats_.evictions;
  }
  return b;
}

int KvManager::match_prefix(BlockTable& table, std::span<const int32_t> tokens) {
  OSP_CHECK(table.empty());
  if (!prefix_caching_ || tokens.empty()) return 0;
  stats_.query_tokens += static_cast<int64_t>(tokens.size());
  const int max_blocks = static_cast<int>((tokens.size() - 1) / block_size_);
  uint64_t parent = salt_;
  for (int i = 0; i < max_blocks; ++i) {
    auto blk = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t key = PrefixCache::hash_block(parent, blk);
    auto hit = cache_.lookup(key, parent, blk);
    if (!hit) break;
    pool_.acquire(*hit);
    table.blocks.push_back(*hit);
    table.hashes.push_back(key);
    parent = key;
  }
  table.num_cached_blocks = static_cast<int>(table.blocks.size());
  const int matched = static_cast<int>(table.blocks.size()) * block_size_;
  stats_.hit_tokens += matched;
  return matched;
}

int KvManager::pages_needed(const BlockTable& table, int num_computed, int num_new) const {
  const int have = static_cast<int>(table.blocks.size());
  const int need = blocks_for(num_computed + num_new, block_size_);
  int n = need > have ? need - have : 0;
  if (num_new > 0) {
    for (int i = num_computed / block_size_; i < have && i < need; ++i)
      if (pool_.ref_count(table.blocks[i]) > 1) ++n;
  }
  return n;
}

bool KvManager::allocate(BlockTable& table, int num_computed, int num_new, std::vector<BlockCopy>& copies) {
  OSP_CHECK_GE(num_new, 0);
  if (pages_needed(table, num_computed, num_new) > pool_.num_free()) return false;
  const int have = static_cast<int>(table.blocks.size());
  const int need = blocks_for(num_computed + num_new, block_size_);
  if (num_new > 0) {
    for (int i = num_computed / block_size_; i < have && i < need; ++i) {
      const int32_t old = table.blocks[i];
      if (pool_.ref_count(old) <= 1) continue;
      OSP_CHECK(!cache_.is_cached(old));  // cached pages are full, never written
      const int32_t fresh = take_page();
      copies.push_back({old, fresh});
      ++stats_.cow_copies;
      pool_.release(old, cache_.is_cached(old));
      table.blocks[i] = fresh;
      // The copied block is partial: it cannot be among the hashed full blocks.
      OSP_CHECK_LE(static_cast<int>(table.hashes.size()), i);
    }
  }
  for (int i = have; i < need; ++i) table.blocks.push_back(take_page());
  return true;
}

void KvManager::fork(const BlockTable& src, BlockTable& dst) {
  OSP_CHECK(dst.empty());
  for (int32_t b : src.blocks) pool_.acquire(b);
  dst = src;
}

void KvManager::cache_blocks(BlockTable& table, std::span<const int32_t> tokens, int num_computed) {
  if (!prefix_caching_) return;
  OSP_CHECK_LE(num_computed, static_cast<int>(tokens.size()));
  const int num_full = num_computed / block_size_;
  OSP_CHECK_LE(num_full, static_cast<int>(table.blocks.size()));
  for (int i = static_cast<int>(table.hashes.size()); i < num_full; ++i) {
    const uint64_t parent = i == 0 ? salt_ : table.hashes[i - 1];
    table.hashes.push_back(
        PrefixCache::hash_block(parent, tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_)));
  }
  for (int i = table.num_cached_blocks; i < num_full; ++i) {
    const uint64_t parent = i == 0 ? salt_ : table.hashes[i - 1];
    // A page whose key another page already holds stays unregistered (a duplicate).
    cache_.insert(table.blocks[i], table.hashes[i], parent,
                  tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_));
  }
  if (num_full > table.num_cached_blocks) table.num_cached_blocks = num_full;
}

bool KvManager::swap_out(BlockTable& table, int num_computed, std::vector<int32_t>& host_blocks,
                         std::vector<BlockCopy>& copies) {
  OSP_CHECK(host_blocks.empty());
  const int n = blocks_for(num_computed, block_size_);
  OSP_CHECK_LE(n, static_cast<int>(table.blocks.size()));
  if (n == 0 || n > num_free_swap_blocks()) return false;
  for (int i = 0; i < n; ++i) {
    const int32_t slot = free_swap_.back();
    free_swap_.pop_back();
    host_blocks.push_back(slot);
    copies.push_back({table.blocks[i], slot});
  }
  ++stats_.swap_outs;
  stats_.swapped_out_pages += n;
  free(table);
  return true;
}

bool KvManager::swap_in(BlockTable& table, std::vector<int32_t>& host_blocks, int num_swapped, int num_new,
                        std::vector<BlockCopy>& copies) {
  OSP_CHECK(table.empty());
  OSP_CHECK_EQ(static_cast<int>(host_blocks.size()), blocks_for(num_swapped, block_size_));
  std::vector<BlockCopy> none;
  if (!allocate(table, 0, num_swapped + num_new, none)) return false;
  OSP_CHECK(none.empty());
  for (size_t i = 0; i < host_blocks.size(); ++i) copies.push_back({host_blocks[i], table.blocks[i]});
  ++stats_.swap_ins;
  drop_swapped(host_blocks);
  return true;
}

void KvManager::drop_swapped(std::vector<int32_t>& host_blocks) {
  for (auto it = host_blocks.rbegin(); it != host_blocks.rend(); ++it) free_swap_.push_back(*it);
  OSP_CHECK_LE(num_free_swap_blocks(), num_swap_blocks_);
  host_blocks.clear();
}

void KvManager::free(BlockTable& table) {
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) pool_.release(*it, cache_.is_cached(*it));
  table = BlockTable{};
}

}  // namespace osprey
