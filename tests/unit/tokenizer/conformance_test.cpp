// Conformance against Hugging Face transformers: ids and decodes recorded by
// tests/tokenizer/make_expected.py for the corpus in tests/tokenizer/corpus.py.
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using nlohmann::json;

const std::string kSource = OSPREY_SOURCE_DIR;

json load_expected(const std::string& name) {
  std::ifstream f(kSource + "/tests/tokenizer/expected/" + name + ".json");
  EXPECT_TRUE(f.good()) << "missing expected file for " << name;
  json j;
  if (f.good()) f >> j;
  return j;
}

std::string default_gguf_path() {
  if (const char* p = std::getenv("OSPREY_DEFAULT_GGUF")) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Minimal GGUF metadata reader for the tokenizer keys (test-only; keeps this
// binary free of the loader library). Reads the header and key/values only.
class GgufMeta {
 public:
  bool open(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    char magic[4];
    uint32_t version = 0;
    uint64_t num_tensors = 0, num_kv = 0;
    f.read(magic, 4);
    if (!f || std::string(magic, 4) != "GGUF") return false;
    f.read(reinterpret_cast<char*>(&version), 4);
    f.read(reinterpret_cast<char*>(&num_tensors), 8);
    f.read(reinterpret_cast<char*>(&num_kv), 8);
    for (uint64_t k = 0; k < num_kv && f; ++k) {
      std::string key = str(f);
      uint32_t type = u32(f);
      values_[key] = value(f, type);
    }
    return static_cast<bool>(f);
  }
  const json* find(const std::string& k) const {
    auto it = values_.find(k);
    return it == values_.end() ? nullptr : &it->second;
  }

 private:
  static uint32_t u32(std::istream& f) { uint32_t v = 0; f.read(reinterpret_cast<char*>(&v), 4); return v; }
  static uint64_t u64(std::istream& f) { uint64_t v = 0; f.read(reinterpret_cast<char*>(&v), 8); return v; }
  static std::string str(std::istream& f) {
    uint64_t n = u64(f);
    if (!f || n > (1u << 24)) { f.setstate(std::ios::failbit); return {}; }
    std::string s(n, '\0');
    f.read(s.data(), static_cast<std::streamsize>(n));
    return s;
  }
  static json value(std::istream& f, uint32_t type) {
    auto raw = [&](auto v) { f.read(reinterpret_cast<char*>(&v), sizeof(v)); return v; };
    switch (type) {
      case 0: return raw(uint8_t{});
      case 1: return raw(int8_t{});
      case 2: return raw(uint16_t{});
      case 3: return raw(int16_t{});
      case 4: return raw(uint32_t{});
      case 5: return raw(int32_t{});
      case 6: return raw(float{});
      case 7: return raw(uint8_t{}) != 0;
      case 8: return str(f);
      case 9: {
        uint32_t et = u32(f);
        uint64_t n = u64(f);
        json arr = json::array();
        for (uint64_t i = 0; i < n && f; ++i) arr.push_back(value(f, et));
        return arr;
      }
      case 10: return raw(uint64_t{});
      case 11: return raw(int64_t{});
      case 12: return raw(double{});
      default: f.setstate(std::ios::failbit); return nullptr;
    }
  }
  std::map<std::string, json> values_;
};

// GGUF tokenizer.ggml.* metadata -> GgufVocab, as the engine fills it.
Expected<GgufVocab> read_gguf_vocab(const std::string& path) {
  GgufMeta g;
  if (!g.open(path)) return not_found("cannot read GGUF metadata from " + path);
  GgufVocab v;
  auto get = [&](const char* k) { return g.find(std::string("tokenizer.") + k); };
  if (auto* x = get("ggml.model")) v.model = x->get<std::string>();
  if (auto* x = get("ggml.pre")) v.pre = x->get<std::string>();
  if (auto* x = get("ggml.tokens")) v.tokens = x->get<std::vector<std::string>>();
  if (auto* x = get("ggml.merges")) v.merges = x->get<std::vector<std::string>>();
  if (auto* x = get("ggml.token_type")) v.token_types = x->get<std::vector<int32_t>>();
  if (auto* x = get("ggml.scores")) v.scores = x->get<std::vector<float>>();
  auto id = [&](const char* k) { auto* x = get(k); return x ? x->get<int32_t>() : -1; };
  v.bos_id = id("ggml.bos_token_id");
  v.eos_id = id("ggml.eos_token_id");
  v.unk_id = id("ggml.unknown_token_id");
  v.pad_id = id("ggml.padding_token_id");
  auto flag = [&](const char* k) -> std::optional<bool> {
    if (auto* x = get(k)) return x->get<bool>();
    return std::nullopt;
  };
  v.add_bos = flag("ggml.add_bos_token");
  v.add_eos = flag("ggml.add_eos_token");
  v.add_space_prefix = flag("ggml.add_space_prefix");
  if (auto* x = get("chat_template")) v.chat_template = x->get<std::string>();
  return v;
}

// The SentencePiece GGUF vocabulary make_expected.py derives from the Mistral
// tokenizer.json (sp_vocab_from_mistral): tokens by id, score -id, no merges.
Expected<GgufVocab> mistral_vocab() {
  std::ifstream f(kSource + "/../shared/tokenizers/mistral/tokenizer.json");
  if (!f.good()) return not_found("mistral tokenizer.json");
  json j;
  f >> j;
  const json& vocab = j["model"]["vocab"];
  GgufVocab v;
  v.model = "llama";
  v.tokens.resize(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) v.tokens.at(it.value().get<size_t>()) = it.key();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string& t = v.tokens[i];
    v.scores.push_back(-static_cast<float>(i));
    int32_t type = 1;
    if (t == "<unk>") type = 2;
    else if (t == "<s>" || t == "</s>") type = 3;
    else if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>') type = 6;
    v.token_types.push_back(type);
  }
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  v.add_bos = true;
  return v;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name) {
  if (name == "mistral_sp_gguf") {
    auto v = mistral_vocab();
    EXPECT_TRUE(v.ok()) << v.status().to_string();
    if (!v.ok()) return nullptr;
    auto t = Tokenizer::from_gguf_vocab(*v);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  if (name == "smollm2_gguf") {
    auto v = read_gguf_vocab(default_gguf_path());
    EXPECT_TRUE(v.ok()) << v.status().to_string();
    if (!v.ok()) return nullptr;
    auto t = Tokenizer::from_gguf_vocab(*v);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  auto t = Tokenizer::from_path(kSource + "/../shared/tokenizers/" + name);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer d(tok, skip);
  std::string out;
  for (int32_t id : ids) out += d.step(id);
  out += d.finish();
  return out;
}

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, MatchesTransformers) {
  const std::string name = GetParam();
  json exp = load_expected(name);
  ASSERT_TRUE(exp.contains("cases"));
  auto tok = load_tokenizer(name);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), exp["vocab_size"].get<int32_t>());
  EXPECT_EQ(tok->bos_token(), exp["bos_token"].is_string() ? exp["bos_token"].get<std::string>() : std::string());
  EXPECT_EQ(tok->eos_token(), exp["eos_token"].is_string() ? exp["eos_token"].get<std::string>() : std::string());

  int failures = 0;
  for (const auto& c : exp["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto plain = c["ids_no_special"].get<std::vector<int32_t>>();
    auto got = tok->encode(text, true);
    auto got_plain = tok->encode(text, false);
    EXPECT_EQ(got, ids) << name << " text: " << json(text).dump();
    EXPECT_EQ(got_plain, plain) << name << " (no special) text: " << json(text).dump();
    EXPECT_EQ(tok->decode(ids, false), c["decode"].get<std::string>()) << name << " text: " << json(text).dump();
    EXPECT_EQ(tok->decode(ids, true), c["decode_skip"].get<std::string>()) << name << " text: " << json(text).dump();
    EXPECT_EQ(stream_decode(*tok, ids, false), c["decode"].get<std::string>()) << name << " stream: " << json(text).dump();
    EXPECT_EQ(stream_decode(*tok, ids, true), c["decode_skip"].get<std::string>()) << name << " stream: " << json(text).dump();
    failures += got != ids || got_plain != plain;
  }
  EXPECT_EQ(failures, 0) << name << ": encodings differing from transformers";
  for (const auto& d : exp["decodes"]) {
    const auto ids = d["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->decode(ids, false), d["decode"].get<std::string>()) << name << " ids: " << json(ids).dump();
    EXPECT_EQ(tok->decode(ids, true), d["decode_skip"].get<std::string>()) << name << " ids: " << json(ids).dump();
    EXPECT_EQ(stream_decode(*tok, ids, false), d["decode"].get<std::string>()) << name << " stream ids: " << json(ids).dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Conformance,
                         ::testing::Values("smollm2_gguf", "llama3", "qwen3", "mistral", "mistral_sp_gguf"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace osprey
