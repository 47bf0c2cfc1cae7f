// Finds a model's tokenizer: the vocabulary inside its GGUF file, or the
// tokenizer.json (+ tokenizer_config.json) in its folder.
#pragma once

#include <memory>

#include "osprey/status.h"
#include "tokenizer/tokenizer.h"

namespace osprey {

class Model;
class GgufFile;

Expected<std::unique_ptr<Tokenizer>> load_tokenizer_for_model(const Model& model);
// GGUF tokenizer.ggml.* metadata -> GgufVocab (plain data for the tokenizer).
Expected<GgufVocab> gguf_vocab_from_file(const GgufFile& gguf);
// path: a model folder, a tokenizer.json, or a .gguf file (only its metadata is read).
Expected<std::unique_ptr<Tokenizer>> load_tokenizer_from_path(const std::string& path);

}  // namespace osprey
