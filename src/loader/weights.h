// load_weights: opens a model's weights (a Hugging Face folder or a GGUF
// file) and exposes them as Tensors under canonical Hugging Face names.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "loader/gguf_file.h"
#include "osprey/status.h"

namespace osprey {

struct LoadedWeights {
  enum class Format { kHfFolder, kGguf } format = Format::kHfFolder;
  std::string path;
  // Canonical Hugging Face names: model.embed_tokens.weight,
  // model.layers.N.self_attn.{q,k,v,o}_proj.weight, {q,k,v}_proj.bias,
  // self_attn.{q,k}_norm.weight, model.layers.N.{input,post_attention}_layernorm.weight,
  // model.layers.N.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight
  // (absent when the embeddings are tied). GGUF tensors osprey does not map
  // keep their GGUF names. Shapes are row-major [out, in] as in PyTorch.
  // Tensors are CPU, read-only (most point into a read-only mapping), and
  // their data is aligned to at least the element size (2 bytes for blocks).
  std::map<std::string, Tensor> tensors;
  std::string config_json;          // HF folder: the text of config.json
  std::unique_ptr<GgufFile> gguf;   // GGUF: the parsed file (owns the mapping)
  std::vector<std::shared_ptr<void>> keep_alive;  // mappings and owned buffers
};

// path: a folder with config.json and model.safetensors or
// model.safetensors.index.json (shards), or a .gguf file.
Expected<LoadedWeights> load_weights(const std::string& path);

// Maps a GGUF tensor name to its Hugging Face name ("blk.3.attn_q.weight" ->
// "model.layers.3.self_attn.q_proj.weight"); nullopt for names osprey does not map.
std::optional<std::string> gguf_to_hf_name(std::string_view gguf_name);

// llama.cpp's converter reorders the rows of Q and K for arch "llama" so that
// rope rotates adjacent pairs: gguf row (h, i, j) = hf row (h, j, i) with
// h < num_heads, i < head_dim / 2, j < 2. This undoes it: dst gets the
// Hugging Face half-rotation order. src/dst hold `rows` rows of `row_bytes`
// bytes each; rows must be num_heads * head_dim with head_dim even (checked by
// the caller). hf_to_gguf = true applies the converter's direction instead
// (for tests). src and dst must not overlap.
void permute_qk_rows(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t row_bytes, int64_t num_heads,
                     bool hf_to_gguf = false);

}  // namespace osprey
