// TokenizerState: the assembled pipeline behind osprey::Tokenizer. Built by
// tokenizer_json.cpp (tokenizer.json) or tokenizer_gguf.cpp (GGUF vocab).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace osprey::tok {

// What the post-processor puts around the encoded sequence when
// add_special_tokens is true.
struct PostTemplate {
  std::vector<int32_t> before, after;
};

struct TokenizerState {
  std::unique_ptr<Normalizer> normalizer;      // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer; // may be null
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;            // null: tokens joined with " "
  PostTemplate post;

  std::vector<AddedToken> added;               // in load order
  AddedTokenMatcher raw_matcher;               // added tokens with normalized == false
  AddedTokenMatcher normalized_matcher;        // the rest, by their normalised spelling

  std::vector<std::string> id_to_token;        // every id (model and added); "" for holes
  std::vector<uint8_t> special;                // per id: 1 for special added tokens
  std::vector<uint8_t> is_added;               // per id: 1 for added tokens
  TokenMap token_to_id;                        // model vocab and added tokens

  std::string bos_token, eos_token, chat_template;

  // Registers an added token (or updates the flags of an existing one with
  // the same content). id < 0 assigns the model's id for that spelling, or the
  // next free id.
  void add_token(AddedToken t);
  // Builds the matchers; call once after all add_token calls.
  void finalize();
};

}  // namespace osprey::tok
