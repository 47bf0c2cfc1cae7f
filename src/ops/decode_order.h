// AttentionBatch::decode_order on the host: the order in which a decode
// kernel may best take a step's sequences (ops/backend.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace osprey::ops {

// order[0, n) = the indices of kv_lens[0, n), most keys first; equal
// lengths keep their index order.
inline void longest_first_order(const int32_t* kv_lens, int n, int32_t* order) {
  std::iota(order, order + n, 0);
  std::stable_sort(order, order + n, [&](int32_t x, int32_t y) { return kv_lens[x] > kv_lens[y]; });
}

}  // namespace osprey::ops
