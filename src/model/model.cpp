#include "model/model.h"

#include <cmath>
#include <cstring>
#include <algorithm>
#include <map>
#include <optional>

#include "core/check.h"
#include "loader/dummy_weights.h"
#include "loader/gguf_file.h"
#include "loader/weights.h"
#include "model/arch_registry.h"
#include "model/builtin_configs.h"
#include "ops/rope_freq.h"

namespace osprey {

namespace {

// One decoder layer's weights. Optional tensors are undefined when absent.
struct LayerWeights {
  Tensor attn_norm;       // [d] F32
  Tensor w_qkv;           // [(hq + 2 hk) * hd, d]: q rows, k rows, v rows (fused)
  Tensor b_qkv;           // [(hq + 2 hk) * hd] F32 or undefined
  Tensor wq, wk, wv;      // unfused (only when q/k/v differ in dtype): [hq*hd, d], [hk*hd, d], [hk*hd, d]
  Tensor bq, bk, bv;      // F32 biases of the unfused path or undefined
  Tensor q_norm, k_norm;  // [hd] F32 or undefined
  Tensor wo;              // [d, hq*hd]
  Tensor ffn_norm;        // [d] F32
  Tensor w_gate_up;       // [2f, d]: gate rows then up rows
  Tensor w_down;          // [d, f]
};

// Step buffers on the backend, sized by reserve(); activations in the
// model's activation dtype, logits F32.
struct Workspace {
  int max_tokens = 0;
  int max_logit_rows = 0;
  std::vector<void*> allocations;
  Tensor resid, normed, qkv, q, k, v, attn, proj, gate_up, act, sel, logits;
};

}  // namespace

struct Model::Impl {
  LoadedWeights weights;
  const ArchSpec* arch = nullptr;
  Tensor embed;       // [vocab, d]
  Tensor final_norm;  // [d] F32
  Tensor lm_head;     // [vocab, d]
  std::vector<LayerWeights> layers;
  bool any_unfused = false;  // some layer keeps separate q/k/v projections
  // The attention and MLP norm weights are multiplied into w_qkv and
  // w_gate_up (Backend::folds_norms); each layer's attn_norm and ffn_norm
  // then point at unit_norm (ones, for the GEMV-size steps' rms_norm_matmul*).
  bool folded_norms = false;
  Tensor unit_norm;  // [d] F32 ones, when folded_norms
  std::vector<float> inv_freq_host;
  float* inv_freq = nullptr;  // on the backend's device
  ops::RopeTable rope;
  std::vector<std::vector<uint8_t>> owned;  // converted / fused host tensors
  std::vector<void*> device_allocations;    // uploaded weights (non-CPU backends, dummy weights)
  Workspace ws;
  std::map<std::string, int> dtype_counts;
  size_t weight_bytes = 0;
};

Model::Model() : impl_(std::make_unique<Impl>()) {}

Model::~Model() {
  if (!impl_) return;
  for (void* p : impl_->ws.allocations) backend_->free(p);
  for (void* p : impl_->device_allocations) backend_->free(p);
}

const GgufFile* Model::gguf() const { return impl_->weights.gguf.get(); }

std::vector<std::pair<std::string, int>> Model::weight_dtype_counts() const {
  return {impl_->dtype_counts.begin(), impl_->dtype_counts.end()};
}

size_t Model::weight_bytes() const { return impl_->weight_bytes; }

bool Model::norms_folded() const { return impl_->folded_norms; }

Expected<DType> parse_dtype_option(const std::string& value, DType automatic, const char* what) {
  if (value.empty() || value == "auto") return automatic;
  if (value == "float32" || value == "fp32" || value == "f32") return DType::kF32;
  if (value == "bfloat16" || value == "bf16") return DType::kBF16;
  if (value == "float16" || value == "fp16" || value == "f16" || value == "half") return DType::kF16;
  return invalid_argument(std::string(what) + " must be auto, float32, bfloat16 or float16, got '" + value + "'");
}

Expected<DType> parse_kv_dtype_option(const std::string& value, DType automatic) {
  if (value == "fp8" || value == "fp8_e4m3") return DType::kF8E4M3;
  if (value == "int8" || value == "i8") return DType::kI8;
  auto t = parse_dtype_option(value, automatic, "kv_cache_dtype");
  if (!t.ok()) {
    return invalid_argument("kv_cache_dtype must be auto, float32, bfloat16, float16, fp8 (fp8_e4m3) or int8, got '" +
                            value + "'");
  }
  return t;
}

namespace {

constexpr size_t kStagingBytes = size_t{64} << 20;  // host -> device conversion chunks

bool is_float_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// The values of scale tensor s into out when it has a float dtype and every
// value is finite and positive; otherwise what is wrong ("" when nothing).
std::string read_positive_scales(const Tensor& s, std::vector<float>& out) {
  if (!is_float_dtype(s.dtype())) return "has dtype " + std::string(dtype_name(s.dtype())) + ", expected a float";
  out.resize(static_cast<size_t>(s.numel()));
  dequantize_row(s.dtype(), s.data(), out.data(), s.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]) || out[i] <= 0.0f) {
      return "holds " + std::to_string(out[i]) + " at " + std::to_string(i) + ", expected finite positive scales";
    }
  }
  return {};
}

// A checkpoint's scale of F8_E4M3 KV pages for one layer: K (kind 'k') or
// V ('v'), one element of a float dtype, under the first of these names
// that the file holds (p = "model.layers.N.self_attn."):
//   p k_scale             compressed-tensors (llm-compressor), the current layout;
//   p k_proj.k_scale      NVIDIA ModelOpt (p v_proj.v_scale for V);
//   p k_proj.output_scale AMD Quark;
//   p kv_scale            early AutoFP8 checkpoints: one scale for K and V.
// Left as it is where the file has none of them; `found` gets the name
// read ("" for none).
Status read_kv_scale(const LoadedWeights& w, const std::string& p, char kind, const std::string& path,
                     float& scale, std::string& found) {
  found.clear();
  const std::string k(1, kind);
  for (const std::string& name : {p + k + "_scale", p + k + "_proj." + k + "_scale", p + k + "_proj.output_scale",
                                  p + "kv_scale"}) {
    auto it = w.tensors.find(name);
    if (it == w.tensors.end()) continue;
    const Tensor& t = it->second;
    if (t.numel() != 1 || !is_float_dtype(t.dtype())) {
      return corrupt(path + ": tensor '" + name +
                     "' must be one float32, float16 or bfloat16 value (a per-tensor KV scale), got " +
                     std::to_string(t.numel()) + " of " + std::string(dtype_name(t.dtype())));
    }
    std::vector<float> v;
    const std::string why = read_positive_scales(t, v);
    if (!why.empty()) return corrupt(path + ": tensor '" + name + "' (a KV scale) " + why);
    scale = v[0];
    found = name;
    return {};
  }
  return {};
}

// One source piece of a weight: a tensor of the loaded file (host memory) or
// a dummy fill (host == nullptr).
struct Part {
  const Tensor* host = nullptr;
  DummyFill fill;
  int64_t rows = 0, cols = 0;  // vectors: rows = length, cols = 1
  DType dtype = DType::kF32;   // storage dtype of the source
  // F8_E4M3 sources (FP8 checkpoints): the scales of its weight_scale
  // tensor, one for the matrix or one a row (w[r][c] = scale(r) *
  // e4m3(code)), or one a block of fp8_block_rows x fp8_block_cols
  // (row-major over the blocks); and whether the part may stay FP8 on the
  // device (a layer projection with one scale a matrix or a row) rather
  // than be dequantised.
  std::vector<float> fp8_scales{};
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;  // 0: not block-wise
  bool fp8_ok = false;
  float fp8_scale_at(int64_t r, int64_t c) const {
    if (fp8_block_rows == 0) return fp8_scales.size() == 1 ? fp8_scales[0] : fp8_scales[static_cast<size_t>(r)];
    const int64_t grid_cols = (cols + fp8_block_cols - 1) / fp8_block_cols;
    return fp8_scales[static_cast<size_t>((r / fp8_block_rows) * grid_cols + c / fp8_block_cols)];
  }
};

// The block edge of a block-wise FP8 scale grid with `blocks` blocks along
// `n` elements: the smallest power of two b with ceil(n / b) == blocks (128
// in the checkpoints seen), or 0 when there is none.
int64_t fp8_block_edge(int64_t n, int64_t blocks) {
  if (blocks <= 0 || n <= 0 || blocks > n) return 0;
  int64_t b = 1;
  while (b < (n + blocks - 1) / blocks) b *= 2;
  return (n + b - 1) / b == blocks ? b : 0;
}

// Finds, checks and places weights on the backend. Matrices of float dtypes
// become the activation dtype on non-CPU backends computing in BF16/F16 (F32
// compute keeps the file's dtypes, as the exact fp32 mode); quantised
// matrices stay packed; vectors (norms, biases) are F32. Fused weights
// (QKV, gate/up) are concatenated straight into one device allocation,
// converting in 64 MiB chunks, so no host copy of the model is made. Dummy
// weights are filled in place by the backend. Collects the first error.
// Where placed weights and their bookkeeping go (parts of Model::Impl).
struct WeightStore {
  const LoadedWeights& weights;
  std::vector<std::vector<uint8_t>>& owned;
  std::vector<void*>& device_allocations;
  std::map<std::string, int>& dtype_counts;
  size_t& weight_bytes;
};

class WeightBuilder {
 public:
  WeightBuilder(ops::Backend& be, WeightStore m, DType act, bool dummy, uint64_t seed, const ModelConfig& c,
                bool want_bias, std::string origin)
      : be_(be), m_(m), act_(act), dummy_(dummy), seed_(seed), c_(c), want_bias_(want_bias),
        origin_(std::move(origin)) {}
  ~WeightBuilder() {
    if (staging_) be_.free(staging_);
  }
  WeightBuilder(const WeightBuilder&) = delete;
  WeightBuilder& operator=(const WeightBuilder&) = delete;

  bool has(const std::string& name) const {
    if (!dummy_) return m_.weights.tensors.count(name) != 0;
    if (name == "lm_head.weight") return !c_.tie_word_embeddings;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) return want_bias_;
    return true;
  }

  // A matrix [rows, cols] source, checked; nullopt (and maybe an error) when
  // absent. fp8_ok: an F8_E4M3 source may stay FP8 (layer projections);
  // others are dequantised.
  std::optional<Part> matrix_part(const std::string& name, int64_t rows, int64_t cols, bool required = true,
                                  bool fp8_ok = false) {
    if (dummy_) return Part{nullptr, dummy_fill(name, seed_), rows, cols, act_};
    const Tensor* t = find(name, required);
    if (!t) return std::nullopt;
    if (t->ndim() != 2 || t->dim(0) != rows || t->dim(1) != cols) {
      fail(name, "has shape " + t->shape_string() + ", expected [" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "]");
      return std::nullopt;
    }
    if (t->dtype() == DType::kI32 || t->dtype() == DType::kI64 || t->dtype() == DType::kU8) {
      fail(name, "has integer dtype " + std::string(dtype_name(t->dtype())));
      return std::nullopt;
    }
    Part part{t, {}, rows, cols, t->dtype()};
    if (t->dtype() == DType::kF8E4M3) {
      if (!fp8_scales(name, part)) return std::nullopt;
      // The FP8 GEMMs' shapes; block-wise scales are dequantised.
      part.fp8_ok = fp8_ok && rows % 16 == 0 && cols % 16 == 0 && part.fp8_block_rows == 0;
    }
    return part;
  }

  // The scales of the FP8 matrix part p ("<prefix>.weight"), into p: its
  // "<prefix>.weight_scale" tensor of finite positive values, one for the
  // matrix (shape [] or [1]: quant_method "fp8"), one a row ([rows, 1] or
  // [rows]: compressed-tensors' channel strategy) or one a block ([R, C],
  // R, C > 1 or C > 1: compressed-tensors' block strategy), or
  // "<prefix>.weight_scale_inv" of one a block (transformers' fine-grained
  // FP8 and DeepSeek's layout, multiplied in as its name notwithstanding),
  // the block edges those of the grid (fp8_block_edge; 128 x 128 in the
  // published ones). Other layouts are refused by name.
  bool fp8_scales(const std::string& name, Part& p) {
    const std::string prefix =
        name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 ? name.substr(0, name.size() - 7) : name;
    std::string scale_name = prefix + ".weight_scale";
    const Tensor* s = find(scale_name, false);
    if (!s) {
      scale_name = prefix + ".weight_scale_inv";
      s = find(scale_name, false);
    }
    if (!s) {
      fail(name, "is F8_E4M3 but has no weight_scale (or weight_scale_inv) tensor");
      return false;
    }
    const bool inv = scale_name.size() > 4 && scale_name.compare(scale_name.size() - 4, 4, "_inv") == 0;
    const int64_t rows = p.rows, cols = p.cols;
    const bool one = s->numel() == 1 && !inv;
    const bool per_row =
        !inv && s->numel() == rows && rows > 1 && (s->ndim() == 1 || (s->ndim() == 2 && s->dim(1) == 1));
    const bool grid = s->ndim() == 2 && (inv || (!one && !per_row));
    if (grid) {
      p.fp8_block_rows = fp8_block_edge(rows, s->dim(0));
      p.fp8_block_cols = fp8_block_edge(cols, s->dim(1));
    }
    if (!one && !per_row && (!grid || p.fp8_block_rows == 0 || p.fp8_block_cols == 0)) {
      fail(scale_name, "has shape " + s->shape_string() + " for a [" + std::to_string(rows) + ", " +
                           std::to_string(cols) +
                           "] F8_E4M3 matrix: osprey loads one scale per matrix, one per row, or one per block of a "
                           "grid over the matrix");
      return false;
    }
    const std::string why = read_positive_scales(*s, p.fp8_scales);
    if (!why.empty()) {
      fail(scale_name, why);
      return false;
    }
    return true;
  }

  std::optional<Part> vector_part(const std::string& name, int64_t n, bool required = true) {
    if (dummy_) return Part{nullptr, dummy_fill(name, seed_), n, 1, DType::kF32};
    const Tensor* t = find(name, required);
    if (!t) return std::nullopt;
    if (t->numel() != n || t->ndim() != 1) {
      fail(name, "has shape " + t->shape_string() + ", expected [" + std::to_string(n) + "]");
      return std::nullopt;
    }
    if (!is_float_dtype(t->dtype())) {
      fail(name, "has unsupported dtype " + std::string(dtype_name(t->dtype())) + " for a vector");
      return std::nullopt;
    }
    return Part{t, {}, n, 1, t->dtype()};
  }

  Tensor matrix(const std::string& name, int64_t rows, int64_t cols, bool required = true, bool fp8_ok = false) {
    auto p = matrix_part(name, rows, cols, required, fp8_ok);
    if (!p) return {};
    return place({*p}, false);
  }
  Tensor vector_f32(const std::string& name, int64_t n, bool required = true) {
    auto p = vector_part(name, n, required);
    if (!p) return {};
    return place({*p}, true);
  }

  // Where the parts' rows go after placement: the dtype they become. FP8
  // sources stay FP8 where the backend runs FP8 weights with this
  // activation dtype (fp8_ok parts), else they are dequantised: F32 on the
  // CPU, the activation dtype elsewhere.
  DType target(const Part& p, bool vector) const {
    if (vector) return DType::kF32;
    if (p.dtype == DType::kF8E4M3) {
      if (p.fp8_ok && be_.device() != Device::kCpu && be_.supports_fp8_weights(act_)) return DType::kF8E4M3;
      return be_.device() == Device::kCpu ? DType::kF32 : act_;
    }
    if (dtype_is_quantized(p.dtype)) return p.dtype;
    if (dummy_) return act_;
    if (be_.device() == Device::kCpu) return p.dtype;
    return act_ != DType::kF32 ? act_ : p.dtype;  // 16-bit compute: weights in the activation dtype
  }

  // Whether the parts can be placed as one tensor (same target dtype and columns).
  bool fusable(const std::vector<Part>& parts, bool vector) const {
    for (const Part& p : parts) {
      if (target(p, vector) != target(parts[0], vector) || p.cols != parts[0].cols) return false;
    }
    return true;
  }

  // The rows of all parts, in order, as one tensor placed for the backend.
  Tensor place(const std::vector<Part>& parts, bool vector) {
    OSP_CHECK(!parts.empty() && fusable(parts, vector));
    const DType t = target(parts[0], vector);
    const int64_t cols = parts[0].cols;
    int64_t rows = 0;
    for (const Part& p : parts) rows += p.rows;
    const int64_t row_bytes = dtype_row_bytes(t, cols);
    const size_t bytes = static_cast<size_t>(rows * row_bytes);
    const bool host_side = be_.device() == Device::kCpu && !dummy_;
    if (host_side && parts.size() == 1 && parts[0].dtype == t) return *parts[0].host;  // zero copy
    if (host_side) {
      auto& buf = m_.owned.emplace_back(bytes);
      int64_t r0 = 0;
      for (const Part& p : parts) {
        if (p.dtype == t) {
          std::memcpy(buf.data() + r0 * row_bytes, p.host->data(), static_cast<size_t>(p.host->nbytes()));
        } else {  // vectors of F16/BF16 -> F32; FP8 matrices -> F32
          dequantize_part(p, reinterpret_cast<float*>(buf.data() + r0 * row_bytes));
        }
        r0 += p.rows;
      }
      return vector ? Tensor(buf.data(), t, {rows}) : Tensor(buf.data(), t, {rows, cols});
    }
    if (t == DType::kF8E4M3) return place_fp8(parts, rows, cols);
    void* dst = be_.alloc(bytes);
    if (!dst) {
      fail("(allocation)", "does not fit: out of " + std::string(be_.name()) + " memory placing " +
                               std::to_string(bytes) + " bytes");
      return {};
    }
    m_.device_allocations.push_back(dst);
    const Device dev = be_.device();
    int64_t r0 = 0;
    for (const Part& p : parts) {
      char* d = static_cast<char*>(dst) + r0 * row_bytes;
      const int64_t numel = p.rows * p.cols;
      if (!p.host) {
        Tensor view(d, t, {numel}, dev);
        be_.fill_uniform(view, p.fill.seed, p.fill.lo, p.fill.hi);
        if (dummy_) {
          m_.dtype_counts[std::string(dtype_name(t))]++;
          m_.weight_bytes += static_cast<size_t>(p.rows * row_bytes);
        }
      } else if (p.dtype == t) {
        be_.copy_to_device(d, p.host->data(), static_cast<size_t>(p.host->nbytes()));
      } else if (vector || p.dtype == DType::kF8E4M3) {  // vectors -> F32; FP8 matrices where FP8 does not run
        std::vector<float> tmp(static_cast<size_t>(numel));
        dequantize_part(p, tmp.data());
        if (t == DType::kF32) {
          be_.copy_to_device(d, tmp.data(), tmp.size() * sizeof(float));
        } else {
          convert_upload(Tensor(tmp.data(), DType::kF32, {numel}), t, d);
        }
        be_.synchronize();  // tmp dies here
      } else {
        convert_upload(*p.host, t, d);
      }
      r0 += p.rows;
    }
    return vector ? Tensor(dst, t, {rows}, dev) : Tensor(dst, t, {rows, cols}, dev);
  }

  const Status& status() const { return status_; }

 private:
  // The host part's values as fp32 into out[rows * cols]: dequantize_row,
  // FP8 codes times their (matrix, row or block) scale.
  static void dequantize_part(const Part& p, float* out) {
    const int64_t numel = p.rows * p.cols;
    dequantize_row(p.dtype, p.host->data(), out, numel);
    if (p.dtype == DType::kF8E4M3) {
      for (int64_t i = 0; i < numel; ++i) out[i] *= p.fp8_scale_at(i / p.cols, i % p.cols);
    }
  }

  // FP8 parts as one F8_E4M3 matrix [rows, cols] on the device (the layout
  // of fp8_scale_offset): one scale for all, the largest of the parts' (and
  // rows'); rows with a smaller scale have their codes re-rounded to it on
  // the host (f8e4m3_rescale_rows: within half an E4M3 step, exact for
  // power-of-two ratios that keep a value normal), as fused q/k/v or
  // gate/up, and the FP8 GEMMs, take one scale a matrix.
  Tensor place_fp8(const std::vector<Part>& parts, int64_t rows, int64_t cols) {
    float s_max = 0.0f;
    for (const Part& p : parts) {
      for (float v : p.fp8_scales) s_max = std::max(s_max, v);
    }
    const size_t bytes = static_cast<size_t>(fp8_weight_bytes(rows, cols));
    void* dst = be_.alloc(bytes);
    if (!dst) {
      fail("(allocation)",
           "does not fit: out of " + std::string(be_.name()) + " memory placing " + std::to_string(bytes) + " bytes");
      return {};
    }
    m_.device_allocations.push_back(dst);
    char* d = static_cast<char*>(dst);
    std::vector<uint8_t> tmp;
    for (const Part& p : parts) {
      const auto n = static_cast<size_t>(p.rows * p.cols);
      if (p.fp8_scales.size() == 1 && p.fp8_scales[0] == s_max) {
        be_.copy_to_device(d, p.host->data(), n);
      } else {
        tmp.resize(n);
        f8e4m3_rescale_rows(static_cast<const uint8_t*>(p.host->data()), p.rows, p.cols, p.fp8_scales.data(),
                            p.fp8_scales.size() > 1, s_max, tmp.data());
        be_.copy_to_device(d, tmp.data(), n);
        be_.synchronize();  // tmp is reused
      }
      d += n;
    }
    be_.copy_to_device(static_cast<char*>(dst) + fp8_scale_offset(rows, cols), &s_max, sizeof(s_max));
    be_.synchronize();  // s_max dies here
    return Tensor(dst, DType::kF8E4M3, {rows, cols}, be_.device());
  }

  // Host float tensor -> device dtype t at dst, through the staging buffer.
  void convert_upload(const Tensor& src, DType t, char* dst) {
    if (!staging_) {
      staging_ = be_.alloc(kStagingBytes);
      OSP_CHECK_MSG(staging_ != nullptr, "no device memory for the 64 MiB weight staging buffer");
    }
    const int64_t src_es = dtype_row_bytes(src.dtype(), 1);
    const int64_t dst_es = dtype_row_bytes(t, 1);
    const int64_t chunk = static_cast<int64_t>(kStagingBytes) / src_es;
    const int64_t numel = src.numel();
    const auto* sp = static_cast<const char*>(src.data());
    for (int64_t e0 = 0; e0 < numel; e0 += chunk) {
      const int64_t len = std::min(chunk, numel - e0);
      // Stream order: this copy waits for the previous chunk's conversion.
      be_.copy_to_device(staging_, sp + e0 * src_es, static_cast<size_t>(len * src_es));
      Tensor s(staging_, src.dtype(), {len}, be_.device());
      Tensor d(dst + e0 * dst_es, t, {len}, be_.device());
      be_.convert(s, d);
    }
  }

  const Tensor* find(const std::string& name, bool required) {
    auto it = m_.weights.tensors.find(name);
    if (it == m_.weights.tensors.end()) {
      if (required) fail(name, "is missing");
      return nullptr;
    }
    return &it->second;
  }
  void fail(const std::string& name, const std::string& what) {
    if (status_.ok()) status_ = corrupt(origin_ + ": tensor '" + name + "' " + what);
  }

  ops::Backend& be_;
  WeightStore m_;
  DType act_;
  bool dummy_;
  uint64_t seed_;
  const ModelConfig& c_;
  bool want_bias_;
  std::string origin_;
  void* staging_ = nullptr;
  Status status_;
};

// The config of a dummy model: a bundled name, a config.json, or a folder with one.
Expected<ModelConfig> dummy_config(const std::string& path) {
  if (auto text = builtin_model_config(path)) {
    return model_config_from_hf_json(std::string(*text), "bundled config '" + path + "'");
  }
  OSP_ASSIGN_OR_RETURN(DummyConfigText text, read_dummy_config(path));
  return model_config_from_hf_json(text.json, text.origin);
}

// v copied into memory from be.alloc, recorded in allocs (freed with the
// model); null when out of memory.
float* upload_owned(ops::Backend& be, std::vector<void*>& allocs, const std::vector<float>& v) {
  const size_t bytes = v.size() * sizeof(float);
  void* p = be.alloc(bytes);
  if (!p) return nullptr;
  allocs.push_back(p);
  be.copy_to_device(p, v.data(), bytes);
  return static_cast<float*>(p);
}

// Whether t's memory belongs to the model: device weights are always
// uploaded copies; host weights only where placed by the backend (dummy
// fills) or converted or fused into `owned` (others may be read-only file
// mappings).
bool model_owns(const Tensor& t, const std::vector<std::vector<uint8_t>>& owned, const std::vector<void*>& placed) {
  if (t.device() != Device::kCpu) return true;
  if (std::find(placed.begin(), placed.end(), t.data()) != placed.end()) return true;
  const auto* p = static_cast<const uint8_t*>(t.data());
  for (const auto& buf : owned) {
    if (p >= buf.data() && p + t.nbytes() <= buf.data() + buf.size()) return true;
  }
  return false;
}

}  // namespace

// Folds the attention and MLP norm weights into w_qkv and w_gate_up where
// the backend asks for it (Backend::folds_norms): the product of the raw
// residual is then scaled per row by the op reading it (which adds a qkv
// bias after the scale), and no norm pass runs at GEMM-size steps. Only
// where every layer has the fused q/k/v projection, the o and down
// projections add into the residual inside their GEMMs (resid then holds
// the whole residual the norms read), and the weights are float matrices
// this model owns.
Status Model::fold_norms(Impl& m, ops::Backend& be, DType act, int64_t d) {
  if (!be.folds_norms(act) || !be.fuses_matmul_add(act) || m.any_unfused || m.layers.empty()) return {};
  for (const LayerWeights& L : m.layers) {
    for (const Tensor* w : {&L.w_qkv, &L.w_gate_up}) {
      if (!w->defined() || !is_float_dtype(w->dtype()) || !model_owns(*w, m.owned, m.device_allocations)) return {};
    }
  }
  float* ones = upload_owned(be, m.device_allocations, std::vector<float>(static_cast<size_t>(d), 1.0f));
  if (!ones) return resource_exhausted("out of device memory after loading the weights");
  m.unit_norm = Tensor(ones, DType::kF32, {d}, be.device());
  for (LayerWeights& L : m.layers) {
    be.scale_columns(L.w_qkv, L.attn_norm);
    be.scale_columns(L.w_gate_up, L.ffn_norm);
    L.attn_norm = m.unit_norm;
    L.ffn_norm = m.unit_norm;
  }
  m.folded_norms = true;
  return {};
}

// Converts the layers' projections to F8_E4M3 with one scale a matrix
// (ModelLoadOptions::quantization "fp8", Backend::quantize_weight_fp8), each
// into an allocation of its own; the float copy's allocation is freed. The
// norms are not folded into the weights first: with the fold, each GEMM
// would read the raw residual, whose rows' magnitudes differ by orders
// between tokens, and one FP8 scale for all of them would leave the small
// rows few significant bits; the normed rows the unfolded sequence
// quantises are all of RMS ~1. The fused norm ops keep being asked for at
// GEMV-size steps: the CUDA ones read E4M3 rows at one activation row, and
// any backend runs them as rms_norm + matmul where its fused kernels do not
// take the weights.
Status Model::quantize_fp8(Impl& m, ops::Backend& be) {
  for (size_t li = 0; li < m.layers.size(); ++li) {
    LayerWeights& L = m.layers[li];
    static constexpr const char* kNames[] = {"qkv", "q", "k", "v", "o", "gate_up", "down"};
    Tensor* const ws[] = {&L.w_qkv, &L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate_up, &L.w_down};
    for (size_t wi = 0; wi < std::size(ws); ++wi) {
      Tensor* w = ws[wi];
      if (!w->defined() || w->dtype() == DType::kF8E4M3) continue;  // FP8 already (an FP8 checkpoint)
      if (!is_float_dtype(w->dtype()) || w->device() == Device::kCpu) {
        return unsupported("quantization fp8 converts float weights on the device; this model's are " +
                           std::string(dtype_name(w->dtype())));
      }
      const int64_t rows = w->dim(0), cols = w->dim(1);
      if (rows % 16 != 0 || cols % 16 != 0) {
        return unsupported("quantization fp8 needs projection shapes in multiples of 16, got " + w->shape_string());
      }
      void* p = be.alloc(static_cast<size_t>(fp8_weight_bytes(rows, cols)));
      if (!p) return resource_exhausted("out of device memory converting the weights to FP8");
      m.device_allocations.push_back(p);
      Tensor q(p, DType::kF8E4M3, {rows, cols}, be.device());
      const Status st = be.quantize_weight_fp8(*w, q);
      if (!st.ok()) {
        return invalid_argument("quantization fp8: layer " + std::to_string(li) + "'s " + kNames[wi] +
                                " projection: " + st.message());
      }
      be.synchronize();
      auto it = std::find(m.device_allocations.begin(), m.device_allocations.end(), w->data());
      if (it != m.device_allocations.end()) {
        be.free(*it);
        m.device_allocations.erase(it);
      }
      const auto before = static_cast<size_t>(w->nbytes()), after = static_cast<size_t>(rows * cols);
      m.weight_bytes = m.weight_bytes > before ? m.weight_bytes - before + after : after;
      *w = q;
    }
  }
  return {};
}

Expected<std::unique_ptr<Model>> Model::load(const std::string& path, ops::Backend& backend,
                                             const ModelLoadOptions& options) {
  if (options.load_format != "auto" && options.load_format != "dummy") {
    return invalid_argument("load format must be auto or dummy, got '" + options.load_format + "'");
  }
  const bool dummy = options.load_format == "dummy";
  OSP_ASSIGN_OR_RETURN(DType act, parse_dtype_option(options.dtype, backend.default_activation_dtype(), "dtype"));
  if (!backend.supports_activation_dtype(act)) {
    return unsupported(std::string("the ") + backend.name() + " backend does not compute in " +
                       std::string(dtype_name(act)) + (backend.device() == Device::kCpu
                                                           ? " (the CPU backend computes in float32 only)"
                                                           : " (use float32, bfloat16 or float16)"));
  }
  OSP_ASSIGN_OR_RETURN(DType kv_dtype, parse_kv_dtype_option(options.kv_cache_dtype, act));
  if (!options.quantization.empty() && options.quantization != "none" && options.quantization != "fp8") {
    return invalid_argument("quantization must be none or fp8, got '" + options.quantization + "'");
  }
  const bool fp8 = options.quantization == "fp8";
  if (fp8 && !backend.supports_fp8_weights(act)) {
    return unsupported(std::string("quantization fp8 needs FP8 tensor cores: the CUDA backend on a GPU of compute "
                                   "capability 8.9 or newer, computing in bfloat16 or float16 (this is the ") +
                       backend.name() + " backend computing in " + std::string(dtype_name(act)) + ")");
  }

  std::unique_ptr<Model> model(new Model());
  Impl& m = *model->impl_;
  model->backend_ = &backend;
  model->path_ = path;
  model->options_ = options;
  model->act_dtype_ = act;
  model->kv_dtype_ = kv_dtype;

  if (dummy) {
    OSP_ASSIGN_OR_RETURN(model->config_, dummy_config(path));
  } else {
    OSP_ASSIGN_OR_RETURN(LoadedWeights weights, load_weights(path));
    if (weights.format == LoadedWeights::Format::kGguf) {
      OSP_ASSIGN_OR_RETURN(model->config_, model_config_from_gguf(*weights.gguf));
    } else {
      OSP_ASSIGN_OR_RETURN(model->config_, model_config_from_hf_json(weights.config_json, path + "/config.json"));
    }
    m.weights = std::move(weights);
  }
  ModelConfig& c = model->config_;
  OSP_RETURN_IF_ERROR(c.validate());
  m.arch = find_arch(c.architecture);
  if (!m.arch) {
    std::string list;
    for (auto a : supported_archs()) list += (list.empty() ? "" : ", ") + std::string(a);
    return unsupported(path + ": architecture '" + c.architecture + "' is not supported (supported: " + list + ")");
  }
  if (c.head_dim > 256) return unsupported(path + ": head_dim " + std::to_string(c.head_dim) + " exceeds 256");
  if (!backend.supports_kv_dtype(kv_dtype, act, c.head_dim, c.num_heads / std::max(1, c.num_kv_heads))) {
    return unsupported(std::string("the ") + backend.name() + " backend has no " + std::string(dtype_name(kv_dtype)) +
                       " KV pages for this model" +
                       (kv_dtype == DType::kI8
                            ? " (int8 pages on CUDA need bfloat16 or float16 compute and head_dim 64 or 128; the CPU "
                              "backend takes any)"
                            : ""));
  }

  // Statistics for `osprey info` (dummy weights are counted as they are made).
  for (const auto& [name, t] : m.weights.tensors) {
    m.dtype_counts[std::string(dtype_name(t.dtype()))]++;
    m.weight_bytes += static_cast<size_t>(t.nbytes());
  }

  const int64_t d = c.hidden_size, hd = c.head_dim, hq = c.num_heads, hk = c.num_kv_heads;
  const int64_t f = c.intermediate_size, vocab = c.vocab_size;
  const bool want_bias = m.arch->qkv_bias || c.attention_bias;
  WeightBuilder b(backend, WeightStore{m.weights, m.owned, m.device_allocations, m.dtype_counts, m.weight_bytes}, act,
                  dummy, options.dummy_seed, c, want_bias, path);
  m.embed = b.matrix("model.embed_tokens.weight", vocab, d);
  m.final_norm = b.vector_f32("model.norm.weight", d);
  const bool is_gguf = m.weights.format == LoadedWeights::Format::kGguf && !dummy;
  if (b.has("lm_head.weight")) {
    m.lm_head = b.matrix("lm_head.weight", vocab, d);
  } else if (c.tie_word_embeddings || is_gguf) {
    m.lm_head = m.embed;
  } else {
    m.lm_head = b.matrix("lm_head.weight", vocab, d);  // reports it missing
  }
  m.layers.resize(static_cast<size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers && b.status().ok(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = m.layers[static_cast<size_t>(l)];
    L.attn_norm = b.vector_f32(p + "input_layernorm.weight", d);
    auto q = b.matrix_part(p + "self_attn.q_proj.weight", hq * hd, d, true, true);
    auto k = b.matrix_part(p + "self_attn.k_proj.weight", hk * hd, d, true, true);
    auto v = b.matrix_part(p + "self_attn.v_proj.weight", hk * hd, d, true, true);
    std::optional<Part> bq, bk, bv;
    if (want_bias || b.has(p + "self_attn.q_proj.bias")) {
      bq = b.vector_part(p + "self_attn.q_proj.bias", hq * hd, want_bias);
      bk = b.vector_part(p + "self_attn.k_proj.bias", hk * hd, want_bias);
      bv = b.vector_part(p + "self_attn.v_proj.bias", hk * hd, want_bias);
    }
    if (!q || !k || !v) break;
    if (b.fusable({*q, *k, *v}, false)) {
      L.w_qkv = b.place({*q, *k, *v}, false);
      if (bq && bk && bv) L.b_qkv = b.place({*bq, *bk, *bv}, true);
    } else {  // e.g. GGUF files with v in another quantisation than q and k
      m.any_unfused = true;
      L.wq = b.place({*q}, false);
      L.wk = b.place({*k}, false);
      L.wv = b.place({*v}, false);
      if (bq) L.bq = b.place({*bq}, true);
      if (bk) L.bk = b.place({*bk}, true);
      if (bv) L.bv = b.place({*bv}, true);
    }
    if (m.arch->qk_norm || c.qk_norm) {
      L.q_norm = b.vector_f32(p + "self_attn.q_norm.weight", hd);
      L.k_norm = b.vector_f32(p + "self_attn.k_norm.weight", hd);
    }
    L.wo = b.matrix(p + "self_attn.o_proj.weight", d, hq * hd, true, true);
    L.ffn_norm = b.vector_f32(p + "post_attention_layernorm.weight", d);
    auto gate = b.matrix_part(p + "mlp.gate_proj.weight", f, d, true, true);
    auto up = b.matrix_part(p + "mlp.up_proj.weight", f, d, true, true);
    if (!gate || !up) break;
    if (!b.fusable({*gate, *up}, false)) {
      return corrupt(path + ": " + p + "mlp gate and up projections have different dtypes");
    }
    L.w_gate_up = b.place({*gate, *up}, false);
    L.w_down = b.matrix(p + "mlp.down_proj.weight", d, f, true, true);
  }
  OSP_RETURN_IF_ERROR(b.status());
  if (kv_dtype == DType::kF8E4M3) {
    model->kv_k_scales_.assign(static_cast<size_t>(c.num_layers), 1.0f);
    model->kv_v_scales_.assign(static_cast<size_t>(c.num_layers), 1.0f);
    if (!dummy) model->kv_scale_layers_ = 0;
    for (int l = 0; l < c.num_layers && !dummy; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      std::string fk, fv;
      OSP_RETURN_IF_ERROR(read_kv_scale(m.weights, p, 'k', path, model->kv_k_scales_[static_cast<size_t>(l)], fk));
      OSP_RETURN_IF_ERROR(read_kv_scale(m.weights, p, 'v', path, model->kv_v_scales_[static_cast<size_t>(l)], fv));
      if (fk.empty() && fv.empty()) continue;
      ++model->kv_scale_layers_;
      if (model->kv_scale_name_.empty()) model->kv_scale_name_ = (fk.empty() ? fv : fk).substr(p.size());
    }
  }
  if (fp8) {
    OSP_RETURN_IF_ERROR(quantize_fp8(m, backend));  // instead of the norm fold: see quantize_fp8
  } else {
    OSP_RETURN_IF_ERROR(fold_norms(m, backend, act, d));
  }

  m.inv_freq_host = ops::make_rope_inv_freq(c.rope_theta, c.head_dim, c.rope_scaling);
  m.inv_freq = upload_owned(backend, m.device_allocations, m.inv_freq_host);
  if (!m.inv_freq) return resource_exhausted("out of device memory after loading the weights");
  m.rope.inv_freq = m.inv_freq;
  m.rope.rotary_dim = c.head_dim;
  backend.synchronize();
  return model;
}

size_t Model::kv_bytes_per_token() const {
  const ModelConfig& c = config_;
  // I8 pages: each row's fp32 scale too.
  const size_t row = static_cast<size_t>(dtype_row_bytes(kv_dtype_, c.head_dim)) + (kv_dtype_ == DType::kI8 ? 4 : 0);
  return 2ull * static_cast<size_t>(c.num_layers) * static_cast<size_t>(c.num_kv_heads) * row;
}

KvCache Model::allocate_kv(int num_blocks, int block_size) { return allocate_kv_as(num_blocks, block_size, kv_dtype_); }

KvCache Model::allocate_kv_as(int num_blocks, int block_size, DType page_dtype) {
  OSP_CHECK(num_blocks > 0 && block_size > 0);
  OSP_CHECK(ops::is_kv_page_dtype(page_dtype));
  const ModelConfig& c = config_;
  KvCache kv;
  kv.num_blocks = num_blocks;
  kv.block_size = block_size;
  const size_t bytes = static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size) *
                       static_cast<size_t>(c.num_kv_heads) * static_cast<size_t>(dtype_row_bytes(page_dtype, c.head_dim));
  const bool f8 = page_dtype == DType::kF8E4M3;
  for (int l = 0; l < c.num_layers; ++l) {
    ops::LayerKv layer;
    void* k = backend_->alloc(bytes);
    void* v = backend_->alloc(bytes);
    OSP_CHECK_MSG(k && v, "out of " << backend_->name() << " memory for " << num_blocks << " KV pages");
    layer.k = Tensor(k, page_dtype, {num_blocks, block_size, c.num_kv_heads, c.head_dim}, backend_->device());
    layer.v = Tensor(v, page_dtype, {num_blocks, block_size, c.num_kv_heads, c.head_dim}, backend_->device());
    layer.k_scale = f8 ? kv_k_scale(l) : 1.0f;
    layer.v_scale = f8 ? kv_v_scale(l) : 1.0f;
    if (page_dtype == DType::kI8) {
      const size_t scale_bytes = static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size) *
                                 static_cast<size_t>(c.num_kv_heads) * sizeof(float);
      void* ks = backend_->alloc(scale_bytes);
      void* vs = backend_->alloc(scale_bytes);
      OSP_CHECK_MSG(ks && vs, "out of " << backend_->name() << " memory for " << num_blocks << " KV pages' row scales");
      layer.k_row_scales = Tensor(ks, DType::kF32, {num_blocks, c.num_kv_heads, block_size}, backend_->device());
      layer.v_row_scales = Tensor(vs, DType::kF32, {num_blocks, c.num_kv_heads, block_size}, backend_->device());
    }
    kv.layers.push_back(layer);
  }
  return kv;
}

Status Model::set_kv_scales(std::vector<float> k_scales, std::vector<float> v_scales, std::string name) {
  if (kv_dtype_ != DType::kF8E4M3) return invalid_argument("KV scales apply to FP8 (F8_E4M3) KV pages only");
  const size_t layers = static_cast<size_t>(config_.num_layers);
  if (k_scales.size() != layers || v_scales.size() != layers) {
    return invalid_argument("KV scales: " + std::to_string(k_scales.size()) + " K and " +
                            std::to_string(v_scales.size()) + " V scales for " + std::to_string(layers) + " layers");
  }
  for (size_t l = 0; l < layers; ++l) {
    if (!(std::isfinite(k_scales[l]) && k_scales[l] > 0.0f && std::isfinite(v_scales[l]) && v_scales[l] > 0.0f)) {
      return invalid_argument("KV scales of layer " + std::to_string(l) + " must be positive and finite");
    }
  }
  kv_k_scales_ = std::move(k_scales);
  kv_v_scales_ = std::move(v_scales);
  kv_scale_layers_ = config_.num_layers;
  kv_scale_name_ = std::move(name);
  return Status::Ok();
}

void Model::free_kv(KvCache& kv) {
  for (auto& layer : kv.layers) {
    for (Tensor* t : layer.page_tensors()) backend_->free(t->data());
  }
  kv.layers.clear();
  kv.num_blocks = 0;
}

void Model::reserve(int max_tokens, int max_logit_rows) {
  OSP_CHECK(max_tokens > 0 && max_logit_rows > 0);
  Workspace& ws = impl_->ws;
  for (void* p : ws.allocations) backend_->free(p);
  ws = Workspace{};
  ws.max_tokens = max_tokens;
  ws.max_logit_rows = max_logit_rows;
  const ModelConfig& c = config_;
  const int64_t n = max_tokens;
  auto make = [&](int64_t rows, int64_t cols, DType dt) {
    void* p = backend_->alloc(static_cast<size_t>(rows * dtype_row_bytes(dt, cols)));
    OSP_CHECK_MSG(p != nullptr, "out of " << backend_->name() << " memory for step buffers of " << rows << " rows");
    ws.allocations.push_back(p);
    return Tensor(p, dt, {rows, cols}, backend_->device());
  };
  const DType a = act_dtype_;
  const int64_t qw = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kw = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  ws.resid = make(n, c.hidden_size, a);
  ws.normed = make(n, c.hidden_size, a);
  ws.qkv = make(n, qw + 2 * kw, a);
  ws.q = make(n, qw, a);
  if (impl_->any_unfused) {
    ws.k = make(n, kw, a);
    ws.v = make(n, kw, a);
  }
  ws.attn = make(n, qw, a);
  ws.proj = make(n, c.hidden_size, a);
  ws.gate_up = make(n, 2 * static_cast<int64_t>(c.intermediate_size), a);
  ws.act = make(n, c.intermediate_size, a);
  ws.sel = make(max_logit_rows, c.hidden_size, a);
  ws.logits = make(max_logit_rows, c.vocab_size, DType::kF32);
}

Tensor Model::forward(const ForwardBatch& batch, KvCache& kv) {
  Impl& m = *impl_;
  Workspace& ws = m.ws;
  const ModelConfig& c = config_;
  ops::Backend& be = *backend_;
  const int64_t n = batch.attn.num_tokens;
  OSP_CHECK_MSG(ws.max_tokens > 0, "Model::reserve must be called before forward");
  OSP_CHECK(n > 0 && n <= ws.max_tokens);
  OSP_CHECK(batch.num_logit_rows >= 0 && batch.num_logit_rows <= ws.max_logit_rows);
  OSP_CHECK_EQ(kv.layers.size(), m.layers.size());

  const int64_t hd = c.head_dim, hq = c.num_heads, hk = c.num_kv_heads;
  Tensor resid = ws.resid.slice(0, n);
  Tensor normed = ws.normed.slice(0, n);
  Tensor qkv = ws.qkv.slice(0, n);
  Tensor q = ws.q.slice(0, n);
  Tensor attn = ws.attn.slice(0, n);
  Tensor proj = ws.proj.slice(0, n);
  Tensor gate_up = ws.gate_up.slice(0, n);
  Tensor act = ws.act.slice(0, n);
  Tensor q3 = q.view({n, hq, hd});
  Tensor attn3 = attn.view({n, hq, hd});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int window = m.arch->sliding_window ? c.sliding_window : 0;

  // Residual stream: where the backend fuses matmul_add (CUDA, 16-bit
  // activations), the o and down projections add into resid inside their
  // GEMMs and each norm only reads resid; otherwise each projection goes to
  // proj and the next add_rms_norm adds it (the last one: the add before
  // the final norm). Same function; the fused form rounds resid + product
  // once instead of twice.
  const bool fused_resid = be.fuses_matmul_add(act_dtype_);
  // Where the norms are plain rms_norm of resid and the backend folds them
  // into the projection that reads them (CUDA GEMV rows, 16-bit): norm + qkv
  // and norm + gate/up are one op each (normed left unwritten; the normed
  // rows rounded to the activation dtype as rms_norm rounds them).
  const bool fused_norm = fused_resid && be.fuses_rms_norm_matmul(n, act_dtype_);
  // Norm weights folded into w_qkv / w_gate_up (fold_norms): at the other
  // steps the projections read resid itself and the ops reading their
  // products scale each row by 1 / rms(resid row): no norm pass.
  const bool scale_after = m.folded_norms && !fused_norm;
  // normed = rms_norm(resid (+ proj, the previous projection, when the
  // residual is not fused and this is not the first norm)) * w.
  auto norm_resid = [&](const Tensor& w, bool first) {
    if (first || fused_resid) {
      be.rms_norm(resid, w, c.rms_norm_eps, normed);
    } else {
      be.add_rms_norm(resid, proj, w, c.rms_norm_eps, normed);
    }
  };
  // The o and down projections: resid += x @ w^T, or proj = x @ w^T for
  // the next add_rms_norm.
  auto project = [&](const Tensor& x, const Tensor& w) {
    if (fused_resid) {
      be.matmul_add(x, w, resid, proj);
    } else {
      be.matmul(x, w, Tensor(), proj);
    }
  };
  be.embedding(m.embed, batch.token_ids, resid);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& L = m.layers[l];
    if (L.w_qkv.defined()) {
      // One GEMM for q, k, v (the norm folded in where the backend can);
      // norm + RoPE + KV page write in one kernel.
      if (scale_after) {
        // The bias after the row scale, in the op that applies it.
        be.matmul(resid, L.w_qkv, Tensor(), qkv);
        be.rms_scaled_qkv_rope_kv_write(resid, c.rms_norm_eps, qkv, L.b_qkv, L.q_norm, L.k_norm, c.rms_norm_eps,
                                        m.rope, batch.attn, kv.layers[l], q3);
      } else {
        if (fused_norm) {
          be.rms_norm_matmul(resid, L.attn_norm, c.rms_norm_eps, L.w_qkv, L.b_qkv, normed, qkv);
        } else {
          norm_resid(L.attn_norm, l == 0);
          be.matmul(normed, L.w_qkv, L.b_qkv, qkv);
        }
        be.qkv_rope_kv_write(qkv, L.q_norm, L.k_norm, c.rms_norm_eps, m.rope, batch.attn, kv.layers[l], q3);
      }
    } else {
      norm_resid(L.attn_norm, l == 0);
      Tensor k = ws.k.slice(0, n), v = ws.v.slice(0, n);
      Tensor k3 = k.view({n, hk, hd});
      Tensor v3 = v.view({n, hk, hd});
      be.matmul(normed, L.wq, L.bq, q);
      be.matmul(normed, L.wk, L.bk, k);
      be.matmul(normed, L.wv, L.bv, v);
      if (L.q_norm.defined()) {
        be.head_rms_norm(q3, L.q_norm, c.rms_norm_eps);
        be.head_rms_norm(k3, L.k_norm, c.rms_norm_eps);
      }
      be.rope(q3, k3, batch.attn.positions, m.rope);
      be.kv_write(k3, v3, batch.attn, kv.layers[l]);
    }
    be.paged_attention(q3, kv.layers[l], batch.attn, scale, window, attn3);
    project(attn, L.wo);  // + attention output
    if (scale_after) {
      be.matmul(resid, L.w_gate_up, Tensor(), gate_up);
      be.rms_scaled_silu_mul(resid, c.rms_norm_eps, gate_up, act);
    } else if (fused_norm) {
      be.rms_norm_matmul_silu_mul(resid, L.ffn_norm, c.rms_norm_eps, L.w_gate_up, normed, gate_up, act);
    } else {
      norm_resid(L.ffn_norm, false);
      be.matmul_silu_mul(normed, L.w_gate_up, gate_up, act);  // CUDA batch 1: one kernel
    }
    project(act, L.w_down);  // + MLP output
  }
  const int64_t r = batch.num_logit_rows;
  OSP_CHECK_LE(r, n);
  if (r == 0) return ws.logits.slice(0, 0);  // a step of middle prefill chunks only
  Tensor sel = ws.sel.slice(0, r);
  Tensor sel_normed = ws.normed.slice(0, r);  // normed is free once the layers are done
  if (!fused_resid) be.add(resid, proj);
  be.gather_rows(resid, batch.logit_rows, static_cast<int>(r), sel);
  be.rms_norm(sel, m.final_norm, c.rms_norm_eps, sel_normed);
  Tensor logits = ws.logits.slice(0, r);
  be.matmul(sel_normed, m.lm_head, Tensor(), logits);  // F32 logits from activations of any dtype
  return logits;
}

}  // namespace osprey
