#include "loader/weights.h"

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loader/safetensors_file.h"

namespace osprey {

namespace {

namespace fs = std::filesystem;

constexpr uintmax_t kMaxJsonFileBytes = 64u << 20;  // config.json, index.json

// Backends read elements (or the fp16 fields of quant blocks) through typed
// pointers, so tensor data must be aligned to this many bytes.
size_t required_alignment(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    default: return 2;  // F16, BF16, and the quant blocks (uint16_t scales)
  }
}

// Copies misaligned data into an owned buffer (operator new aligns to 16).
const uint8_t* aligned_data(const uint8_t* data, uint64_t nbytes, DType t, LoadedWeights& w) {
  if (reinterpret_cast<uintptr_t>(data) % required_alignment(t) == 0) return data;
  auto buf = std::make_shared<std::vector<uint8_t>>(data, data + nbytes);
  w.keep_alive.push_back(buf);
  return buf->data();
}

Tensor make_tensor(const uint8_t* data, DType t, const std::vector<int64_t>& shape) {
  // Tensors are views; the weights are read-only by contract (see LoadedWeights).
  return Tensor(const_cast<uint8_t*>(data), t, shape.data(), static_cast<int>(shape.size()));
}

Expected<std::string> read_small_file(const fs::path& p, const std::string& what) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return not_found(what + " '" + p.string() + "' not found");
  const uintmax_t size = fs::file_size(p, ec);
  if (ec) return invalid_argument("cannot read " + what + " '" + p.string() + "': " + ec.message());
  if (size > kMaxJsonFileBytes) {
    return corrupt(what + " '" + p.string() + "' is " + std::to_string(size) + " bytes (limit 64 MiB)");
  }
  std::ifstream in(p, std::ios::binary);
  if (!in) return invalid_argument("cannot open " + what + " '" + p.string() + "'");
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (static_cast<uintmax_t>(in.gcount()) != size) return invalid_argument("short read of '" + p.string() + "'");
  return text;
}

Status add_safetensors(const std::string& path, LoadedWeights& w, std::set<std::string>* names_out) {
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::open(path));
  std::shared_ptr<SafetensorsFile> shared(std::move(f));
  for (const SafetensorsTensorInfo& ti : shared->tensors()) {
    const uint8_t* data = aligned_data(ti.data, ti.nbytes, ti.dtype, w);
    if (!w.tensors.emplace(ti.name, make_tensor(data, ti.dtype, ti.shape)).second) {
      return corrupt("tensor '" + ti.name + "' appears in more than one shard (again in '" + path + "')");
    }
    if (names_out != nullptr) names_out->insert(ti.name);
  }
  w.keep_alive.push_back(std::move(shared));
  return Status::Ok();
}

// A shard name from an index must be a plain file name inside the folder.
bool is_plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

Status load_hf_folder(const fs::path& dir, LoadedWeights& w) {
  OSP_ASSIGN_OR_RETURN(w.config_json, read_small_file(dir / "config.json", "config"));
  const fs::path index = dir / "model.safetensors.index.json";
  const fs::path single = dir / "model.safetensors";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    OSP_ASSIGN_OR_RETURN(std::string text, read_small_file(index, "safetensors index"));
    std::map<std::string, std::string> weight_map;  // tensor -> shard file
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
        return corrupt("safetensors index '" + index.string() + "' has no 'weight_map' object");
      }
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) {
          return corrupt("safetensors index '" + index.string() + "': shard of '" + it.key() + "' is not a string");
        }
        weight_map[it.key()] = it.value().get<std::string>();
      }
    } catch (const nlohmann::json::exception& e) {
      return corrupt("safetensors index '" + index.string() + "' is not valid JSON: " + e.what());
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : weight_map) {
      if (!is_plain_file_name(shard)) {
        return corrupt("safetensors index '" + index.string() + "' names shard '" + shard + "' for '" + tensor +
                       "', which is not a file name in the model folder");
      }
      shards.insert(shard);
    }
    if (shards.empty()) return corrupt("safetensors index '" + index.string() + "' lists no tensors");
    std::map<std::string, std::set<std::string>> shard_tensors;
    for (const std::string& shard : shards) {
      OSP_RETURN_IF_ERROR(add_safetensors((dir / shard).string(), w, &shard_tensors[shard]));
    }
    for (const auto& [tensor, shard] : weight_map) {
      if (shard_tensors[shard].count(tensor) == 0) {
        return corrupt("safetensors index '" + index.string() + "' places '" + tensor + "' in '" + shard +
                       "', which does not contain it");
      }
    }
    return Status::Ok();
  }
  if (fs::exists(single, ec)) return add_safetensors(single.string(), w, nullptr);
  return not_found("model folder '" + dir.string() +
                   "' has neither model.safetensors nor model.safetensors.index.json");
}

Status load_gguf(const std::string& path, LoadedWeights& w) {
  OSP_ASSIGN_OR_RETURN(w.gguf, GgufFile::open(path));
  const GgufFile& g = *w.gguf;
  const std::optional<std::string> arch = g.get_string("general.architecture");
  if (!arch) return corrupt("GGUF '" + path + "' has no string general.architecture");
  // llama.cpp permutes Q/K rows for arch "llama" (which also covers Mistral
  // conversions); qwen2/qwen3 are stored in Hugging Face order.
  const bool permuted = *arch == "llama";
  int64_t n_head = 0;
  int64_t n_kv = 0;
  if (permuted) {
    const std::optional<int64_t> h = g.get_int(*arch + ".attention.head_count");
    if (!h || *h <= 0 || *h > 4096) return corrupt("GGUF '" + path + "': missing or invalid " + *arch + ".attention.head_count");
    n_head = *h;
    n_kv = g.get_int(*arch + ".attention.head_count_kv").value_or(n_head);
    if (n_kv <= 0 || n_kv > n_head) {
      return corrupt("GGUF '" + path + "': invalid " + *arch + ".attention.head_count_kv " + std::to_string(n_kv));
    }
  }
  auto ends_with = [](const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const GgufTensorInfo& ti : g.tensors()) {
    const std::string hf = gguf_to_hf_name(ti.name).value_or(ti.name);
    const uint8_t* data = ti.data;
    int64_t heads = 0;
    if (permuted && (ends_with(hf, "self_attn.q_proj.weight") || ends_with(hf, "self_attn.q_proj.bias"))) heads = n_head;
    if (permuted && (ends_with(hf, "self_attn.k_proj.weight") || ends_with(hf, "self_attn.k_proj.bias"))) heads = n_kv;
    if (heads > 0) {
      const bool is_bias = ends_with(hf, ".bias");
      if (ti.shape.size() != (is_bias ? 1u : 2u) || (is_bias && dtype_is_quantized(ti.dtype))) {
        return corrupt("GGUF '" + path + "': tensor '" + ti.name + "' has an unexpected shape or type for a " +
                       (is_bias ? "bias" : "projection"));
      }
      const int64_t rows = ti.shape[0];
      const int64_t row_bytes = is_bias ? dtype_block_bytes(ti.dtype) : dtype_row_bytes(ti.dtype, ti.shape[1]);
      if (rows % heads != 0 || (rows / heads) % 2 != 0) {
        return corrupt("GGUF '" + path + "': tensor '" + ti.name + "' has " + std::to_string(rows) +
                       " rows, not a multiple of " + std::to_string(heads) + " heads of even size");
      }
      auto buf = std::make_shared<std::vector<uint8_t>>(ti.nbytes);
      permute_qk_rows(ti.data, buf->data(), rows, row_bytes, heads);
      data = buf->data();
      w.keep_alive.push_back(std::move(buf));
    } else {
      data = aligned_data(ti.data, ti.nbytes, ti.dtype, w);
    }
    if (!w.tensors.emplace(hf, make_tensor(data, ti.dtype, ti.shape)).second) {
      return corrupt("GGUF '" + path + "': two tensors map to the name '" + hf + "'");
    }
  }
  return Status::Ok();
}

}  // namespace

std::optional<std::string> gguf_to_hf_name(std::string_view name) {
  std::string_view suffix;
  for (std::string_view s : {std::string_view(".weight"), std::string_view(".bias")}) {
    if (name.size() > s.size() && name.substr(name.size() - s.size()) == s) {
      suffix = s;
      name.remove_suffix(s.size());
      break;
    }
  }
  if (suffix.empty()) return std::nullopt;
  if (name == "token_embd") return "model.embed_tokens" + std::string(suffix);
  if (name == "output_norm") return "model.norm" + std::string(suffix);
  if (name == "output") return "lm_head" + std::string(suffix);
  constexpr std::string_view kBlk = "blk.";
  if (name.substr(0, kBlk.size()) != kBlk) return std::nullopt;
  name.remove_prefix(kBlk.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 6) return std::nullopt;
  const std::string_view layer = name.substr(0, dot);
  for (char c : layer) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  if (layer.size() > 1 && layer[0] == '0') return std::nullopt;
  const std::string_view part = name.substr(dot + 1);
  static const std::pair<std::string_view, std::string_view> kParts[] = {
      {"attn_norm", "input_layernorm"},       {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},         {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"},    {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"},    {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},          {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  for (const auto& [g, hf] : kParts) {
    if (part == g) return "model.layers." + std::string(layer) + "." + std::string(hf) + std::string(suffix);
  }
  return std::nullopt;
}

void permute_qk_rows(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t row_bytes, int64_t num_heads,
                     bool hf_to_gguf) {
  OSP_CHECK(num_heads > 0 && rows % num_heads == 0 && (rows / num_heads) % 2 == 0);
  const int64_t head_dim = rows / num_heads;
  const int64_t half = head_dim / 2;
  const auto rb = static_cast<size_t>(row_bytes);
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t gguf_row = h * head_dim + i * 2 + j;
        const int64_t hf_row = h * head_dim + j * half + i;
        const int64_t from = hf_to_gguf ? hf_row : gguf_row;
        const int64_t to = hf_to_gguf ? gguf_row : hf_row;
        std::memcpy(dst + static_cast<size_t>(to) * rb, src + static_cast<size_t>(from) * rb, rb);
      }
    }
  }
}

Expected<LoadedWeights> load_weights(const std::string& path) {
  LoadedWeights w;
  w.path = path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return not_found("model path '" + path + "' does not exist");
  if (fs::is_directory(st)) {
    w.format = LoadedWeights::Format::kHfFolder;
    OSP_RETURN_IF_ERROR(load_hf_folder(fs::path(path), w));
    return w;
  }
  if (!fs::is_regular_file(st)) return invalid_argument("model path '" + path + "' is not a file or folder");
  // A file: GGUF is recognised by its magic, whatever the extension.
  char magic[4] = {};
  {
    std::ifstream in(path, std::ios::binary);
    in.read(magic, 4);
  }
  if (std::memcmp(magic, "GGUF", 4) == 0) {
    w.format = LoadedWeights::Format::kGguf;
    OSP_RETURN_IF_ERROR(load_gguf(path, w));
    return w;
  }
  return invalid_argument("model path '" + path +
                          "' is neither a GGUF file nor a folder with config.json and safetensors");
}

}  // namespace osprey
