// Finds a model's tokenizer: the vocabulary inside its GGUF file, or the
// tokenizer.json (+ tokenizer_config.json) in its folder.
#pragma once

#include <memory>

#include "engine/text_codec.h"
#include "osprey/status.h"
#include "tokenizer/tokenizer.h"

namespace osprey {

class Model;
class GgufFile;

// The model's tokenizer: ModelLoadOptions::tokenizer when set (a folder,
// tokenizer.json or .gguf), else the vocabulary inside its GGUF file or the
// tokenizer.json in its folder. A dummy model without --tokenizer has none:
// NotFound (see load_model_text).
Expected<std::unique_ptr<Tokenizer>> load_tokenizer_for_model(const Model& model);

// The text side of an engine for a model: its tokenizer and the codec made
// from it; for a dummy model without a tokenizer, tokenizer is null and the
// codec takes token ids only (decode writes each id as "<id>", encode of
// text yields no tokens, so the engine refuses text prompts).
struct ModelText {
  std::shared_ptr<const Tokenizer> tokenizer;  // null: ids only
  std::unique_ptr<TextCodec> codec;
};
Expected<ModelText> load_model_text(const Model& model);
// The ids-only codec of a model without a tokenizer (eos: eos_id if >= 0).
std::unique_ptr<TextCodec> make_id_codec(int32_t eos_id);
// GGUF tokenizer.ggml.* metadata -> GgufVocab (plain data for the tokenizer).
Expected<GgufVocab> gguf_vocab_from_file(const GgufFile& gguf);
// path: a model folder, a tokenizer.json, or a .gguf file (only its metadata is read).
Expected<std::unique_ptr<Tokenizer>> load_tokenizer_from_path(const std::string& path);

}  // namespace osprey
