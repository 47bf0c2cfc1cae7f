#include <gtest/gtest.h>

#include <random>

#include "kv/block_pool.h"
#include "kv/kv_manager.h"
#include "kv/prefix_cache.h"

namespace osprey {
namespace {

TEST(BlockPool, AllocatesEveryPageOnceAndRefCounts) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_free(), 4);
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(pool.pop_free());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(pool.num_free(), 0);
  pool.acquire(2);
  EXPECT_EQ(pool.ref_count(2), 2);
  EXPECT_FALSE(pool.release(2, false));
  EXPECT_TRUE(pool.release(2, false));
  EXPECT_EQ(pool.num_free(), 1);
}

TEST(BlockPool, FreeListIsEvictionOrder) {
  BlockPool pool(5);
  for (int i = 0; i < 5; ++i) pool.pop_free();
  pool.release(3, true);   // cached: tail
  pool.release(1, true);   // cached, more recent: after 3
  pool.release(4, false);  // empty: head, reused first
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{4, 3, 1}));
  pool.acquire(3);  // a prefix hit takes it off the list
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{4, 1}));
  pool.release(3, true);
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{4, 1, 3}));
  EXPECT_EQ(pool.pop_free(), 4);
  EXPECT_EQ(pool.pop_free(), 1);
}

TEST(PrefixCache, LookupVerifiesContentsAndParent) {
  PrefixCache cache(4, 2);
  const int32_t a[2] = {1, 2}, b[2] = {1, 3};
  const uint64_t ka = PrefixCache::hash_block(7, a);
  EXPECT_TRUE(cache.insert(0, ka, 7, a));
  EXPECT_FALSE(cache.insert(1, ka, 7, a));  // duplicate key
  EXPECT_EQ(cache.lookup(ka, 7, a), 0);
  EXPECT_FALSE(cache.lookup(ka, 8, a).has_value());  // other salt / parent
  EXPECT_FALSE(cache.lookup(ka, 7, b).has_value());  // forced collision, other tokens
  cache.evict(0);
  EXPECT_FALSE(cache.lookup(ka, 7, a).has_value());
  EXPECT_NE(PrefixCache::hash_block(7, a), PrefixCache::hash_block(8, a));
}

std::vector<int32_t> seq(int n, int start = 1) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

TEST(KvManager, AllocateGrowsByPagesAndFailsWithoutChange) {
  KvManager kv(3, 4, true, 1);
  BlockTable t;
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(t, 0, 5, copies));  // 2 pages
  EXPECT_EQ(t.blocks.size(), 2u);
  ASSERT_TRUE(kv.allocate(t, 5, 3, copies));  // fits page 2
  EXPECT_EQ(t.blocks.size(), 2u);
  ASSERT_TRUE(kv.allocate(t, 8, 1, copies));
  EXPECT_EQ(t.blocks.size(), 3u);
  BlockTable u;
  EXPECT_FALSE(kv.allocate(u, 0, 1, copies));
  EXPECT_TRUE(u.blocks.empty());
  EXPECT_TRUE(copies.empty());
  kv.free(t);
  EXPECT_EQ(kv.num_free_blocks(), 3);
}

TEST(KvManager, PrefixMatchLeavesAtLeastOneTokenToCompute) {
  KvManager kv(8, 4, true, 1);
  auto tokens = seq(8);
  BlockTable t;
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(t, 0, 8, copies));
  kv.cache_blocks(t, tokens, 8);
  kv.free(t);
  BlockTable u;
  EXPECT_EQ(kv.match_prefix(u, tokens), 4);  // not 8: the last token must be computed
  kv.free(u);
  auto longer = seq(11);
  BlockTable w;
  EXPECT_EQ(kv.match_prefix(w, longer), 8);
  EXPECT_EQ(kv.stats().hit_tokens, 12);
  kv.free(w);
  EXPECT_EQ(kv.num_free_blocks(), 8);
}

TEST(KvManager, EvictsLeastRecentlyUsedCachedPagesFirst) {
  KvManager kv(4, 2, true, 1);
  std::vector<BlockCopy> copies;
  auto a = seq(4, 10), b = seq(4, 20);
  BlockTable ta, tb;
  ASSERT_TRUE(kv.allocate(ta, 0, 4, copies));
  kv.cache_blocks(ta, a, 4);
  ASSERT_TRUE(kv.allocate(tb, 0, 4, copies));
  kv.cache_blocks(tb, b, 4);
  kv.free(ta);  // a's pages become least recent
  kv.free(tb);
  // Touch a again: now b is the least recent.
  auto a_ext = a;
  a_ext.push_back(99);
  BlockTable ta2;
  EXPECT_EQ(kv.match_prefix(ta2, a_ext), 4);
  kv.free(ta2);
  // Needing two fresh pages evicts b's, in order: b's tail block first.
  BlockTable tc;
  ASSERT_TRUE(kv.allocate(tc, 0, 4, copies));
  EXPECT_EQ(kv.stats().evictions, 2);
  kv.free(tc);
  BlockTable check;
  auto b_ext = b;
  b_ext.push_back(1);
  EXPECT_EQ(kv.match_prefix(check, b_ext), 0);
  kv.free(check);
  BlockTable check_a;
  EXPECT_EQ(kv.match_prefix(check_a, a_ext), 4);
  kv.free(check_a);
}

TEST(KvManager, ForkSharesAndCopyOnWriteOnlyPartialPage) {
  KvManager kv(10, 4, false, 1);
  std::vector<BlockCopy> copies;
  BlockTable parent;
  ASSERT_TRUE(kv.allocate(parent, 0, 6, copies));  // pages p0 (full), p1 (2 of 4)
  BlockTable child;
  kv.fork(parent, child);
  EXPECT_EQ(kv.pool().ref_count(parent.blocks[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(parent.blocks[1]), 2);
  EXPECT_EQ(kv.pages_needed(child, 6, 1), 1);
  ASSERT_TRUE(kv.allocate(child, 6, 1, copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, parent.blocks[1]);
  EXPECT_EQ(copies[0].dst, child.blocks[1]);
  EXPECT_EQ(child.blocks[0], parent.blocks[0]);  // the full page stays shared
  EXPECT_NE(child.blocks[1], parent.blocks[1]);
  copies.clear();
  ASSERT_TRUE(kv.allocate(parent, 6, 1, copies));  // now exclusive: no copy
  EXPECT_TRUE(copies.empty());
  kv.free(parent);
  kv.free(child);
  EXPECT_EQ(kv.num_free_blocks(), 10);
}

TEST(KvManager, SwapOutAndInCopiesComputedPagesAndAccountsSlots) {
  KvManager kv(8, 4, true, 1, /*num_swap_blocks=*/3);
  EXPECT_EQ(kv.num_swap_blocks(), 3);
  EXPECT_EQ(kv.num_free_swap_blocks(), 3);
  std::vector<BlockCopy> copies;
  BlockTable t;
  ASSERT_TRUE(kv.allocate(t, 0, 10, copies));  // 3 pages, the last holds 2 tokens
  const std::vector<int32_t> pages = t.blocks;
  std::vector<int32_t> host;
  std::vector<BlockCopy> out;
  ASSERT_TRUE(kv.swap_out(t, 10, host, out));
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(kv.num_free_blocks(), 8);
  EXPECT_EQ(kv.num_free_swap_blocks(), 0);
  ASSERT_EQ(out.size(), 3u);
  ASSERT_EQ(host.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].src, pages[i]);
    EXPECT_EQ(out[i].dst, host[i]);
  }
  // No room for a second table: nothing changes.
  BlockTable u;
  ASSERT_TRUE(kv.allocate(u, 0, 1, copies));
  std::vector<int32_t> host_u;
  std::vector<BlockCopy> out_u;
  EXPECT_FALSE(kv.swap_out(u, 1, host_u, out_u));
  EXPECT_EQ(u.blocks.size(), 1u);
  EXPECT_TRUE(host_u.empty());
  EXPECT_TRUE(out_u.empty());
  kv.free(u);
  // Swap in with room for 1 more token: 3 pages, copies host[i] -> page i.
  std::vector<BlockCopy> in;
  ASSERT_TRUE(kv.swap_in(t, host, 10, 1, in));
  EXPECT_TRUE(host.empty());
  EXPECT_EQ(kv.num_free_swap_blocks(), 3);
  ASSERT_EQ(t.blocks.size(), 3u);
  ASSERT_EQ(in.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(in[i].src, out[i].dst);
    EXPECT_EQ(in[i].dst, t.blocks[i]);
  }
  EXPECT_EQ(kv.stats().swap_outs, 1);
  EXPECT_EQ(kv.stats().swap_ins, 1);
  kv.free(t);
  EXPECT_EQ(kv.num_free_blocks(), 8);
}

TEST(KvManager, SwapInWithoutFreePagesChangesNothing) {
  KvManager kv(3, 4, false, 1, 4);
  std::vector<BlockCopy> copies;
  BlockTable t;
  ASSERT_TRUE(kv.allocate(t, 0, 8, copies));
  std::vector<int32_t> host;
  std::vector<BlockCopy> out;
  ASSERT_TRUE(kv.swap_out(t, 8, host, out));
  BlockTable other;
  ASSERT_TRUE(kv.allocate(other, 0, 9, copies));  // takes all 3 pages
  std::vector<BlockCopy> in;
  EXPECT_FALSE(kv.swap_in(t, host, 8, 1, in));
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(host.size(), 2u);
  EXPECT_TRUE(in.empty());
  EXPECT_EQ(kv.num_free_swap_blocks(), 2);
  kv.drop_swapped(host);
  EXPECT_EQ(kv.num_free_swap_blocks(), 4);
  kv.free(other);
  EXPECT_EQ(kv.num_free_blocks(), 3);
}

TEST(KvManager, RandomOperationsNeverLeak) {
  std::mt19937 rng(3);
  KvManager kv(64, 4, true, 5);
  struct S {
    BlockTable t;
    std::vector<int32_t> tokens;
    int computed = 0;
  };
  std::vector<S> live;
  for (int it = 0; it < 20000; ++it) {
    const int op = rng() % 5;
    std::vector<BlockCopy> copies;
    if (op == 0 || live.empty()) {
      S s;
      s.tokens.resize(1 + rng() % 30);
      for (auto& x : s.tokens) x = rng() % 4;  // few values: many prefix hits
      s.computed = kv.match_prefix(s.t, s.tokens);
      if (kv.allocate(s.t, s.computed, static_cast<int>(s.tokens.size()) - s.computed, copies)) {
        s.computed = static_cast<int>(s.tokens.size());
        kv.cache_blocks(s.t, s.tokens, s.computed);
        live.push_back(std::move(s));
      } else {
        kv.free(s.t);
      }
    } else if (op == 1) {
      S& s = live[rng() % live.size()];
      S c;
      c.tokens = s.tokens;
      c.computed = s.computed;
      kv.fork(s.t, c.t);
      live.push_back(std::move(c));
    } else if (op == 2) {
      S& s = live[rng() % live.size()];
      s.tokens.push_back(rng() % 4);
      if (kv.allocate(s.t, s.computed, 1, copies)) {
        for (const auto& cp : copies) EXPECT_NE(cp.src, cp.dst);
        // The page written next is owned by this sequence alone.
        EXPECT_EQ(kv.pool().ref_count(s.t.blocks[s.computed / 4]), 1);
        s.computed += 1;
        kv.cache_blocks(s.t, s.tokens, s.computed);
      } else {
        s.tokens.pop_back();
      }
    } else {
      const size_t i = rng() % live.size();
      kv.free(live[i].t);
      live.erase(live.begin() + static_cast<long>(i));
    }
  }
  for (S& s : live) kv.free(s.t);
  EXPECT_EQ(kv.num_free_blocks(), 64);
  EXPECT_GT(kv.stats().hit_tokens, 0);
  EXPECT_GT(kv.stats().evictions, 0);
  EXPECT_GT(kv.stats().cow_copies, 0);
}

}  // namespace
}  // namespace osprey
