// Tokenizer: text <-> token ids, matching Hugging Face transformers 5
// (AutoTokenizer over tokenizer.json + tokenizer_config.json, or over a GGUF
// file's vocabulary via its GGUF converter) id for id.
//
// Supported pipeline pieces (anything else is refused at load, naming it):
//   model BPE (byte-level, or character-level with byte_fallback/unk/fuse_unk,
//   ignore_merges); normalizers NFC NFKC NFD NFKD Lowercase Prepend Replace
//   Strip Sequence; pre-tokenizers Split ByteLevel Digits Metaspace
//   WhitespaceSplit Sequence; post-processors TemplateProcessing ByteLevel
//   RobertaProcessing BertProcessing Sequence; decoders ByteLevel Replace
//   ByteFallback Fuse Strip Metaspace Sequence.
//
// Thread safety: a loaded Tokenizer is immutable except for an internal word
// cache that is safely shared; encode/decode may run concurrently.
// Input text that is not valid UTF-8 is read as if each malformed sequence
// were U+FFFD.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "osprey/status.h"

namespace osprey {

// Filled by the caller from GGUF metadata (tokenizer.ggml.*); plain data, no
// loader dependency.
struct GgufVocab {
  std::string model;  // "gpt2" | "llama" (SentencePiece); others refused
  std::string pre;    // tokenizer.ggml.pre, e.g. "smollm", "llama-bpe", "qwen2", "default"
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_types;  // llama.cpp: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  std::vector<std::string> merges;   // "left right"
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string chat_template;
};

namespace tok {
struct TokenizerState;
}

class Tokenizer {
 public:
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // A model folder (tokenizer.json + tokenizer_config.json) or a
  // tokenizer.json path (tokenizer_config.json beside it is read if present).
  static Expected<std::unique_ptr<Tokenizer>> from_path(const std::string& path);
  // tokenizer_config_json may be empty.
  static Expected<std::unique_ptr<Tokenizer>> from_json(std::string_view tokenizer_json,
                                                        std::string_view tokenizer_config_json);
  static Expected<std::unique_ptr<Tokenizer>> from_gguf_vocab(const GgufVocab& vocab);

  // add_special_tokens adds what the post-processor adds (BOS/EOS); special
  // token spellings in the text are matched either way.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Unknown ids are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t vocab_size() const;  // one past the largest id, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // raw vocabulary string ("" if out of range)
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  const std::string& bos_token() const;  // "" if none
  const std::string& eos_token() const;
  const std::string& chat_template() const;  // from tokenizer_config.json or GGUF; "" if none

  // Implementation access for the detokenizer and tests.
  const tok::TokenizerState& state() const { return *state_; }

 private:
  explicit Tokenizer(std::unique_ptr<tok::TokenizerState> state);
  std::unique_ptr<tok::TokenizerState> state_;
};

// Streaming decode. Without prompt_ids the concatenation of all deltas equals
// decode(ids stepped); with them it is the text those ids add after the
// prompt (so a leading space that decode would strip at the start is kept).
// A multi-byte character is never split across deltas, and U+FFFD only
// appears where the full decode has it (finish() releases a sequence that
// never completed).
class IncrementalDetokenizer {
 public:
  // prompt_ids give left context (so a generated word's leading space is
  // decoded as it is in the full text); they produce no output.
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens, std::span<const int32_t> prompt_ids = {});
  std::string step(int32_t id);  // text delta, possibly empty
  std::string finish();          // anything held back

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // decode window start
  size_t read_offset_ = 0;    // ids before this are already emitted
};

}  // namespace osprey
