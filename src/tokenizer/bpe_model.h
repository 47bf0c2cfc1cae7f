// BpeModel: byte-pair encoding of one pre-tokenized word into ids.
//
// Two symbol spaces:
//  - byte level (byte_level_ == true): the word is raw bytes; each byte starts
//    as the token spelling that byte in GPT-2's alphabet, and the vocabulary
//    is keyed by the bytes a token stands for. This avoids re-spelling every
//    word and gives the same ids as spelling first.
//  - characters: the word is UTF-8; each character starts as its own token,
//    falling back to <0xXX> byte tokens (byte_fallback) or the unknown token.
// Merges apply lowest rank first, leftmost first on ties, as HF tokenizers do.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "osprey/status.h"

namespace osprey::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  bool byte_level = false;     // see above
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is itself a token is not merged
  std::optional<std::string> unk_token;
};

class BpeModel {
 public:
  // vocab: token spelling (as in tokenizer.json) -> id. merges: pairs of
  // spellings in priority order; each pair's concatenation must be in vocab.
  static Expected<std::unique_ptr<BpeModel>> create(const std::vector<std::pair<std::string, int32_t>>& vocab,
                                                    const std::vector<std::pair<std::string, std::string>>& merges,
                                                    const BpeOptions& options);

  // Appends the ids of word (raw bytes in byte-level mode, else UTF-8).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view spelling) const;
  bool byte_level() const { return opt_.byte_level; }

 private:
  BpeModel() = default;
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // indices into the symbol array; -1 at the ends
    uint32_t start, len; // byte span in the word
  };
  void initial_symbols(std::string_view word, std::vector<Symbol>& syms) const;
  void merge(std::vector<Symbol>& syms) const;
  std::optional<int32_t> lookup_model_key(std::string_view key) const;

  BpeOptions opt_;
  TokenMap vocab_;              // spelling -> id
  TokenMap bytes_vocab_;        // byte-level mode: raw bytes -> id
  std::array<int32_t, 256> byte_ids_{};      // byte-level: byte -> id, or -1
  std::array<int32_t, 256> fallback_ids_{};  // <0xXX> -> id, or -1
  std::optional<int32_t> unk_id_;
  // (left id << 32 | right id) -> (rank << 32 | merged id)
  std::unordered_map<uint64_t, uint64_t> merges_;

  // Word -> ids cache. Sharded so concurrent encodes rarely contend.
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheMaxWordBytes = 256;
  static constexpr size_t kCacheMaxEntriesPerShard = 1 << 14;
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace osprey::tok
