#include "engine/text_codec.h"
#include "tokenizer/tokenizer.h"

namespace osprey {

namespace {

class TokenizerStreamDecoder final : public StreamDecoder {
 public:
  TokenizerStreamDecoder(const Tokenizer& tok, bool skip, std::span<const int32_t> prompt)
      : detok_(tok, skip, prompt) {}
  std::string step(int32_t id) override { return detok_.step(id); }
  std::string finish() override { return detok_.finish(); }

 private:
  IncrementalDetokenizer detok_;
};

class TokenizerCodec final : public TextCodec {
 public:
  explicit TokenizerCodec(std::shared_ptr<const Tokenizer> tok) : tok_(std::move(tok)) {}
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    return tok_->encode(text, add_special);
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    return tok_->decode(ids, skip_special);
  }
  std::unique_ptr<StreamDecoder> stream_decoder(bool skip_special, std::span<const int32_t> prompt) const override {
    // A few prompt tokens give the left context the detokenizer needs.
    constexpr size_t kContext = 8;
    if (prompt.size() > kContext) prompt = prompt.subspan(prompt.size() - kContext);
    return std::make_unique<TokenizerStreamDecoder>(*tok_, skip_special, prompt);
  }
  std::optional<int32_t> eos_id() const override { return tok_->eos_id(); }

 private:
  std::shared_ptr<const Tokenizer> tok_;
};

}  // namespace

std::unique_ptr<TextCodec> make_tokenizer_codec(std::shared_ptr<const Tokenizer> tokenizer) {
  return std::make_unique<TokenizerCodec>(std::move(tokenizer));
}

}  // namespace osprey
