#include "loader/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "test_builders.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using namespace osprey::testing;  // NOLINT

std::string default_model_path() {
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "") + "/.cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// A fresh empty folder under the test temp dir.
fs::path make_dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("osprey_loader_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
void write_file(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

std::vector<float> tensor_floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.dtype(), t.row(r), v.data() + r * t.cols(), t.cols());
  return v;
}

// The converter's permutation written independently of the loader, from its
// numpy form: w.reshape(n_head, 2, hd/2, in).swapaxes(1, 2).reshape(out, in).
std::vector<float> convert_permute(const std::vector<float>& w, int n_head, int rows, int cols) {
  const int hd = rows / n_head;
  std::vector<float> out(w.size());
  int dst = 0;
  for (int h = 0; h < n_head; ++h) {          // new axes: (h, i, j)
    for (int i = 0; i < hd / 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        const int src_row = h * hd + j * (hd / 2) + i;  // old axes: (h, j, i)
        for (int c = 0; c < cols; ++c) out[static_cast<size_t>(dst * cols + c)] = w[static_cast<size_t>(src_row * cols + c)];
        ++dst;
      }
    }
  }
  return out;
}

TEST(PermuteQk, SmallExampleByHand) {
  // One head of dim 4: HF rows [a b c d] are stored by llama.cpp as [a c b d].
  const uint8_t gguf[4] = {'a', 'c', 'b', 'd'};
  uint8_t hf[4] = {};
  permute_qk_rows(gguf, hf, 4, 1, 1);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(hf), 4), "abcd");
  uint8_t back[4] = {};
  permute_qk_rows(hf, back, 4, 1, 1, /*hf_to_gguf=*/true);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(back), 4), "acbd");
}

TEST(PermuteQk, RoundTripMatchesConverterFormula) {
  const int n_head = 3, hd = 8, rows = n_head * hd, cols = 5;
  std::vector<float> hf(static_cast<size_t>(rows * cols));
  std::iota(hf.begin(), hf.end(), 0.0f);
  const std::vector<float> gguf = convert_permute(hf, n_head, rows, cols);
  std::vector<float> mine(hf.size());
  permute_qk_rows(reinterpret_cast<const uint8_t*>(hf.data()), reinterpret_cast<uint8_t*>(mine.data()), rows,
                  cols * 4, n_head, /*hf_to_gguf=*/true);
  EXPECT_EQ(mine, gguf);
  std::vector<float> undone(hf.size());
  permute_qk_rows(reinterpret_cast<const uint8_t*>(gguf.data()), reinterpret_cast<uint8_t*>(undone.data()), rows,
                  cols * 4, n_head);
  EXPECT_EQ(undone, hf);
}

TEST(GgufNames, MapsToHuggingFace) {
  EXPECT_EQ(gguf_to_hf_name("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(gguf_to_hf_name("output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(gguf_to_hf_name("output.weight"), "lm_head.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.0.attn_norm.weight"), "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.12.attn_q.weight"), "model.layers.12.self_attn.q_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.12.attn_q.bias"), "model.layers.12.self_attn.q_proj.bias");
  EXPECT_EQ(gguf_to_hf_name("blk.3.attn_k.weight"), "model.layers.3.self_attn.k_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.attn_v.bias"), "model.layers.3.self_attn.v_proj.bias");
  EXPECT_EQ(gguf_to_hf_name("blk.3.attn_output.weight"), "model.layers.3.self_attn.o_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.attn_q_norm.weight"), "model.layers.3.self_attn.q_norm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.attn_k_norm.weight"), "model.layers.3.self_attn.k_norm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_norm.weight"), "model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_gate.weight"), "model.layers.3.mlp.gate_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_up.weight"), "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_down.weight"), "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("rope_freqs.weight"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_name("blk.x.attn_q.weight"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_name("blk.01.attn_q.weight"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_name("blk..attn_q.weight"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_name("blk.1.attn_q"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_name("blk.1.ffn_gate_exps.weight"), std::nullopt);
}

// A tiny GGUF of arch `arch`: 2 heads of dim 4, 1 kv head, hidden 8.
// attn_q holds `q_gguf` (F32 [8, 32]); attn_k is Q8_0 [4, 32] with distinct rows.
std::vector<uint8_t> tiny_gguf(const std::string& arch, const std::vector<float>& q_gguf,
                               const std::vector<uint8_t>& k_gguf, bool with_output) {
  GgufBuilder g;
  g.kv_string("general.architecture", arch);
  g.kv<uint32_t>(arch + ".attention.head_count", kGU32, 2);
  g.kv<uint32_t>(arch + ".attention.head_count_kv", kGU32, 1);
  g.tensor("token_embd.weight", {32, 3}, kTF32, std::vector<uint8_t>(3 * 32 * 4, 0));
  g.tensor("blk.0.attn_q.weight", {32, 8}, kTF32, to_bytes(q_gguf));
  g.tensor("blk.0.attn_k.weight", {32, 4}, kTQ8_0, k_gguf);
  g.tensor("blk.0.attn_q.bias", {8}, kTF32, to_bytes(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  g.tensor("blk.0.attn_v.weight", {32, 4}, kTF32, std::vector<uint8_t>(4 * 32 * 4, 7));
  g.tensor("rope_freqs.weight", {2}, kTF32, to_bytes(std::vector<float>{1, 1}));
  if (with_output) g.tensor("output.weight", {32, 3}, kTF32, std::vector<uint8_t>(3 * 32 * 4, 0));
  return g.build();
}

std::vector<uint8_t> q8_rows(int rows) {
  std::vector<uint8_t> b(static_cast<size_t>(rows) * 34);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < 34; ++k) b[static_cast<size_t>(r * 34 + k)] = static_cast<uint8_t>(r * 40 + k);
  }
  return b;
}

TEST(LoadWeights, GgufLlamaUndoesPermutation) {
  std::vector<float> q_hf(8 * 32);
  std::iota(q_hf.begin(), q_hf.end(), 0.0f);
  const auto q_gguf = convert_permute(q_hf, 2, 8, 32);
  const auto k_hf = q8_rows(4);
  std::vector<uint8_t> k_gguf(k_hf.size());
  // One kv head of dim 4: HF rows [0 1 2 3] are stored as [0 2 1 3].
  for (int r = 0; r < 4; ++r) {
    const int src = (r == 1) ? 2 : (r == 2) ? 1 : r;
    std::memcpy(&k_gguf[static_cast<size_t>(r) * 34], &k_hf[static_cast<size_t>(src) * 34], 34);
  }
  const fs::path dir = make_dir("gguf_llama");
  const fs::path path = dir / "tiny.gguf";
  write_file(path, tiny_gguf("llama", q_gguf, k_gguf, false));

  auto r = load_weights(path.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const LoadedWeights& w = *r;
  EXPECT_EQ(w.format, LoadedWeights::Format::kGguf);
  ASSERT_NE(w.gguf, nullptr);
  EXPECT_EQ(w.tensors.size(), 6u);
  EXPECT_EQ(w.tensors.count("lm_head.weight"), 0u);  // tied
  EXPECT_EQ(w.tensors.count("rope_freqs.weight"), 1u);  // unmapped names are kept
  const Tensor& q = w.tensors.at("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.dtype(), DType::kF32);
  EXPECT_EQ(q.ndim(), 2);
  EXPECT_EQ(q.dim(0), 8);
  EXPECT_EQ(q.dim(1), 32);
  EXPECT_EQ(tensor_floats(q), q_hf);
  const Tensor& k = w.tensors.at("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k.dtype(), DType::kQ8_0);
  EXPECT_EQ(std::vector<uint8_t>(k.data_as<uint8_t>(), k.data_as<uint8_t>() + k.nbytes()), k_hf);
  // The bias is permuted like its weight (2 heads of 4): [0 2 1 3 4 6 5 7] -> sorted.
  const Tensor& qb = w.tensors.at("model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(tensor_floats(qb), (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
  // Unpermuted tensors point into the file's mapping.
  const Tensor& v = w.tensors.at("model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(static_cast<const uint8_t*>(v.data()), w.gguf->find_tensor("blk.0.attn_v.weight")->data);
  EXPECT_NE(static_cast<const uint8_t*>(q.data()), w.gguf->find_tensor("blk.0.attn_q.weight")->data);
}

TEST(LoadWeights, GgufQwen2IsNotPermuted) {
  std::vector<float> q(8 * 32);
  std::iota(q.begin(), q.end(), 0.0f);
  const fs::path path = make_dir("gguf_qwen2") / "tiny.gguf";
  write_file(path, tiny_gguf("qwen2", q, q8_rows(4), true));
  auto r = load_weights(path.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(tensor_floats(r->tensors.at("model.layers.0.self_attn.q_proj.weight")), q);
  EXPECT_EQ(r->tensors.count("lm_head.weight"), 1u);
  EXPECT_EQ(r->tensors.at("lm_head.weight").dim(0), 3);
}

TEST(LoadWeights, GgufBadHeadCountIsAnError) {
  GgufBuilder g;
  g.kv_string("general.architecture", "llama");
  g.kv<uint32_t>("llama.attention.head_count", kGU32, 3);  // 8 rows do not split into 3 heads
  g.tensor("blk.0.attn_q.weight", {32, 8}, kTF32, std::vector<uint8_t>(8 * 32 * 4, 0));
  const fs::path path = make_dir("gguf_badheads") / "tiny.gguf";
  write_file(path, g.build());
  auto r = load_weights(path.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("blk.0.attn_q.weight"), std::string::npos) << r.status().message();
}

std::string st_header(const std::vector<std::pair<std::string, std::pair<std::vector<int>, int>>>& specs) {
  // specs: name -> (shape, byte offset); F32
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, spec] : specs) {
    int64_t n = 1;
    for (int d : spec.first) n *= d;
    j[name] = {{"dtype", "F32"}, {"shape", spec.first}, {"data_offsets", {spec.second, spec.second + n * 4}}};
  }
  return j.dump();
}

TEST(LoadWeights, HfFolderSingleFile) {
  const fs::path dir = make_dir("hf_single");
  write_file(dir / "config.json", std::string(R"({"model_type":"llama"})"));
  std::vector<float> data = {1, 2, 3, 4, 5, 6, 7, 8};
  // A header of odd length makes F32 data misaligned in the mapping: the
  // loader must copy it to an aligned buffer.
  std::string header = st_header({{"model.norm.weight", {{2}, 0}}, {"lm_head.weight", {{2, 3}, 8}}});
  if ((8 + header.size()) % 4 == 0) header += " ";
  write_file(dir / "model.safetensors", make_safetensors(header, to_bytes(data)));
  auto r = load_weights(dir.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->format, LoadedWeights::Format::kHfFolder);
  EXPECT_EQ(r->config_json, R"({"model_type":"llama"})");
  EXPECT_EQ(r->gguf, nullptr);
  ASSERT_EQ(r->tensors.size(), 2u);
  const Tensor& lm = r->tensors.at("lm_head.weight");
  EXPECT_EQ(lm.dim(0), 2);
  EXPECT_EQ(lm.dim(1), 3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(lm.data()) % 4, 0u);
  EXPECT_EQ(tensor_floats(lm), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(tensor_floats(r->tensors.at("model.norm.weight")), (std::vector<float>{1, 2}));
}

TEST(LoadWeights, HfFolderShards) {
  const fs::path dir = make_dir("hf_shards");
  write_file(dir / "config.json", std::string("{}"));
  write_file(dir / "a.safetensors",
             make_safetensors(st_header({{"x", {{2}, 0}}}), to_bytes(std::vector<float>{1, 2})));
  write_file(dir / "b.safetensors",
             make_safetensors(st_header({{"y", {{1}, 0}}}), to_bytes(std::vector<float>{3})));
  write_file(dir / "model.safetensors.index.json",
             std::string(R"({"metadata":{},"weight_map":{"x":"a.safetensors","y":"b.safetensors"}})"));
  auto r = load_weights(dir.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(tensor_floats(r->tensors.at("y")), (std::vector<float>{3}));

  write_file(dir / "model.safetensors.index.json",
             std::string(R"({"weight_map":{"x":"a.safetensors","z":"b.safetensors"}})"));
  auto missing = load_weights(dir.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'z'"), std::string::npos) << missing.status().message();

  write_file(dir / "model.safetensors.index.json", std::string(R"({"weight_map":{"x":"../a.safetensors"}})"));
  auto escape = load_weights(dir.string());
  ASSERT_FALSE(escape.ok());
  EXPECT_NE(escape.status().message().find("not a file name"), std::string::npos) << escape.status().message();

  write_file(dir / "c.safetensors",
             make_safetensors(st_header({{"x", {{2}, 0}}}), to_bytes(std::vector<float>{1, 2})));
  write_file(dir / "model.safetensors.index.json",
             std::string(R"({"weight_map":{"x":"a.safetensors","y":"c.safetensors"}})"));
  auto dup = load_weights(dir.string());
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("more than one shard"), std::string::npos) << dup.status().message();

  write_file(dir / "model.safetensors.index.json", std::string(R"({"weight_map":{"x":"gone.safetensors"}})"));
  EXPECT_FALSE(load_weights(dir.string()).ok());
  write_file(dir / "model.safetensors.index.json", std::string("{not json"));
  EXPECT_FALSE(load_weights(dir.string()).ok());
}

TEST(LoadWeights, MissingPieces) {
  auto none = load_weights("/nonexistent/osprey/model");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  const fs::path dir = make_dir("hf_empty");
  auto no_config = load_weights(dir.string());
  ASSERT_FALSE(no_config.ok());
  EXPECT_NE(no_config.status().message().find("config.json"), std::string::npos);
  write_file(dir / "config.json", std::string("{}"));
  auto no_weights = load_weights(dir.string());
  ASSERT_FALSE(no_weights.ok());
  EXPECT_NE(no_weights.status().message().find("model.safetensors"), std::string::npos);
  write_file(dir / "random.bin", std::string("hello"));
  EXPECT_FALSE(load_weights((dir / "random.bin").string()).ok());
}

// Parity with transformers: tests/data/loader/smollm2_reference.json comes
// from tests/unit/loader/make_reference.py.
TEST(LoadWeights, DefaultModelMatchesTransformers) {
  const std::string path = default_model_path();
  ASSERT_TRUE(fs::exists(path)) << "default model not installed at " << path << " (run scripts/fetch_model.sh)";
  std::ifstream in(std::string(OSPREY_SOURCE_DIR) + "/tests/data/loader/smollm2_reference.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json ref = nlohmann::json::parse(in);

  auto r = load_weights(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const LoadedWeights& w = *r;

  // Same names and shapes; lm_head is absent because transformers ties it.
  ASSERT_TRUE(ref["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(w.tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(w.tensors.size() + 1, ref["shapes"].size());
  for (const auto& [name, shape] : ref["shapes"].items()) {
    if (name == "lm_head.weight") continue;
    auto it = w.tensors.find(name);
    ASSERT_NE(it, w.tensors.end()) << name;
    std::vector<int64_t> got(it->second.shape(), it->second.shape() + it->second.ndim());
    EXPECT_EQ(got, shape.get<std::vector<int64_t>>()) << name;
  }

  // Dequantised rows (Q/K un-permuted) match.
  int checked = 0;
  for (const auto& [name, rows] : ref["rows"].items()) {
    const Tensor& t = w.tensors.at(name);
    std::vector<float> row(static_cast<size_t>(t.cols()));
    for (const auto& [idx, values] : rows.items()) {
      const int64_t rr = std::stoll(idx);
      dequantize_row(t.dtype(), t.row(rr), row.data(), t.cols());
      const auto want = values.get<std::vector<double>>();
      ASSERT_EQ(want.size(), row.size());
      for (size_t c = 0; c < row.size(); ++c) {
        ASSERT_NEAR(row[c], want[c], 1e-6 + 1e-6 * std::fabs(want[c])) << name << " row " << rr << " col " << c;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 30);
  for (const auto& [name, values] : ref["vectors"].items()) {
    EXPECT_EQ(tensor_floats(w.tensors.at(name)), values.get<std::vector<float>>()) << name;
  }
}

}  // namespace
}  // namespace osprey
