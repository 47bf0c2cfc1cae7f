#include "engine/tokenizer_loader.h"

#include <filesystem>

#include "loader/gguf_file.h"
#include "model/model.h"

namespace osprey {

Expected<GgufVocab> gguf_vocab_from_file(const GgufFile& g) {
  GgufVocab v;
  auto model = g.get_string("tokenizer.ggml.model");
  if (!model) return not_found(g.name() + ": no tokenizer.ggml.model key (the file has no vocabulary)");
  v.model = *model;
  v.pre = g.get_string("tokenizer.ggml.pre").value_or("default");
  const auto* tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) return corrupt(g.name() + ": tokenizer.ggml.tokens is missing or empty");
  v.tokens = *tokens;
  if (auto scores = g.get_float_array("tokenizer.ggml.scores")) {
    v.scores.assign(scores->begin(), scores->end());
    if (v.scores.size() != v.tokens.size()) return corrupt(g.name() + ": tokenizer.ggml.scores length differs from tokens");
  }
  if (auto types = g.get_int_array("tokenizer.ggml.token_type")) {
    v.token_types.assign(types->begin(), types->end());
    if (v.token_types.size() != v.tokens.size())
      return corrupt(g.name() + ": tokenizer.ggml.token_type length differs from tokens");
  }
  if (const auto* merges = g.get_string_array("tokenizer.ggml.merges")) v.merges = *merges;
  const int64_t n = static_cast<int64_t>(v.tokens.size());
  auto id = [&](const char* key, int32_t& out) -> Status {
    if (auto x = g.get_int(key)) {
      if (*x < 0 || *x >= n) return corrupt(g.name() + ": " + key + " = " + std::to_string(*x) + " is out of range");
      out = static_cast<int32_t>(*x);
    }
    return Status::Ok();
  };
  OSP_RETURN_IF_ERROR(id("tokenizer.ggml.bos_token_id", v.bos_id));
  OSP_RETURN_IF_ERROR(id("tokenizer.ggml.eos_token_id", v.eos_id));
  OSP_RETURN_IF_ERROR(id("tokenizer.ggml.unknown_token_id", v.unk_id));
  OSP_RETURN_IF_ERROR(id("tokenizer.ggml.padding_token_id", v.pad_id));
  if (auto x = g.get_int("tokenizer.ggml.add_bos_token")) v.add_bos = *x != 0;
  if (auto x = g.get_int("tokenizer.ggml.add_eos_token")) v.add_eos = *x != 0;
  if (auto x = g.get_int("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *x != 0;
  v.chat_template = g.get_string("tokenizer.chat_template").value_or("");
  return v;
}

Expected<std::unique_ptr<Tokenizer>> load_tokenizer_for_model(const Model& model) {
  const std::string& chosen = model.load_options().tokenizer;
  if (!chosen.empty()) return load_tokenizer_from_path(chosen);
  if (model.is_dummy()) {
    return not_found("the dummy model '" + model.path() +
                     "' has no tokenizer: give one (--tokenizer) or send token ids");
  }
  if (const GgufFile* g = model.gguf()) {
    OSP_ASSIGN_OR_RETURN(GgufVocab v, gguf_vocab_from_file(*g));
    return Tokenizer::from_gguf_vocab(v);
  }
  return Tokenizer::from_path(model.path());
}

Expected<std::unique_ptr<Tokenizer>> load_tokenizer_from_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec) && fs::path(path).extension() == ".gguf") {
    OSP_ASSIGN_OR_RETURN(auto g, GgufFile::open(path));
    OSP_ASSIGN_OR_RETURN(GgufVocab v, gguf_vocab_from_file(*g));
    return Tokenizer::from_gguf_vocab(v);
  }
  return Tokenizer::from_path(path);
}

namespace {

class IdDecoder final : public StreamDecoder {
 public:
  std::string step(int32_t id) override { return "<" + std::to_string(id) + ">"; }
  std::string finish() override { return {}; }
};

class IdCodec final : public TextCodec {
 public:
  explicit IdCodec(int32_t eos) : eos_(eos) {}
  std::vector<int32_t> encode(std::string_view, bool) const override { return {}; }
  std::string decode(std::span<const int32_t> ids, bool) const override {
    std::string out;
    for (int32_t id : ids) out += "<" + std::to_string(id) + ">";
    return out;
  }
  std::unique_ptr<StreamDecoder> stream_decoder(bool, std::span<const int32_t>) const override {
    return std::make_unique<IdDecoder>();
  }
  std::optional<int32_t> eos_id() const override {
    return eos_ >= 0 ? std::optional<int32_t>(eos_) : std::nullopt;
  }

 private:
  int32_t eos_;
};

}  // namespace

std::unique_ptr<TextCodec> make_id_codec(int32_t eos_id) {
  return std::make_unique<IdCodec>(eos_id);
}

Expected<ModelText> load_model_text(const Model& model) {
  ModelText text;
  if (model.is_dummy() && model.load_options().tokenizer.empty()) {
    const auto& eos = model.config().eos_token_ids;
    text.codec = make_id_codec(eos.empty() ? -1 : eos.front());
    return text;
  }
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, load_tokenizer_for_model(model));
  text.tokenizer = std::shared_ptr<const Tokenizer>(std::move(tokenizer));
  text.codec = make_tokenizer_codec(text.tokenizer);
  return text;
}

}  // namespace osprey
