#include "kv/block_pool.h"

#include "core/check.h"

namespace osprey {

BlockPool::BlockPool(int num_blocks)
    : num_blocks_(num_blocks), ref_(num_blocks, 0), prev_(num_blocks, kNil), next_(num_blocks, kNil) {
  OSP_CHECK_GE(num_blocks, 0);
  for (int32_t b = 0; b < num_blocks; ++b) push_tail(b);
}

void BlockPool::unlink(int32_t b) {
  const int32_t p = prev_[b], n = next_[b];
  if (p != kNil) next_[p] = n; else head_ = n;
  if (n != kNil) prev_[n] = p; else tail_ = p;
  prev_[b] = next_[b] = kNil;
  --num_free_;
}

void BlockPool::push_head(int32_t b) {
  prev_[b] = kNil;
  next_[b] = head_;
  if (head_ != kNil) prev_[head_] = b; else tail_ = b;
  head_ = b;
  ++num_free_;
}

void BlockPool::push_tail(int32_t b) {
  next_[b] = kNil;
  prev_[b] = tail_;
  if (tail_ != kNil) next_[tail_] = b; else head_ = b;
  tail_ = b;
  ++num_free_;
}

int32_t BlockPool::pop_free() {
  OSP_CHECK_GT(num_free_, 0);
  const int32_t b = head_;
  unlink(b);
  OSP_CHECK_EQ(ref_[b], 0);
  ref_[b] = 1;
  return b;
}

void BlockPool::acquire(int32_t block) {
  OSP_CHECK(block >= 0 && block < num_blocks_);
  if (ref_[block] == 0) unlink(block);
  ++ref_[block];
}

bool BlockPool::release(int32_t block, bool to_tail) {
  OSP_CHECK(block >= 0 && block < num_blocks_);
  OSP_CHECK_GT(ref_[block], 0);
  if (--ref_[block] > 0) return false;
  if (to_tail) push_tail(block); else push_head(block);
  return true;
}

std::vector<int32_t> BlockPool::free_list() const {
  std::vector<int32_t> out;
  for (int32_t b = head_; b != kNil; b = next_[b]) out.push_back(b);
  return out;
}

}  // namespace osprey
