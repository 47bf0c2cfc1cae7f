#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "core/hash.h"
#include "tokenizer/unicode_text.h"

namespace osprey::tok {

size_t StringHash::operator()(std::string_view s) const noexcept {
  // FNV-1a, 64-bit: short keys dominate, so a simple byte loop is fastest.
  const uint64_t h = fnv1a64(s);
  return static_cast<size_t>(h ^ (h >> 29));
}

Expected<std::unique_ptr<BpeModel>> BpeModel::create(
    const std::vector<std::pair<std::string, int32_t>>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->opt_ = options;
  m->vocab_.reserve(vocab.size() * 2);
  for (const auto& [tok, id] : vocab) m->vocab_[tok] = id;
  m->byte_ids_.fill(-1);
  m->fallback_ids_.fill(-1);
  if (options.byte_level) {
    std::string bytes;
    m->bytes_vocab_.reserve(vocab.size() * 2);
    for (const auto& [tok, id] : m->vocab_) {
      if (byte_level_to_bytes(tok, bytes)) m->bytes_vocab_[bytes] = id;
    }
    const auto& table = byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      std::string spelled;
      append_utf8(spelled, table[b]);
      if (auto it = m->vocab_.find(spelled); it != m->vocab_.end()) m->byte_ids_[b] = it->second;
    }
  }
  if (options.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (auto it = m->vocab_.find(std::string_view(name)); it != m->vocab_.end()) m->fallback_ids_[b] = it->second;
    }
  }
  if (options.unk_token) {
    auto it = m->vocab_.find(*options.unk_token);
    if (it == m->vocab_.end())
      return invalid_argument("BPE unk_token '" + *options.unk_token + "' is not in the vocabulary");
    m->unk_id_ = it->second;
  }
  m->merges_.reserve(merges.size() * 2);
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = m->vocab_.find(a), ib = m->vocab_.find(b);
    joined = a;
    joined += b;
    auto ij = m->vocab_.find(joined);
    if (ia == m->vocab_.end() || ib == m->vocab_.end() || ij == m->vocab_.end())
      return invalid_argument("BPE merge '" + a + " " + b + "' (rank " + std::to_string(rank) +
                              ") uses a token missing from the vocabulary");
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                   static_cast<uint32_t>(ib->second);
    // The first (best-ranked) occurrence of a pair wins.
    m->merges_.emplace(key, (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(ij->second));
  }
  m->cache_.reset(new CacheShard[kCacheShards]);
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view spelling) const {
  if (auto it = vocab_.find(spelling); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::optional<int32_t> BpeModel::lookup_model_key(std::string_view key) const {
  const TokenMap& map = opt_.byte_level ? bytes_vocab_ : vocab_;
  if (auto it = map.find(key); it != map.end()) return it->second;
  return std::nullopt;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<Symbol>& syms) const {
  syms.clear();
  auto push = [&](int32_t id, size_t start, size_t len) {
    int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back({id, idx - 1, -1, static_cast<uint32_t>(start), static_cast<uint32_t>(len)});
    if (idx > 0) syms[idx - 1].next = idx;
  };
  if (opt_.byte_level) {
    for (size_t i = 0; i < word.size(); ++i) {
      int32_t id = byte_ids_[static_cast<uint8_t>(word[i])];
      if (id >= 0) push(id, i, 1);  // a byte the vocabulary lacks is dropped, as HF does without unk
    }
    return;
  }
  bool prev_unk = false;
  size_t i = 0;
  while (i < word.size()) {
    size_t start = i;
    i += utf8_len(static_cast<uint8_t>(word[i]));
    if (i > word.size()) i = word.size();
    std::string_view ch = word.substr(start, i - start);
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      push(it->second, start, ch.size());
      prev_unk = false;
      continue;
    }
    if (opt_.byte_fallback) {
      bool all = true;
      for (char b : ch) all = all && fallback_ids_[static_cast<uint8_t>(b)] >= 0;
      if (all) {
        for (size_t k = 0; k < ch.size(); ++k) push(fallback_ids_[static_cast<uint8_t>(ch[k])], start + k, 1);
        prev_unk = false;
        continue;
      }
    }
    if (!unk_id_) continue;  // no unknown token: the character is dropped
    if (opt_.fuse_unk && prev_unk) {
      syms.back().len += static_cast<uint32_t>(ch.size());
    } else {
      push(*unk_id_, start, ch.size());
    }
    prev_unk = true;
  }
}

void BpeModel::merge(std::vector<Symbol>& syms) const {
  if (syms.size() < 2) return;
  struct Cand {
    uint32_t rank;
    int32_t pos;      // index of the left symbol
    int32_t new_id;
    int32_t left_id, right_id;  // to detect stale entries
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  auto lookup = [&](int32_t a, int32_t b, uint64_t& v) {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    if (it == merges_.end()) return false;
    v = it->second;
    return true;
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  uint64_t v;
  for (size_t i = 0; i + 1 < syms.size(); ++i) {
    if (lookup(syms[i].id, syms[i + 1].id, v))
      heap.push({static_cast<uint32_t>(v >> 32), static_cast<int32_t>(i), static_cast<int32_t>(v & 0xffffffffu),
                 syms[i].id, syms[i + 1].id});
  }
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Symbol& l = syms[c.pos];
    if (l.len == 0 || l.id != c.left_id || l.next < 0) continue;  // removed or changed
    Symbol& r = syms[l.next];
    if (r.id != c.right_id) continue;
    // Merge r into l.
    l.id = c.new_id;
    l.len += r.len;
    int32_t rn = r.next;
    r.len = 0;
    l.next = rn;
    if (rn >= 0) syms[rn].prev = c.pos;
    if (l.prev >= 0 && lookup(syms[l.prev].id, l.id, v))
      heap.push({static_cast<uint32_t>(v >> 32), l.prev, static_cast<int32_t>(v & 0xffffffffu), syms[l.prev].id, l.id});
    if (rn >= 0 && lookup(l.id, syms[rn].id, v))
      heap.push({static_cast<uint32_t>(v >> 32), c.pos, static_cast<int32_t>(v & 0xffffffffu), l.id, syms[rn].id});
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (opt_.ignore_merges) {
    if (auto id = lookup_model_key(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  CacheShard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[StringHash{}(word) % kCacheShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    if (auto it = shard->map.find(word); it != shard->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<Symbol> syms;
  initial_symbols(word, syms);
  merge(syms);
  size_t first = out.size();
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    if (shard->map.size() >= kCacheMaxEntriesPerShard) shard->map.clear();
    shard->map.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

}  // namespace osprey::tok
