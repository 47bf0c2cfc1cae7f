// BlockTable: the pages of one sequence, in position order. Position p lives
// in page blocks[p / block_size], row p % block_size.
#pragma once

#include <cstdint>
#include <vector>

namespace osprey {

struct BlockTable {
  std::vector<int32_t> blocks;
  // Prefix-cache keys of the leading full, computed blocks (hashes.size() <= blocks.size()).
  std::vector<uint64_t> hashes;
  // Leading blocks already offered to the prefix cache.
  int num_cached_blocks = 0;

  bool empty() const { return blocks.empty(); }
};

// A request to the executor: copy every layer's page `src` into page `dst`
// before the step's forward (copy-on-write of a shared partial page).
struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

}  // namespace osprey
