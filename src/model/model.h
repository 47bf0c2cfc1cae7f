// Model: a loaded decoder-only transformer bound to a backend. One
// implementation serves every supported architecture; per-architecture
// options live in ArchOptions (src/model/arch_registry.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/forward_batch.h"
#include "model/model_config.h"
#include "ops/backend.h"
#include "osprey/status.h"

namespace osprey {

class GgufFile;
struct LoadedWeights;

struct ModelLoadOptions {
  // "auto" (safetensors or GGUF by path), or "dummy" (random weights from the
  // config alone, for benchmarks of real shapes: the path is then a bundled
  // config name such as "llama-3-8b", a config.json, or a folder holding one).
  std::string load_format = "auto";
  // Compute (activation) dtype: "auto" (the backend's default: float32 on the
  // CPU, bfloat16 on CUDA), "float32", "bfloat16" or "float16". Float weights are
  // converted to it at upload on non-CPU backends; quantised weights stay packed.
  std::string dtype = "auto";
  // KV page dtype: "auto" (the compute dtype), "float32", "bfloat16",
  // "float16", or "fp8" (= "fp8_e4m3": one byte a value under a per-layer K
  // and V scale, the checkpoint's self_attn.k_scale / v_scale where it has
  // them, else 1).
  std::string kv_cache_dtype = "auto";
  // Tokenizer to use instead of the model's own ("" = the model's; a dummy
  // model has none). Recorded for load_tokenizer_for_model.
  std::string tokenizer;
  // Seed of the dummy weights.
  uint64_t dummy_seed = 0;
  // "none" / "" or "fp8" (EngineConfig::quantization): the layers'
  // projections converted at load (Backend::quantize_weight_fp8), the norms
  // then not folded into them; needs Backend::supports_fp8_weights and float
  // weights.
  std::string quantization = "none";
};

// "auto"/"float32"/"fp32"/"bfloat16"/"bf16"/"float16"/"fp16" -> dtype; "auto"
// gives `automatic`. Errors name the accepted values.
Expected<DType> parse_dtype_option(const std::string& value, DType automatic, const char* what);
// ModelLoadOptions::kv_cache_dtype: parse_dtype_option's names, or "fp8" /
// "fp8_e4m3" (F8_E4M3 pages).
Expected<DType> parse_kv_dtype_option(const std::string& value, DType automatic);

class Model {
 public:
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // path: a Hugging Face folder (config.json + safetensors) or a .gguf file
  // (or, for load_format "dummy", a config; see ModelLoadOptions).
  static Expected<std::unique_ptr<Model>> load(const std::string& path, ops::Backend& backend,
                                               const ModelLoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  ops::Backend& backend() const { return *backend_; }
  // The GGUF file the model came from (vocabulary, chat template), or null.
  const GgufFile* gguf() const;
  // The folder or file the model was loaded from.
  const std::string& path() const { return path_; }
  // Storage dtypes of the weights, e.g. {"Q4_1": 120, "F32": 61}.
  std::vector<std::pair<std::string, int>> weight_dtype_counts() const;
  size_t weight_bytes() const;
  // Activation dtype of forward (F32 or BF16) and dtype of the KV pages.
  DType activation_dtype() const { return act_dtype_; }
  DType kv_dtype() const { return kv_dtype_; }
  // The scales of layer l's F8_E4M3 K and V pages (ops::LayerKv; 1 for the
  // other KV dtypes).
  float kv_k_scale(int l) const { return kv_k_scales_.empty() ? 1.0f : kv_k_scales_[static_cast<size_t>(l)]; }
  float kv_v_scale(int l) const { return kv_v_scales_.empty() ? 1.0f : kv_v_scales_[static_cast<size_t>(l)]; }
  // F8_E4M3 pages read from a checkpoint: the layers whose K or V scale it
  // holds, and the first such tensor's name after "self_attn." ("" if
  // none); -1 where no file was read (other KV dtypes, dummy weights).
  int kv_scale_layers() const { return kv_scale_layers_; }
  const std::string& kv_scale_name() const { return kv_scale_name_; }
  // The options the model was loaded with (tokenizer, load format).
  const ModelLoadOptions& load_options() const { return options_; }
  // True when the weights are random (load_format "dummy").
  bool is_dummy() const { return options_.load_format == "dummy"; }
  // True when the attention and MLP norm weights were folded into the qkv
  // and gate/up projections at load (ops::Backend::folds_norms).
  bool norms_folded() const;

  // Bytes of KV cache per token (all layers, K and V).
  size_t kv_bytes_per_token() const;
  // Allocates a paged KV cache on the backend: num_blocks pages of block_size tokens.
  KvCache allocate_kv(int num_blocks, int block_size);
  // The same with pages of another dtype (e.g. the activation dtype, to
  // calibrate FP8 scales on unrounded values); scales 1 unless F8_E4M3.
  KvCache allocate_kv_as(int num_blocks, int block_size, DType page_dtype);
  // F8_E4M3 pages: replaces the per-layer K and V scales (one each per layer,
  // positive and finite), e.g. calibrated ones; `name` is what
  // kv_scale_name() then reports. Caches allocated before keep their scales.
  Status set_kv_scales(std::vector<float> k_scales, std::vector<float> v_scales, std::string name);
  void free_kv(KvCache& kv);

  // Allocates step buffers for up to max_tokens tokens and max_logit_rows
  // logit rows per forward. Must be called before forward.
  void reserve(int max_tokens, int max_logit_rows);

  // Runs one step. logits: [batch.num_logit_rows, vocab_size] F32 on the
  // backend's device, valid until the next forward (0 rows: KV writes only).
  Tensor forward(const ForwardBatch& batch, KvCache& kv);

 private:
  Model();
  struct Impl;
  static Status fold_norms(Impl& m, ops::Backend& be, DType act, int64_t d);
  static Status quantize_fp8(Impl& m, ops::Backend& be);
  std::unique_ptr<Impl> impl_;
  ModelConfig config_;
  ops::Backend* backend_ = nullptr;
  std::string path_;
  ModelLoadOptions options_;
  DType act_dtype_ = DType::kF32;
  DType kv_dtype_ = DType::kF32;
  std::vector<float> kv_k_scales_, kv_v_scales_;  // per layer, F8_E4M3 pages only
  int kv_scale_layers_ = -1;
  std::string kv_scale_name_;
};

}  // namespace osprey
