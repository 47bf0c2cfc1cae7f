// TextCodec: the tokenizer as the engine uses it (encode on the caller's
// thread, decode and streaming detokenization on the output workers). The
// real one wraps osprey::Tokenizer; tests use a fake.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace osprey {

class Tokenizer;

class StreamDecoder {
 public:
  virtual ~StreamDecoder() = default;
  virtual std::string step(int32_t id) = 0;  // UTF-8-safe text delta
  virtual std::string finish() = 0;          // what was held back
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;
  // prompt: left context (a tail of the prompt is enough).
  virtual std::unique_ptr<StreamDecoder> stream_decoder(bool skip_special_tokens,
                                                        std::span<const int32_t> prompt) const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
};

std::unique_ptr<TextCodec> make_tokenizer_codec(std::shared_ptr<const Tokenizer> tokenizer);

}  // namespace osprey
