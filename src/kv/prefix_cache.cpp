#include "kv/prefix_cache.h"

#include <algorithm>

#include "core/check.h"

namespace osprey {

namespace {
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
}  // namespace

PrefixCache::PrefixCache(int num_blocks, int block_size)
    : block_size_(block_size), entries_(num_blocks), tokens_(static_cast<size_t>(num_blocks) * block_size) {}

uint64_t PrefixCache::hash_block(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent + 0x9e3779b97f4a7c15ULL);
  for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x632be59bd9b4e019ULL));
  return mix64(h ^ tokens.size());
}

std::optional<int32_t> PrefixCache::lookup(uint64_t key, uint64_t parent,
                                           std::span<const int32_t> tokens) const {
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  const int32_t b = it->second;
  const Entry& e = entries_[b];
  if (e.parent != parent || static_cast<int>(tokens.size()) != block_size_) return std::nullopt;
  if (!std::equal(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_))
    return std::nullopt;
  return b;
}

bool PrefixCache::insert(int32_t block, uint64_t key, uint64_t parent, std::span<const int32_t> tokens) {
  OSP_CHECK_EQ(static_cast<int>(tokens.size()), block_size_);
  Entry& e = entries_[block];
  if (e.cached) return false;
  if (map_.count(key)) return false;
  e.cached = true;
  e.key = key;
  e.parent = parent;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(block) * block_size_);
  map_.emplace(key, block);
  return true;
}

void PrefixCache::evict(int32_t block) {
  Entry& e = entries_[block];
  if (!e.cached) return;
  auto it = map_.find(e.key);
  OSP_CHECK(it != map_.end() && it->second == block);
  map_.erase(it);
  e.cached = false;
}

}  // namespace osprey
