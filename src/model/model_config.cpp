#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "loader/gguf_file.h"

namespace osprey {

namespace {

using nlohmann::json;
using RopeType = ops::RopeScalingParams::Type;

// ---- config.json helpers -----------------------------------------------------

class HfReader {
 public:
  HfReader(const json& j, const std::string& origin) : j_(j), origin_(origin) {}

  Status error(const std::string& field, const std::string& what) const {
    return corrupt("config '" + origin_ + "': field '" + field + "' " + what);
  }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  // Integer field (an integral float such as 4096.0 is accepted); `def` when
  // absent or null, an error when required and absent.
  Status get_int(const json& obj, const std::string& key, int& out, std::optional<int> def) const {
    if (!obj.contains(key) || obj.at(key).is_null()) {
      if (!def) return error(key, "is missing");
      out = *def;
      return Status::Ok();
    }
    const json& v = obj.at(key);
    double d = 0;
    if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
        return error(key, "is out of range: " + v.dump());
      }
      out = static_cast<int>(x);
      return Status::Ok();
    }
    if (v.is_number_float()) {
      d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 2147483647.0) {
        out = static_cast<int>(d);
        return Status::Ok();
      }
    }
    return error(key, "is not an integer: " + v.dump());
  }
  Status get_int(const std::string& key, int& out, std::optional<int> def) const { return get_int(j_, key, out, def); }

  Status get_float(const json& obj, const std::string& key, float& out, std::optional<float> def) const {
    if (!obj.contains(key) || obj.at(key).is_null()) {
      if (!def) return error(key, "is missing");
      out = *def;
      return Status::Ok();
    }
    const json& v = obj.at(key);
    if (!v.is_number()) return error(key, "is not a number: " + v.dump());
    const double d = v.get<double>();
    if (!std::isfinite(d)) return error(key, "is not finite");
    out = static_cast<float>(d);
    return Status::Ok();
  }
  Status get_float(const std::string& key, float& out, std::optional<float> def) const {
    return get_float(j_, key, out, def);
  }

  Status get_bool(const std::string& key, bool& out, bool def) const {
    if (!has(key.c_str())) {
      out = def;
      return Status::Ok();
    }
    if (!j_.at(key).is_boolean()) return error(key, "is not a boolean: " + j_.at(key).dump());
    out = j_.at(key).get<bool>();
    return Status::Ok();
  }

  const json& root() const { return j_; }

 private:
  const json& j_;
  const std::string& origin_;
};

// rope_theta and rope scaling from rope_parameters (transformers 5) or
// rope_scaling (older configs); values inside the dict take priority over
// the top-level rope_theta, as in transformers.
Status parse_hf_rope(const HfReader& r, ModelConfig& c) {
  const json& j = r.root();
  const json* rp = nullptr;
  const char* field = "rope_parameters";
  if (j.contains("rope_parameters") && j.at("rope_parameters").is_object()) {
    rp = &j.at("rope_parameters");
  } else if (j.contains("rope_scaling") && j.at("rope_scaling").is_object()) {
    rp = &j.at("rope_scaling");
    field = "rope_scaling";
  } else {
    for (const char* k : {"rope_parameters", "rope_scaling"}) {
      if (j.contains(k) && !j.at(k).is_null()) return r.error(k, "is not an object");
    }
  }
  // Parameters nested by layer type: osprey has one rope for all layers.
  if (rp != nullptr && rp->contains("full_attention") && rp->at("full_attention").is_object()) {
    if (rp->contains("sliding_attention") && rp->at("sliding_attention") != rp->at("full_attention")) {
      return unsupported("config: different rope parameters per layer type are not supported");
    }
    rp = &rp->at("full_attention");
  }
  OSP_RETURN_IF_ERROR(r.get_float("rope_theta", c.rope_theta, 10000.0f));
  if (rp == nullptr) return Status::Ok();
  OSP_RETURN_IF_ERROR(r.get_float(*rp, "rope_theta", c.rope_theta, c.rope_theta));

  std::string type = "default";
  for (const char* k : {"rope_type", "type"}) {
    if (rp->contains(k)) {
      if (!rp->at(k).is_string()) return r.error(std::string(field) + "." + k, "is not a string");
      type = rp->at(k).get<std::string>();
      break;
    }
  }
  ops::RopeScalingParams& s = c.rope_scaling;
  if (type == "default") {
    s.type = RopeType::kNone;
    return Status::Ok();
  }
  if (type == "linear") {
    s.type = RopeType::kLinear;
    OSP_RETURN_IF_ERROR(r.get_float(*rp, "factor", s.factor, std::nullopt));
  } else if (type == "dynamic") {
    s.type = RopeType::kDynamic;
    OSP_RETURN_IF_ERROR(r.get_float(*rp, "factor", s.factor, std::nullopt));
    OSP_RETURN_IF_ERROR(r.get_int(*rp, "original_max_position_embeddings", s.original_max_position_embeddings,
                                  c.max_position_embeddings));
  } else if (type == "llama3") {
    s.type = RopeType::kLlama3;
    OSP_RETURN_IF_ERROR(r.get_float(*rp, "factor", s.factor, std::nullopt));
    OSP_RETURN_IF_ERROR(r.get_float(*rp, "low_freq_factor", s.low_freq_factor, std::nullopt));
    OSP_RETURN_IF_ERROR(r.get_float(*rp, "high_freq_factor", s.high_freq_factor, std::nullopt));
    OSP_RETURN_IF_ERROR(r.get_int(*rp, "original_max_position_embeddings", s.original_max_position_embeddings,
                                  c.max_position_embeddings));
  } else {
    return unsupported("config: rope type '" + type + "' is not supported (default, linear, dynamic, llama3)");
  }
  return Status::Ok();
}

Status parse_hf_eos(const HfReader& r, ModelConfig& c) {
  const json& j = r.root();
  if (!r.has("eos_token_id")) return Status::Ok();
  const json& v = j.at("eos_token_id");
  if (v.is_array()) {
    if (v.size() > 64) return r.error("eos_token_id", "lists more than 64 ids");
    for (size_t k = 0; k < v.size(); ++k) {
      if (!v[k].is_number_integer()) return r.error("eos_token_id", "holds a non-integer");
      const int64_t x = v[k].get<int64_t>();
      if (x < 0 || x > std::numeric_limits<int>::max()) return r.error("eos_token_id", "holds an out-of-range id");
      c.eos_token_ids.push_back(static_cast<int>(x));
    }
    return Status::Ok();
  }
  int id = 0;
  OSP_RETURN_IF_ERROR(r.get_int("eos_token_id", id, std::nullopt));
  c.eos_token_ids.push_back(id);
  return Status::Ok();
}

// Sliding window for one window size applied to every layer; a mix of
// sliding and full layers is refused.
Status parse_hf_sliding(const HfReader& r, ModelConfig& c) {
  const json& j = r.root();
  if (c.architecture == "mistral") {
    if (r.has("sliding_window")) OSP_RETURN_IF_ERROR(r.get_int("sliding_window", c.sliding_window, 0));
    return Status::Ok();
  }
  if (c.architecture != "qwen2" && c.architecture != "qwen3") return Status::Ok();
  bool use = false;
  OSP_RETURN_IF_ERROR(r.get_bool("use_sliding_window", use, false));
  int window = 0;
  if (use && r.has("sliding_window")) OSP_RETURN_IF_ERROR(r.get_int("sliding_window", window, 0));
  int num_sliding = 0;
  if (r.has("layer_types")) {
    const json& lt = j.at("layer_types");
    if (!lt.is_array()) return r.error("layer_types", "is not an array");
    for (const json& t : lt) {
      if (!t.is_string()) return r.error("layer_types", "holds a non-string");
      if (t.get<std::string>() == "sliding_attention") ++num_sliding;
    }
    if (num_sliding > 0 && window == 0) return r.error("layer_types", "names sliding layers but no sliding_window is in use");
  } else if (window > 0) {
    int max_window_layers = 28;
    OSP_RETURN_IF_ERROR(r.get_int("max_window_layers", max_window_layers, 28));
    num_sliding = std::max(0, c.num_layers - std::max(0, max_window_layers));
  }
  if (num_sliding == 0) return Status::Ok();
  if (num_sliding != c.num_layers) {
    return unsupported("config: " + std::to_string(num_sliding) + " of " + std::to_string(c.num_layers) +
                       " layers use sliding-window attention; mixed layer types are not supported");
  }
  c.sliding_window = window;
  return Status::Ok();
}

// ---- GGUF llama3 rope factors --------------------------------------------------

// llama.cpp stores Llama 3.1-style rope scaling as a per-frequency factor
// tensor rope_freqs.weight [head_dim / 2]. Recovers the llama3 parameters by
// matching against the standard (low 1, high 4, original 8192) shape with
// factor = the largest entry.
Status rope_from_gguf_factors(const GgufFile& g, const GgufTensorInfo& t, ModelConfig& c) {
  const std::string where = "GGUF '" + g.name() + "': rope_freqs.weight";
  const int half = c.head_dim / 2;
  if (t.dtype != DType::kF32 || t.shape.size() != 1 || t.shape[0] != half) {
    return corrupt(where + " is not an F32 vector of head_dim / 2 entries");
  }
  std::vector<float> f(static_cast<size_t>(half));
  std::memcpy(f.data(), t.data, f.size() * 4);
  float factor = 1.0f;
  for (float x : f) {
    if (!std::isfinite(x) || x <= 0) return corrupt(where + " holds a non-positive or non-finite factor");
    factor = std::max(factor, x);
  }
  if (factor == 1.0f) return Status::Ok();  // all ones: no scaling
  ops::RopeScalingParams s;
  s.type = RopeType::kLlama3;
  s.factor = factor;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position_embeddings = 8192;
  const double old_len = s.original_max_position_embeddings;
  const double low_wavelen = old_len / s.low_freq_factor;
  const double high_wavelen = old_len / s.high_freq_factor;
  for (int i = 0; i < half; ++i) {
    const double freq = 1.0 / std::pow(static_cast<double>(c.rope_theta), 2.0 * i / c.head_dim);
    const double wavelen = 2 * M_PI / freq;
    double expect;
    if (wavelen < high_wavelen) {
      expect = 1.0;
    } else if (wavelen > low_wavelen) {
      expect = factor;
    } else {
      const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      expect = 1.0 / ((1 - smooth) / factor + smooth);
    }
    if (std::fabs(expect - f[static_cast<size_t>(i)]) > 1e-3 * expect) {
      return unsupported(where + " does not match llama3 rope scaling (factor " + std::to_string(factor) +
                         ", low 1, high 4, original 8192) at entry " + std::to_string(i));
    }
  }
  c.rope_scaling = s;
  return Status::Ok();
}

}  // namespace

Expected<ModelConfig> model_config_from_hf_json(const std::string& json_text, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return corrupt("config '" + origin + "' is not valid JSON: " + e.what());
  }
  if (!j.is_object()) return corrupt("config '" + origin + "' is not a JSON object");
  ModelConfig c;
  const HfReader r(j, origin);
  try {
    if (!r.has("model_type") || !j.at("model_type").is_string()) return r.error("model_type", "is missing");
    c.architecture = j.at("model_type").get<std::string>();
    if (c.architecture != "llama" && c.architecture != "mistral" && c.architecture != "qwen2" &&
        c.architecture != "qwen3") {
      return unsupported("config '" + origin + "': model_type '" + c.architecture +
                         "' is not supported (llama, mistral, qwen2, qwen3)");
    }
    OSP_RETURN_IF_ERROR(r.get_int("vocab_size", c.vocab_size, std::nullopt));
    OSP_RETURN_IF_ERROR(r.get_int("hidden_size", c.hidden_size, std::nullopt));
    OSP_RETURN_IF_ERROR(r.get_int("intermediate_size", c.intermediate_size, std::nullopt));
    OSP_RETURN_IF_ERROR(r.get_int("num_hidden_layers", c.num_layers, std::nullopt));
    OSP_RETURN_IF_ERROR(r.get_int("num_attention_heads", c.num_heads, std::nullopt));
    OSP_RETURN_IF_ERROR(r.get_int("num_key_value_heads", c.num_kv_heads, c.num_heads));
    if (c.num_heads <= 0) return r.error("num_attention_heads", "must be positive");
    // Qwen3Config defaults head_dim to 128; the others derive it.
    const int head_dim_default = c.architecture == "qwen3" ? 128 : c.hidden_size / c.num_heads;
    OSP_RETURN_IF_ERROR(r.get_int("head_dim", c.head_dim, head_dim_default));
    const int max_pos_default = c.architecture == "llama" ? 2048 : c.architecture == "mistral" ? 131072 : 32768;
    OSP_RETURN_IF_ERROR(r.get_int("max_position_embeddings", c.max_position_embeddings, max_pos_default));
    OSP_RETURN_IF_ERROR(r.get_float("rms_norm_eps", c.rms_norm_eps, 1e-6f));
    OSP_RETURN_IF_ERROR(parse_hf_rope(r, c));
    OSP_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", c.tie_word_embeddings, false));
    if (c.architecture == "qwen2") {
      c.attention_bias = true;  // Qwen2 attention always has q/k/v biases
    } else if (c.architecture == "mistral") {
      c.attention_bias = false;
    } else {
      OSP_RETURN_IF_ERROR(r.get_bool("attention_bias", c.attention_bias, false));
    }
    bool mlp_bias = false;
    OSP_RETURN_IF_ERROR(r.get_bool("mlp_bias", mlp_bias, false));
    if (mlp_bias) return unsupported("config '" + origin + "': mlp_bias = true is not supported");
    c.qk_norm = c.architecture == "qwen3";
    OSP_RETURN_IF_ERROR(parse_hf_sliding(r, c));
    if (r.has("bos_token_id")) OSP_RETURN_IF_ERROR(r.get_int("bos_token_id", c.bos_token_id, -1));
    OSP_RETURN_IF_ERROR(parse_hf_eos(r, c));
    for (const char* k : {"torch_dtype", "dtype"}) {
      if (r.has(k) && j.at(k).is_string()) {
        c.torch_dtype = j.at(k).get<std::string>();
        break;
      }
    }
  } catch (const json::exception& e) {
    return corrupt("config '" + origin + "': " + e.what());
  }
  OSP_RETURN_IF_ERROR(c.validate());
  return c;
}

Expected<ModelConfig> model_config_from_gguf(const GgufFile& g) {
  ModelConfig c;
  const std::string where = "GGUF '" + g.name() + "'";
  const std::optional<std::string> arch = g.get_string("general.architecture");
  if (!arch) return corrupt(where + ": general.architecture is missing");
  c.architecture = *arch;
  if (c.architecture != "llama" && c.architecture != "qwen2" && c.architecture != "qwen3") {
    return unsupported(where + ": architecture '" + c.architecture + "' is not supported (llama, qwen2, qwen3)");
  }
  const std::string p = c.architecture + ".";
  auto get_int = [&](const std::string& key, int& out, std::optional<int> def) -> Status {
    const GgufValue* v = g.find(key);
    if (v == nullptr) {
      if (!def) return corrupt(where + ": metadata '" + key + "' is missing");
      out = *def;
      return Status::Ok();
    }
    const std::optional<int64_t> x = g.get_int(key);
    if (!x || *x < std::numeric_limits<int>::min() || *x > std::numeric_limits<int>::max()) {
      return corrupt(where + ": metadata '" + key + "' is not an integer in range");
    }
    out = static_cast<int>(*x);
    return Status::Ok();
  };
  auto get_float = [&](const std::string& key, float& out, float def) -> Status {
    if (g.find(key) == nullptr) {
      out = def;
      return Status::Ok();
    }
    const std::optional<double> x = g.get_float(key);
    if (!x || !std::isfinite(*x)) return corrupt(where + ": metadata '" + key + "' is not a finite number");
    out = static_cast<float>(*x);
    return Status::Ok();
  };
  OSP_RETURN_IF_ERROR(get_int(p + "block_count", c.num_layers, std::nullopt));
  OSP_RETURN_IF_ERROR(get_int(p + "embedding_length", c.hidden_size, std::nullopt));
  OSP_RETURN_IF_ERROR(get_int(p + "feed_forward_length", c.intermediate_size, std::nullopt));
  OSP_RETURN_IF_ERROR(get_int(p + "attention.head_count", c.num_heads, std::nullopt));
  OSP_RETURN_IF_ERROR(get_int(p + "attention.head_count_kv", c.num_kv_heads, c.num_heads));
  if (c.num_heads <= 0) return corrupt(where + ": " + p + "attention.head_count must be positive");
  OSP_RETURN_IF_ERROR(get_int(p + "attention.key_length", c.head_dim, c.hidden_size / c.num_heads));
  OSP_RETURN_IF_ERROR(get_int(p + "context_length", c.max_position_embeddings, 2048));
  OSP_RETURN_IF_ERROR(get_float(p + "rope.freq_base", c.rope_theta, 10000.0f));
  OSP_RETURN_IF_ERROR(get_float(p + "attention.layer_norm_rms_epsilon", c.rms_norm_eps, 1e-5f));

  // Vocabulary: <arch>.vocab_size, else the token list, else the embedding rows.
  const GgufTensorInfo* embd = g.find_tensor("token_embd.weight");
  if (g.find(p + "vocab_size") != nullptr) {
    OSP_RETURN_IF_ERROR(get_int(p + "vocab_size", c.vocab_size, std::nullopt));
  } else if (const auto* tokens = g.get_string_array("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int>(std::min<size_t>(tokens->size(), std::numeric_limits<int>::max()));
  } else if (embd != nullptr && embd->shape.size() == 2 && embd->shape[0] <= std::numeric_limits<int>::max()) {
    c.vocab_size = static_cast<int>(embd->shape[0]);
  } else {
    return corrupt(where + ": cannot determine the vocabulary size");
  }

  const std::string scaling = g.get_string(p + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    c.rope_scaling.type = RopeType::kLinear;
    OSP_RETURN_IF_ERROR(get_float(p + "rope.scaling.factor", c.rope_scaling.factor, 1.0f));
  } else if (scaling != "none") {
    return unsupported(where + ": rope scaling type '" + scaling + "' is not supported");
  }
  if (const GgufTensorInfo* rf = g.find_tensor("rope_freqs.weight")) {
    if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > 4096) {
      return corrupt(where + ": invalid head_dim " + std::to_string(c.head_dim));
    }
    if (c.rope_scaling.type != RopeType::kNone) {
      return unsupported(where + ": both rope.scaling.type and rope_freqs.weight are present");
    }
    OSP_RETURN_IF_ERROR(rope_from_gguf_factors(g, *rf, c));
  }

  c.tie_word_embeddings = g.find_tensor("output.weight") == nullptr;
  c.attention_bias = c.architecture == "qwen2" || g.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = c.architecture == "qwen3";
  c.bos_token_id = -1;
  if (g.find("tokenizer.ggml.bos_token_id") != nullptr) {
    OSP_RETURN_IF_ERROR(get_int("tokenizer.ggml.bos_token_id", c.bos_token_id, -1));
  }
  // End-of-generation ids: eos, then eot/eom when distinct (as llama.cpp does).
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (g.find(key) == nullptr) continue;
    int id = 0;
    OSP_RETURN_IF_ERROR(get_int(key, id, std::nullopt));
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(id);
    }
  }
  if (embd != nullptr) c.torch_dtype = std::string(dtype_name(embd->dtype));
  OSP_RETURN_IF_ERROR(c.validate());
  return c;
}

Status ModelConfig::validate() const {
  auto bad = [](const std::string& field, const std::string& what) {
    return invalid_argument("model config: " + field + " " + what);
  };
  auto range = [&](const char* field, int64_t v, int64_t lo, int64_t hi) -> Status {
    if (v < lo || v > hi) {
      return bad(field, "= " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return Status::Ok();
  };
  if (architecture.empty()) return bad("architecture", "is empty");
  OSP_RETURN_IF_ERROR(range("vocab_size", vocab_size, 1, 1 << 24));
  OSP_RETURN_IF_ERROR(range("hidden_size", hidden_size, 1, 1 << 17));
  OSP_RETURN_IF_ERROR(range("intermediate_size", intermediate_size, 1, 1 << 20));
  OSP_RETURN_IF_ERROR(range("num_layers", num_layers, 1, 1024));
  OSP_RETURN_IF_ERROR(range("num_heads", num_heads, 1, 1024));
  OSP_RETURN_IF_ERROR(range("num_kv_heads", num_kv_heads, 1, num_heads));
  if (num_heads % num_kv_heads != 0) {
    return bad("num_kv_heads", "= " + std::to_string(num_kv_heads) + " does not divide num_heads = " +
                                   std::to_string(num_heads));
  }
  OSP_RETURN_IF_ERROR(range("head_dim", head_dim, 2, 1024));
  if (head_dim % 2 != 0) return bad("head_dim", "= " + std::to_string(head_dim) + " is odd (rope needs pairs)");
  OSP_RETURN_IF_ERROR(range("max_position_embeddings", max_position_embeddings, 1, 1 << 26));
  if (!(rms_norm_eps > 0.0f && rms_norm_eps < 1.0f)) return bad("rms_norm_eps", "= " + std::to_string(rms_norm_eps) + " is outside (0, 1)");
  if (!(rope_theta > 0.0f) || !std::isfinite(rope_theta)) return bad("rope_theta", "must be positive and finite");
  if (rope_scaling.type != RopeType::kNone) {
    if (!(rope_scaling.factor > 0.0f) || !std::isfinite(rope_scaling.factor)) {
      return bad("rope_scaling.factor", "must be positive and finite");
    }
    if (rope_scaling.type == RopeType::kLlama3 &&
        !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor && rope_scaling.low_freq_factor > 0.0f)) {
      return bad("rope_scaling", "needs 0 < low_freq_factor < high_freq_factor");
    }
    if (rope_scaling.original_max_position_embeddings <= 0) {
      return bad("rope_scaling.original_max_position_embeddings", "must be positive");
    }
  }
  OSP_RETURN_IF_ERROR(range("sliding_window", sliding_window, 0, 1 << 26));
  OSP_RETURN_IF_ERROR(range("bos_token_id", bos_token_id, -1, vocab_size - 1));
  for (int id : eos_token_ids) OSP_RETURN_IF_ERROR(range("eos_token_id", id, 0, vocab_size - 1));
  return Status::Ok();
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size;
  const int64_t q = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv = static_cast<int64_t>(num_kv_heads) * head_dim;
  int64_t layer = h * q + 2 * h * kv + q * h  // q, k, v, o projections
                  + 3 * h * intermediate_size  // gate, up, down
                  + 2 * h;                     // two RMSNorm weights
  if (attention_bias) layer += q + 2 * kv;
  if (qk_norm) layer += 2 * head_dim;
  int64_t total = static_cast<int64_t>(vocab_size) * h + num_layers * layer + h;
  if (!tie_word_embeddings) total += static_cast<int64_t>(vocab_size) * h;
  return total;
}

}  // namespace osprey
