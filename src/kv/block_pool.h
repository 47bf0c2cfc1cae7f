// BlockPool: the fixed set of KV pages, their reference counts and the free
// list. A page with ref count 0 is on the free list; the list's order is the
// eviction order: pop_free() takes the head, release() puts a page that still
// holds reusable (prefix-cached) contents at the tail and an empty one at the
// head, so the least recently used cached page is the first to be reused.
// Single-threaded: owned by the engine loop (no lock, no per-page mutex).
#pragma once

#include <cstdint>
#include <vector>

namespace osprey {

class BlockPool {
 public:
  explicit BlockPool(int num_blocks);

  int num_blocks() const { return num_blocks_; }
  int num_free() const { return num_free_; }
  int ref_count(int32_t block) const { return ref_[block]; }

  // Takes the head of the free list (ref 0 -> 1). Precondition: num_free() > 0.
  int32_t pop_free();
  // ref++; a page with ref 0 (a prefix-cache hit) leaves the free list.
  void acquire(int32_t block);
  // ref--; at 0 the page joins the free list, at the tail when to_tail (its
  // contents may be reused) else at the head. Returns true when it reached 0.
  bool release(int32_t block, bool to_tail);

  // Free pages from head (next reused) to tail; for tests and debugging.
  std::vector<int32_t> free_list() const;

 private:
  void unlink(int32_t b);
  void push_head(int32_t b);
  void push_tail(int32_t b);

  static constexpr int32_t kNil = -1;
  int num_blocks_ = 0;
  int num_free_ = 0;
  std::vector<int32_t> ref_;
  // Intrusive doubly linked free list; prev_/next_ are meaningful only for free pages.
  std::vector<int32_t> prev_, next_;
  int32_t head_ = kNil, tail_ = kNil;
};

}  // namespace osprey
