// PrefixCache: maps the contents of full, page-aligned blocks of tokens to the
// page that holds their KV. A block's key is a hash chain: hash(parent key,
// its block_size token ids), where the first block's parent is the cache
// salt (model + adapter), so different models never share pages. Entries
// keep the parent key and tokens, and lookups compare them, so a 64-bit hash
// collision can never hand out wrong KV.
//
// The cache holds no references: a cached page with ref count 0 sits on the
// BlockPool free list (LRU) and is dropped from the cache (evict) when the
// pool hands it out again.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace osprey {

class PrefixCache {
 public:
  PrefixCache(int num_blocks, int block_size);

  static uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens);

  // The page holding exactly this block, if cached.
  std::optional<int32_t> lookup(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const;
  // Registers `block` under key. False (nothing changes) when another page
  // already holds this key or the block is already registered.
  bool insert(int32_t block, uint64_t key, uint64_t parent, std::span<const int32_t> tokens);
  // Drops the block's entry, if any.
  void evict(int32_t block);
  bool is_cached(int32_t block) const { return entries_[block].cached; }
  size_t size() const { return map_.size(); }

 private:
  struct Entry {
    bool cached = false;
    uint64_t key = 0;
    uint64_t parent = 0;
  };
  int block_size_;
  std::vector<Entry> entries_;         // [num_blocks]
  std::vector<int32_t> tokens_;        // [num_blocks * block_size], valid when cached
  std::unordered_map<uint64_t, int32_t> map_;  // key -> page
};

}  // namespace osprey
