#include "model/model.h"

#include <cmath>
#include <cstring>
#include <map>

#include "core/check.h"
#include "loader/gguf_file.h"
#include "loader/weights.h"
#include "model/arch_registry.h"
#include "ops/rope_freq.h"

namespace osprey {

namespace {

// One decoder layer's weights. Optional tensors are undefined when absent.
struct LayerWeights {
  Tensor attn_norm;  // [d] F32
  Tensor wq, wk, wv;  // [hq*hd, d], [hk*hd, d], [hk*hd, d]
  Tensor bq, bk, bv;  // F32 biases or undefined
  Tensor q_norm, k_norm;  // [hd] F32 or undefined
  Tensor wo;              // [d, hq*hd]
  Tensor ffn_norm;        // [d] F32
  Tensor w_gate_up;       // [2f, d]: gate rows then up rows
  Tensor w_down;          // [d, f]
};

// Step buffers on the backend, sized by reserve().
struct Workspace {
  int max_tokens = 0;
  int max_logit_rows = 0;
  std::vector<void*> allocations;
  Tensor resid, normed, q, k, v, attn, proj, gate_up, act, sel, logits;
};

}  // namespace

struct Model::Impl {
  LoadedWeights weights;
  const ArchSpec* arch = nullptr;
  Tensor embed;       // [vocab, d]
  Tensor final_norm;  // [d] F32
  Tensor lm_head;     // [vocab, d]
  std::vector<LayerWeights> layers;
  std::vector<float> inv_freq_host;
  float* inv_freq = nullptr;  // on the backend's device
  ops::RopeTable rope;
  std::vector<std::vector<uint8_t>> owned;  // converted / fused host tensors
  std::vector<void*> device_allocations;    // uploaded weights (non-CPU backends)
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

namespace {

// Binds and checks weights by name. Collects the first error.
class Binder {
 public:
  Binder(LoadedWeights& w, std::vector<std::vector<uint8_t>>& owned, const std::string& origin)
      : w_(w), owned_(owned), origin_(origin) {}

  // A tensor of the given shape, any dtype the backend can multiply with.
  Tensor matrix(const std::string& name, int64_t rows, int64_t cols, bool required = true) {
    const Tensor* t = find(name, required);
    if (!t) return {};
    if (t->ndim() != 2 || t->dim(0) != rows || t->dim(1) != cols) {
      fail(name, "has shape " + t->shape_string() + ", expected [" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "]");
      return {};
    }
    if (t->dtype() == DType::kI32 || t->dtype() == DType::kI64 || t->dtype() == DType::kU8) {
      fail(name, "has integer dtype " + std::string(dtype_name(t->dtype())));
      return {};
    }
    return *t;
  }

  // A 1-D tensor converted to F32 (norm weights, biases).
  Tensor vector_f32(const std::string& name, int64_t n, bool required = true) {
    const Tensor* t = find(name, required);
    if (!t) return {};
    if (t->numel() != n || t->ndim() != 1) {
      fail(name, "has shape " + t->shape_string() + ", expected [" + std::to_string(n) + "]");
      return {};
    }
    if (t->dtype() == DType::kF32) return *t;
    if (dtype_is_quantized(t->dtype()) || t->dtype() == DType::kI32 || t->dtype() == DType::kI64 ||
        t->dtype() == DType::kU8) {
      fail(name, "has unsupported dtype " + std::string(dtype_name(t->dtype())) + " for a vector");
      return {};
    }
    auto& buf = owned_.emplace_back(static_cast<size_t>(n) * sizeof(float));
    dequantize_row(t->dtype(), t->data(), reinterpret_cast<float*>(buf.data()), n);
    return Tensor(buf.data(), DType::kF32, {n});
  }

  // Rows of a then rows of b in one tensor (same dtype and columns).
  Tensor concat_rows(const Tensor& a, const Tensor& b, const std::string& what) {
    if (!a.defined() || !b.defined()) return {};
    if (a.dtype() != b.dtype()) {
      fail(what, "gate and up projections have different dtypes");
      return {};
    }
    auto& buf = owned_.emplace_back(static_cast<size_t>(a.nbytes() + b.nbytes()));
    std::memcpy(buf.data(), a.data(), static_cast<size_t>(a.nbytes()));
    std::memcpy(buf.data() + a.nbytes(), b.data(), static_cast<size_t>(b.nbytes()));
    return Tensor(buf.data(), a.dtype(), {a.dim(0) + b.dim(0), a.dim(1)});
  }

  bool has(const std::string& name) const { return w_.tensors.count(name) != 0; }
  const Status& status() const { return status_; }

 private:
  const Tensor* find(const std::string& name, bool required) {
    auto it = w_.tensors.find(name);
    if (it == w_.tensors.end()) {
      if (required) fail(name, "is missing");
      return nullptr;
    }
    return &it->second;
  }
  void fail(const std::string& name, const std::string& what) {
    if (status_.ok()) status_ = corrupt(origin_ + ": tensor '" + name + "' " + what);
  }

  LoadedWeights& w_;
  std::vector<std::vector<uint8_t>>& owned_;
  std::string origin_;
  Status status_;
};

}  // namespace

Expected<std::unique_ptr<Model>> Model::load(const std::string& path, ops::Backend& backend,
                                             const ModelLoadOptions& options) {
  if (options.load_format != "auto") {
    return unsupported("load format '" + options.load_format + "' is not supported yet");
  }
  OSP_ASSIGN_OR_RETURN(LoadedWeights weights, load_weights(path));

  std::unique_ptr<Model> model(new Model());
  Impl& m = *model->impl_;
  model->backend_ = &backend;
  model->path_ = path;

  if (weights.format == LoadedWeights::Format::kGguf) {
    OSP_ASSIGN_OR_RETURN(model->config_, model_config_from_gguf(*weights.gguf));
  } else {
    OSP_ASSIGN_OR_RETURN(model->config_, model_config_from_hf_json(weights.config_json, path + "/config.json"));
  }
  ModelConfig& c = model->config_;
  OSP_RETURN_IF_ERROR(c.validate());
  m.arch = find_arch(c.architecture);
  if (!m.arch) {
    std::string list;
    for (auto a : supported_archs()) list += (list.empty() ? "" : ", ") + std::string(a);
    return unsupported(path + ": architecture '" + c.architecture + "' is not supported (supported: " + list + ")");
  }
  m.weights = std::move(weights);

  const int64_t d = c.hidden_size, hd = c.head_dim, hq = c.num_heads, hk = c.num_kv_heads;
  const int64_t f = c.intermediate_size, vocab = c.vocab_size;
  Binder b(m.weights, m.owned, path);
  m.embed = b.matrix("model.embed_tokens.weight", vocab, d);
  m.final_norm = b.vector_f32("model.norm.weight", d);
  if (b.has("lm_head.weight")) {
    m.lm_head = b.matrix("lm_head.weight", vocab, d);
  } else if (c.tie_word_embeddings || m.weights.format == LoadedWeights::Format::kGguf) {
    m.lm_head = m.embed;
  } else {
    m.lm_head = b.matrix("lm_head.weight", vocab, d);  // reports it missing
  }
  const bool want_bias = m.arch->qkv_bias || c.attention_bias;
  m.layers.resize(static_cast<size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers && b.status().ok(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = m.layers[static_cast<size_t>(l)];
    L.attn_norm = b.vector_f32(p + "input_layernorm.weight", d);
    L.wq = b.matrix(p + "self_attn.q_proj.weight", hq * hd, d);
    L.wk = b.matrix(p + "self_attn.k_proj.weight", hk * hd, d);
    L.wv = b.matrix(p + "self_attn.v_proj.weight", hk * hd, d);
    if (want_bias || b.has(p + "self_attn.q_proj.bias")) {
      L.bq = b.vector_f32(p + "self_attn.q_proj.bias", hq * hd, want_bias);
      L.bk = b.vector_f32(p + "self_attn.k_proj.bias", hk * hd, want_bias);
      L.bv = b.vector_f32(p + "self_attn.v_proj.bias", hk * hd, want_bias);
    }
    if (m.arch->qk_norm || c.qk_norm) {
      L.q_norm = b.vector_f32(p + "self_attn.q_norm.weight", hd);
      L.k_norm = b.vector_f32(p + "self_attn.k_norm.weight", hd);
    }
    L.wo = b.matrix(p + "self_attn.o_proj.weight", d, hq * hd);
    L.ffn_norm = b.vector_f32(p + "post_attention_layernorm.weight", d);
    Tensor gate = b.matrix(p + "mlp.gate_proj.weight", f, d);
    Tensor up = b.matrix(p + "mlp.up_proj.weight", f, d);
    L.w_gate_up = b.concat_rows(gate, up, p + "mlp");
    L.w_down = b.matrix(p + "mlp.down_proj.weight", d, f);
  }
  OSP_RETURN_IF_ERROR(b.status());

  // Statistics for `osprey info`.
  for (const auto& [name, t] : m.weights.tensors) {
    m.dtype_counts[std::string(dtype_name(t.dtype()))]++;
    m.weight_bytes += static_cast<size_t>(t.nbytes());
  }

  // Non-CPU backends get their own copy of every bound tensor.
  if (backend.device() != Device::kCpu) {
    auto upload = [&](Tensor& t) {
      if (!t.defined()) return;
      void* p = backend.alloc(static_cast<size_t>(t.nbytes()));
      backend.copy_to_device(p, t.data(), static_cast<size_t>(t.nbytes()));
      m.device_allocations.push_back(p);
      t = Tensor(p, t.dtype(), t.shape(), t.ndim(), backend.device());
    };
    const bool tied = m.lm_head.data() == m.embed.data();
    upload(m.embed);
    upload(m.final_norm);
    if (tied) {
      m.lm_head = m.embed;
    } else {
      upload(m.lm_head);
    }
    for (auto& L : m.layers) {
      for (Tensor* t : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm, &L.wo,
                        &L.ffn_norm, &L.w_gate_up, &L.w_down}) {
        upload(*t);
      }
    }
  }

  m.inv_freq_host = ops::make_rope_inv_freq(c.rope_theta, c.head_dim, c.rope_scaling);
  const size_t freq_bytes = m.inv_freq_host.size() * sizeof(float);
  m.inv_freq = static_cast<float*>(backend.alloc(freq_bytes));
  m.device_allocations.push_back(m.inv_freq);
  backend.copy_to_device(m.inv_freq, m.inv_freq_host.data(), freq_bytes);
  m.rope.inv_freq = m.inv_freq;
  m.rope.rotary_dim = c.head_dim;
  return model;
}

size_t Model::kv_bytes_per_token() const {
  const ModelConfig& c = config_;
  return 2ull * static_cast<size_t>(c.num_layers) * static_cast<size_t>(c.num_kv_heads) *
         static_cast<size_t>(c.head_dim) * sizeof(float);
}

KvCache Model::allocate_kv(int num_blocks, int block_size) {
  OSP_CHECK(num_blocks > 0 && block_size > 0);
  const ModelConfig& c = config_;
  KvCache kv;
  kv.num_blocks = num_blocks;
  kv.block_size = block_size;
  const size_t bytes = static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size) *
                       static_cast<size_t>(c.num_kv_heads) * static_cast<size_t>(c.head_dim) * sizeof(float);
  for (int l = 0; l < c.num_layers; ++l) {
    ops::LayerKv layer;
    layer.k = Tensor(backend_->alloc(bytes), DType::kF32, {num_blocks, block_size, c.num_kv_heads, c.head_dim},
                     backend_->device());
    layer.v = Tensor(backend_->alloc(bytes), DType::kF32, {num_blocks, block_size, c.num_kv_heads, c.head_dim},
                     backend_->device());
    kv.layers.push_back(layer);
  }
  return kv;
}

void Model::free_kv(KvCache& kv) {
  for (auto& layer : kv.layers) {
    backend_->free(layer.k.data());
    backend_->free(layer.v.data());
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
  auto make = [&](int64_t rows, int64_t cols) {
    void* p = backend_->alloc(static_cast<size_t>(rows * cols) * sizeof(float));
    ws.allocations.push_back(p);
    return Tensor(p, DType::kF32, {rows, cols}, backend_->device());
  };
  ws.resid = make(n, c.hidden_size);
  ws.normed = make(n, c.hidden_size);
  ws.q = make(n, static_cast<int64_t>(c.num_heads) * c.head_dim);
  ws.k = make(n, static_cast<int64_t>(c.num_kv_heads) * c.head_dim);
  ws.v = make(n, static_cast<int64_t>(c.num_kv_heads) * c.head_dim);
  ws.attn = make(n, static_cast<int64_t>(c.num_heads) * c.head_dim);
  ws.proj = make(n, c.hidden_size);
  ws.gate_up = make(n, 2 * static_cast<int64_t>(c.intermediate_size));
  ws.act = make(n, c.intermediate_size);
  ws.sel = make(max_logit_rows, c.hidden_size);
  ws.logits = make(max_logit_rows, c.vocab_size);
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
  Tensor q = ws.q.slice(0, n), k = ws.k.slice(0, n), v = ws.v.slice(0, n);
  Tensor attn = ws.attn.slice(0, n);
  Tensor proj = ws.proj.slice(0, n);
  Tensor gate_up = ws.gate_up.slice(0, n);
  Tensor act = ws.act.slice(0, n);
  Tensor q3 = q.view({n, hq, hd});
  Tensor k3 = k.view({n, hk, hd});
  Tensor v3 = v.view({n, hk, hd});
  Tensor attn3 = attn.view({n, hq, hd});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int window = m.arch->sliding_window ? c.sliding_window : 0;

  be.embedding(m.embed, batch.token_ids, resid);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& L = m.layers[l];
    if (l == 0) {
      be.rms_norm(resid, L.attn_norm, c.rms_norm_eps, normed);
    } else {
      be.add_rms_norm(resid, proj, L.attn_norm, c.rms_norm_eps, normed);  // + previous MLP output
    }
    be.matmul(normed, L.wq, L.bq, q);
    be.matmul(normed, L.wk, L.bk, k);
    be.matmul(normed, L.wv, L.bv, v);
    if (L.q_norm.defined()) {
      be.head_rms_norm(q3, L.q_norm, c.rms_norm_eps);
      be.head_rms_norm(k3, L.k_norm, c.rms_norm_eps);
    }
    be.rope(q3, k3, batch.attn.positions, m.rope);
    be.kv_write(k3, v3, batch.attn, kv.layers[l]);
    be.paged_attention(q3, kv.layers[l], batch.attn, scale, window, attn3);
    be.matmul(attn, L.wo, Tensor(), proj);
    be.add_rms_norm(resid, proj, L.ffn_norm, c.rms_norm_eps, normed);  // + attention output
    be.matmul(normed, L.w_gate_up, Tensor(), gate_up);
    be.silu_mul(gate_up, act);
    be.matmul(act, L.w_down, Tensor(), proj);
  }
  const int64_t r = batch.num_logit_rows;
  OSP_CHECK_LE(r, n);
  if (r == 0) return ws.logits.slice(0, 0);  // a step of middle prefill chunks only
  Tensor sel = ws.sel.slice(0, r);
  Tensor sel_normed = ws.normed.slice(0, r);  // normed is free once the layers are done
  be.add(resid, proj);
  be.gather_rows(resid, batch.logit_rows, static_cast<int>(r), sel);
  be.rms_norm(sel, m.final_norm, c.rms_norm_eps, sel_normed);
  Tensor logits = ws.logits.slice(0, r);
  be.matmul(sel_normed, m.lm_head, Tensor(), logits);
  return logits;
}

}  // namespace osprey
