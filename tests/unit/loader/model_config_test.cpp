#include "model/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "loader/gguf_file.h"
#include "test_builders.h"

namespace osprey {
namespace {

using namespace osprey::testing;  // NOLINT
using RopeType = ops::RopeScalingParams::Type;

// SmolLM2-135M-Instruct's config.json (Hugging Face), abridged.
const char* kSmolConfig = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2,
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 576, "intermediate_size": 1536,
  "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
  "num_hidden_layers": 30, "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 100000, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 49152})";

Expected<ModelConfig> from_json(const nlohmann::json& j) { return model_config_from_hf_json(j.dump(), "test/config.json"); }

TEST(ModelConfigHf, SmolLm2) {
  auto r = model_config_from_hf_json(kSmolConfig, "smol/config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.rope_scaling.type, RopeType::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfigHf, DefaultsAndArchitectures) {
  nlohmann::json base = {{"model_type", "llama"}, {"vocab_size", 1000}, {"hidden_size", 256},
                         {"intermediate_size", 512}, {"num_hidden_layers", 2}, {"num_attention_heads", 8}};
  auto llama = from_json(base);
  ASSERT_TRUE(llama.ok()) << llama.status().to_string();
  EXPECT_EQ(llama->num_kv_heads, 8);
  EXPECT_EQ(llama->head_dim, 32);
  EXPECT_FLOAT_EQ(llama->rope_theta, 10000.0f);
  EXPECT_FALSE(llama->tie_word_embeddings);
  EXPECT_EQ(llama->bos_token_id, -1);
  EXPECT_TRUE(llama->eos_token_ids.empty());

  nlohmann::json j = base;
  j["attention_bias"] = true;
  EXPECT_TRUE(from_json(j)->attention_bias);

  j = base;
  j["model_type"] = "qwen2";
  j["attention_bias"] = false;  // ignored: Qwen2 always has q/k/v biases
  j["use_sliding_window"] = false;
  j["sliding_window"] = 4096;
  auto qwen2 = from_json(j);
  ASSERT_TRUE(qwen2.ok()) << qwen2.status().to_string();
  EXPECT_TRUE(qwen2->attention_bias);
  EXPECT_FALSE(qwen2->qk_norm);
  EXPECT_EQ(qwen2->sliding_window, 0);

  j = base;
  j["model_type"] = "qwen3";
  auto qwen3 = from_json(j);
  ASSERT_TRUE(qwen3.ok()) << qwen3.status().to_string();
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_FALSE(qwen3->attention_bias);
  EXPECT_EQ(qwen3->head_dim, 128);  // Qwen3Config's default, not hidden / heads

  j = base;
  j["model_type"] = "mistral";
  j["sliding_window"] = 4096;
  j["num_key_value_heads"] = 2;
  auto mistral = from_json(j);
  ASSERT_TRUE(mistral.ok()) << mistral.status().to_string();
  EXPECT_EQ(mistral->sliding_window, 4096);
  EXPECT_EQ(mistral->num_kv_heads, 2);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(from_json(j)->sliding_window, 0);

  j = base;
  j["model_type"] = "gpt2";
  auto gpt2 = from_json(j);
  ASSERT_FALSE(gpt2.ok());
  EXPECT_EQ(gpt2.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(gpt2.status().message().find("gpt2"), std::string::npos);
}

TEST(ModelConfigHf, QwenSlidingWindowLayers) {
  nlohmann::json j = {{"model_type", "qwen2"}, {"vocab_size", 1000}, {"hidden_size", 256},
                      {"intermediate_size", 512}, {"num_hidden_layers", 4}, {"num_attention_heads", 8},
                      {"use_sliding_window", true}, {"sliding_window", 128}, {"max_window_layers", 0}};
  auto all = from_json(j);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(all->sliding_window, 128);
  j["max_window_layers"] = 2;
  auto mixed = from_json(j);
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), StatusCode::kUnsupported);
  j["max_window_layers"] = 28;  // > num layers: no sliding layers
  EXPECT_EQ(from_json(j)->sliding_window, 0);
}

TEST(ModelConfigHf, RopeScaling) {
  nlohmann::json j = nlohmann::json::parse(kSmolConfig);
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  j["rope_theta"] = 500000.0;
  auto l3 = from_json(j);
  ASSERT_TRUE(l3.ok()) << l3.status().to_string();
  EXPECT_EQ(l3->rope_scaling.type, RopeType::kLlama3);
  EXPECT_FLOAT_EQ(l3->rope_scaling.factor, 32.0f);
  EXPECT_FLOAT_EQ(l3->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(l3->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FLOAT_EQ(l3->rope_theta, 500000.0f);

  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  auto lin = from_json(j);
  ASSERT_TRUE(lin.ok());
  EXPECT_EQ(lin->rope_scaling.type, RopeType::kLinear);
  EXPECT_FLOAT_EQ(lin->rope_scaling.factor, 2.0f);

  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  auto dyn = from_json(j);
  ASSERT_TRUE(dyn.ok());
  EXPECT_EQ(dyn->rope_scaling.type, RopeType::kDynamic);
  EXPECT_EQ(dyn->rope_scaling.original_max_position_embeddings, 8192);

  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  auto yarn = from_json(j);
  ASSERT_FALSE(yarn.ok());
  EXPECT_NE(yarn.status().message().find("yarn"), std::string::npos);

  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  auto incomplete = from_json(j);
  ASSERT_FALSE(incomplete.ok());
  EXPECT_NE(incomplete.status().message().find("low_freq_factor"), std::string::npos);

  // transformers 5: rope_parameters carries rope_theta.
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  auto v5 = from_json(j);
  ASSERT_TRUE(v5.ok()) << v5.status().to_string();
  EXPECT_FLOAT_EQ(v5->rope_theta, 1000000.0f);
  EXPECT_EQ(v5->rope_scaling.type, RopeType::kNone);
  j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 10000.0}, {"factor", 4.0}};
  EXPECT_EQ(from_json(j)->rope_scaling.type, RopeType::kLinear);
}

TEST(ModelConfigHf, EosForms) {
  nlohmann::json j = nlohmann::json::parse(kSmolConfig);
  j["eos_token_id"] = {2, 0, 5};
  EXPECT_EQ(from_json(j)->eos_token_ids, (std::vector<int>{2, 0, 5}));
  j["eos_token_id"] = nullptr;
  EXPECT_TRUE(from_json(j)->eos_token_ids.empty());
  j["eos_token_id"] = "2";
  EXPECT_FALSE(from_json(j).ok());
  j["eos_token_id"] = 49152;  // outside the vocabulary
  auto out = from_json(j);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("eos_token_id"), std::string::npos);
}

TEST(ModelConfigHf, ErrorsNameTheField) {
  const nlohmann::json good = nlohmann::json::parse(kSmolConfig);
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* needle;
  };
  const Case cases[] = {
      {"num_key_value_heads", 4, "num_kv_heads"},        // 9 % 4 != 0
      {"num_key_value_heads", 0, "num_kv_heads"},
      {"head_dim", 63, "head_dim"},                       // odd
      {"hidden_size", -1, "hidden_size"},
      {"hidden_size", "576", "hidden_size"},
      {"hidden_size", 5.5, "hidden_size"},
      {"hidden_size", 1e12, "hidden_size"},
      {"vocab_size", 0, "vocab_size"},
      {"num_hidden_layers", 100000, "num_layers"},
      {"rms_norm_eps", 0, "rms_norm_eps"},
      {"rms_norm_eps", "x", "rms_norm_eps"},
      {"rope_theta", -1, "rope_theta"},
      {"tie_word_embeddings", 1, "tie_word_embeddings"},
      {"max_position_embeddings", 0, "max_position_embeddings"},
      {"bos_token_id", 100000, "bos_token_id"},
      {"rope_scaling", "big", "rope_scaling"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    j[c.field] = c.value;
    auto r = from_json(j);
    ASSERT_FALSE(r.ok()) << c.field << " = " << c.value.dump();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
  nlohmann::json j = good;
  j.erase("num_attention_heads");
  auto missing = from_json(j);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("num_attention_heads"), std::string::npos);
  EXPECT_FALSE(model_config_from_hf_json("{", "x").ok());
  EXPECT_FALSE(model_config_from_hf_json("[]", "x").ok());
  EXPECT_FALSE(model_config_from_hf_json("", "x").ok());
}

// ---- GGUF ------------------------------------------------------------------

GgufBuilder tiny_llama_gguf() {
  GgufBuilder g;
  g.kv_string("general.architecture", "llama");
  g.kv<uint32_t>("llama.block_count", kGU32, 2);
  g.kv<uint32_t>("llama.embedding_length", kGU32, 64);
  g.kv<uint32_t>("llama.feed_forward_length", kGU32, 128);
  g.kv<uint32_t>("llama.attention.head_count", kGU32, 4);
  g.kv<uint32_t>("llama.attention.head_count_kv", kGU32, 2);
  g.kv<uint32_t>("llama.context_length", kGU32, 4096);
  g.kv<float>("llama.rope.freq_base", kGF32, 500000.0f);
  g.kv<float>("llama.attention.layer_norm_rms_epsilon", kGF32, 1e-5f);
  g.kv_string_array("tokenizer.ggml.tokens", std::vector<std::string>(100, "t"));
  g.kv<uint32_t>("tokenizer.ggml.bos_token_id", kGU32, 1);
  g.kv<uint32_t>("tokenizer.ggml.eos_token_id", kGU32, 2);
  g.kv<uint32_t>("tokenizer.ggml.eot_token_id", kGU32, 7);
  g.tensor("token_embd.weight", {64, 100}, kTF32, std::vector<uint8_t>(64 * 100 * 4, 0));
  return g;
}

Expected<ModelConfig> config_of(const GgufBuilder& g, std::vector<uint8_t>& storage) {
  storage = g.build();
  auto f = GgufFile::parse(storage.data(), storage.size(), "tiny.gguf");
  if (!f.ok()) return f.status();
  return model_config_from_gguf(**f);
}

TEST(ModelConfigGguf, TinyLlama) {
  std::vector<uint8_t> buf;
  auto c = config_of(tiny_llama_gguf(), buf);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 128);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->vocab_size, 100);  // from the token list
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{2, 7}));
  EXPECT_EQ(c->rope_scaling.type, RopeType::kNone);
}

TEST(ModelConfigGguf, QwenArchitectures) {
  for (const std::string arch : {"qwen2", "qwen3"}) {
    GgufBuilder g;
    g.kv_string("general.architecture", arch);
    g.kv<uint32_t>(arch + ".block_count", kGU32, 1);
    g.kv<uint32_t>(arch + ".embedding_length", kGU32, 64);
    g.kv<uint32_t>(arch + ".feed_forward_length", kGU32, 128);
    g.kv<uint32_t>(arch + ".attention.head_count", kGU32, 4);
    g.kv<uint32_t>(arch + ".attention.key_length", kGU32, 32);
    g.kv<uint32_t>(arch + ".vocab_size", kGU32, 50);
    g.tensor("output.weight", {64, 50}, kTF32, std::vector<uint8_t>(64 * 50 * 4, 0));
    std::vector<uint8_t> buf;
    auto c = config_of(g, buf);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->head_dim, 32);
    EXPECT_EQ(c->num_kv_heads, 4);
    EXPECT_EQ(c->vocab_size, 50);
    EXPECT_FALSE(c->tie_word_embeddings);
    EXPECT_EQ(c->attention_bias, arch == "qwen2");
    EXPECT_EQ(c->qk_norm, arch == "qwen3");
  }
}

TEST(ModelConfigGguf, Errors) {
  std::vector<uint8_t> buf;
  GgufBuilder none;
  EXPECT_FALSE(config_of(none, buf).ok());
  GgufBuilder other;
  other.kv_string("general.architecture", "phi3");
  auto phi = config_of(other, buf);
  ASSERT_FALSE(phi.ok());
  EXPECT_NE(phi.status().message().find("phi3"), std::string::npos);

  GgufBuilder g = tiny_llama_gguf();
  g.kv<uint32_t>("llama.rope.dimension_count", kGU32, 16);
  g.kv_string("llama.rope.scaling.type", "yarn");
  auto yarn = config_of(g, buf);
  ASSERT_FALSE(yarn.ok());
  EXPECT_NE(yarn.status().message().find("yarn"), std::string::npos);

  GgufBuilder bad = tiny_llama_gguf();
  bad.kv<uint32_t>("llama.attention.key_length", kGU32, 15);
  auto odd = config_of(bad, buf);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("head_dim"), std::string::npos);

  GgufBuilder s;
  s.kv_string("general.architecture", "llama");
  s.kv_string("llama.block_count", "two");
  auto str = config_of(s, buf);
  ASSERT_FALSE(str.ok());
  EXPECT_NE(str.status().message().find("llama.block_count"), std::string::npos);
}

// llama.cpp's converter writes rope_freqs.weight for Llama 3.1-style scaling;
// these factors follow its generator (factor 8, low 1, high 4, original 8192).
std::vector<float> llama3_factors(double theta, int head_dim, double factor) {
  std::vector<float> f;
  const double old_len = 8192, low_wl = old_len / 1.0, high_wl = old_len / 4.0;
  for (int i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(theta, static_cast<double>(i) / head_dim);
    const double wl = 2 * M_PI / freq;
    if (wl < high_wl) {
      f.push_back(1.0f);
    } else if (wl > low_wl) {
      f.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (old_len / wl - 1.0) / (4.0 - 1.0);
      f.push_back(static_cast<float>(1 / ((1 - smooth) / factor + smooth)));
    }
  }
  return f;
}

TEST(ModelConfigGguf, Llama3RopeFactors) {
  GgufBuilder g = tiny_llama_gguf();  // head_dim 16, theta 5e5
  g.tensor("rope_freqs.weight", {8}, kTF32, to_bytes(llama3_factors(500000.0, 16, 8.0)));
  std::vector<uint8_t> buf;
  auto c = config_of(g, buf);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->rope_scaling.type, RopeType::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);

  GgufBuilder odd = tiny_llama_gguf();
  auto f = llama3_factors(500000.0, 16, 8.0);
  f[0] = 3.0f;
  odd.tensor("rope_freqs.weight", {8}, kTF32, to_bytes(f));
  auto bad = config_of(odd, buf);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rope_freqs"), std::string::npos);

  GgufBuilder wrong = tiny_llama_gguf();
  wrong.tensor("rope_freqs.weight", {4}, kTF32, to_bytes(std::vector<float>{1, 1, 1, 1}));
  EXPECT_FALSE(config_of(wrong, buf).ok());
}

// Parity with transformers' reading of the same GGUF (make_reference.py).
TEST(ModelConfigGguf, DefaultModelMatchesTransformers) {
  const char* home = std::getenv("HOME");
  const std::string path = std::string(home != nullptr ? home : "") + "/.cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << "default model not installed at " << path << " (run scripts/fetch_model.sh)";
  std::ifstream in(std::string(OSPREY_SOURCE_DIR) + "/tests/data/loader/smollm2_reference.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json ref = nlohmann::json::parse(in)["config"];
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto c = model_config_from_gguf(**f);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, ref["model_type"].get<std::string>());
  EXPECT_EQ(c->vocab_size, ref["vocab_size"].get<int>());
  EXPECT_EQ(c->hidden_size, ref["hidden_size"].get<int>());
  EXPECT_EQ(c->intermediate_size, ref["intermediate_size"].get<int>());
  EXPECT_EQ(c->num_layers, ref["num_hidden_layers"].get<int>());
  EXPECT_EQ(c->num_heads, ref["num_attention_heads"].get<int>());
  EXPECT_EQ(c->num_kv_heads, ref["num_key_value_heads"].get<int>());
  EXPECT_EQ(c->head_dim, ref["head_dim"].get<int>());
  EXPECT_EQ(c->max_position_embeddings, ref["max_position_embeddings"].get<int>());
  EXPECT_FLOAT_EQ(c->rms_norm_eps, ref["rms_norm_eps"].get<float>());
  EXPECT_FLOAT_EQ(c->rope_theta, ref["rope_theta"].get<float>());
  EXPECT_EQ(ref["rope_type"].get<std::string>(), "default");
  EXPECT_EQ(c->rope_scaling.type, RopeType::kNone);
  EXPECT_EQ(c->tie_word_embeddings, ref["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(c->attention_bias, ref["attention_bias"].get<bool>());
  EXPECT_EQ(c->bos_token_id, ref["bos_token_id"].get<int>());
  EXPECT_EQ(c->eos_token_ids, ref["eos_token_ids"].get<std::vector<int>>());
  EXPECT_FALSE(c->qk_norm);
  // num_parameters counts what transformers' model holds (lm_head tied: once).
  int64_t total = 0;
  const nlohmann::json full = nlohmann::json::parse(
      std::ifstream(std::string(OSPREY_SOURCE_DIR) + "/tests/data/loader/smollm2_reference.json"));
  for (const auto& [name, shape] : full["shapes"].items()) {
    if (name == "lm_head.weight") continue;
    int64_t n = 1;
    for (const auto& d : shape) n *= d.get<int64_t>();
    total += n;
  }
  EXPECT_EQ(c->num_parameters(), total);
}

}  // namespace
}  // namespace osprey
