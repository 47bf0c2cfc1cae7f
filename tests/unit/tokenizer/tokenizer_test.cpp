// Component tests on small hand-written tokenizer.json files: each expectation
// follows from the documented Hugging Face semantics of the component.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// Character-level BPE: a, b, c, -, space and merges a+- (0), -+b (1), -+- (2), a-+b (3).
json char_model() {
  return json{{"type", "BPE"},
              {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"-", 4}, {" ", 5},
                         {"a-", 6}, {"-b", 7}, {"--", 8}, {"a-b", 9}}},
              {"merges", {"a -", "- b", "- -", "a- b"}},
              {"unk_token", "<unk>"}};
}

std::unique_ptr<Tokenizer> make(json j, const std::string& config = "") {
  if (!j.contains("model")) j["model"] = char_model();
  auto t = Tokenizer::from_json(j.dump(), config);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

json split_on_dash(const char* behavior, bool invert = false) {
  return json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
}

TEST(Bpe, MergesByRankWithoutPreTokenizer) {
  auto t = make(json::object());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->encode("a-b"), (Ids{9}));
  EXPECT_EQ(t->encode("a--b"), (Ids{6, 7}));  // a- (rank 0) then -b (rank 1); -- (rank 2) never forms
  EXPECT_EQ(t->encode("x"), (Ids{0}));        // unknown character
}

TEST(Split, Behaviors) {
  struct Case {
    const char* behavior;
    const char* text;
    Ids ids;
  };
  const Case cases[] = {
      {"Isolated", "a-b", {1, 4, 2}},          {"Removed", "a-b", {1, 2}},
      {"MergedWithPrevious", "a-b", {6, 2}},   {"MergedWithNext", "a-b", {1, 7}},
      {"Contiguous", "a--b", {1, 8, 2}},       {"Isolated", "a--b", {1, 4, 4, 2}},
      {"MergedWithNext", "a--b", {1, 4, 7}},   {"MergedWithPrevious", "a--b", {6, 4, 2}},
  };
  for (const auto& c : cases) {
    auto t = make(json{{"pre_tokenizer", split_on_dash(c.behavior)}});
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->encode(c.text), c.ids) << c.behavior << " " << c.text;
  }
  // invert: the pattern marks the kept pieces; "-" runs become the delimiters.
  auto inv = make(json{{"pre_tokenizer", split_on_dash("Removed", true)}});
  EXPECT_EQ(inv->encode("a-b"), (Ids{4}));
}

TEST(AddedTokens, StripAndSingleWord) {
  json j;
  j["added_tokens"] = json::array({
      {{"id", 20}, {"content", "<x>"}, {"special", true}, {"normalized", false}, {"lstrip", true}, {"rstrip", true}, {"single_word", false}},
      {{"id", 21}, {"content", "<y>"}, {"special", true}, {"normalized", false}, {"lstrip", false}, {"rstrip", false}, {"single_word", false}},
      {{"id", 22}, {"content", "ab"}, {"special", false}, {"normalized", false}, {"lstrip", false}, {"rstrip", false}, {"single_word", true}},
  });
  auto t = make(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->encode("a  <x>  b"), (Ids{1, 20, 2}));
  EXPECT_EQ(t->encode("a <y> b"), (Ids{1, 5, 21, 5, 2}));
  EXPECT_EQ(t->encode("ab c"), (Ids{22, 5, 3}));
  EXPECT_EQ(t->encode("cab"), (Ids{3, 1, 2}));  // not a whole word
  EXPECT_TRUE(t->is_special(20));
  EXPECT_FALSE(t->is_special(22));
  EXPECT_EQ(t->decode(Ids{1, 20, 2}, true), "a b");  // no decoder: tokens joined with spaces
  EXPECT_EQ(t->vocab_size(), 23);
  EXPECT_EQ(t->token_to_id("<y>"), 21);
  EXPECT_EQ(t->id_to_token(9), "a-b");
  EXPECT_EQ(t->id_to_token(1000), "");
}

TEST(AddedTokens, LeftmostLongest) {
  json j;
  j["added_tokens"] = json::array({
      {{"id", 20}, {"content", "<a>"}, {"special", true}, {"normalized", false}},
      {{"id", 21}, {"content", "<a><b>"}, {"special", true}, {"normalized", false}},
  });
  auto t = make(j);
  EXPECT_EQ(t->encode("<a><b><a>"), (Ids{21, 20}));
}

TEST(Bpe, ByteFallbackUnkAndFuse) {
  json m = char_model();
  m["byte_fallback"] = true;
  m["vocab"]["<0xC3>"] = 30;
  m["vocab"]["<0xA9>"] = 31;
  m["fuse_unk"] = true;
  auto t = make(json{{"model", m}, {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}});
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->encode("\xC3\xA9"), (Ids{30, 31}));  // é as bytes
  EXPECT_EQ(t->encode("xyz"), (Ids{0}));             // fused unknowns
  EXPECT_EQ(t->encode("\xC3\xA8"), (Ids{0}));        // è: <0xA8> missing -> unk
  EXPECT_EQ(t->decode(Ids{30, 31, 1}), "\xC3\xA9" "a");
  EXPECT_EQ(t->decode(Ids{30, 1}), "\xEF\xBF\xBD" "a");  // a lone lead byte decodes to U+FFFD
}

TEST(Metaspace, PrependSchemes) {
  json m = {{"type", "BPE"},
            {"vocab", {{"\xE2\x96\x81", 0}, {"a", 1}, {"\xE2\x96\x81" "a", 2}, {"<s>", 3}}},
            {"merges", {"\xE2\x96\x81 a"}}};
  json added = json::array({{{"id", 3}, {"content", "<s>"}, {"special", true}, {"normalized", false}}});
  auto pre = [](const char* scheme) {
    return json{{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", scheme}, {"split", false}};
  };
  auto first = make(json{{"model", m}, {"added_tokens", added}, {"pre_tokenizer", pre("first")}});
  auto always = make(json{{"model", m}, {"added_tokens", added}, {"pre_tokenizer", pre("always")}});
  auto never = make(json{{"model", m}, {"added_tokens", added}, {"pre_tokenizer", pre("never")}});
  EXPECT_EQ(first->encode("a<s>a"), (Ids{2, 3, 1}));
  EXPECT_EQ(always->encode("a<s>a"), (Ids{2, 3, 2}));
  EXPECT_EQ(never->encode("a<s>a"), (Ids{1, 3, 1}));
  EXPECT_EQ(always->encode(" a"), (Ids{2}));  // already starts with the replacement
}

TEST(PostProcessor, TemplateAndConfigFlags) {
  json j;
  j["added_tokens"] = json::array({
      {{"id", 20}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
      {{"id", 21}, {"content", "</s>"}, {"special", true}, {"normalized", false}},
  });
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"pair", json::array()},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {20}}, {"tokens", {"<s>"}}}}}}};
  auto t = make(j);
  EXPECT_EQ(t->encode("a"), (Ids{20, 1}));
  EXPECT_EQ(t->encode("a", false), (Ids{1}));
  // Explicit config flags replace the post-processor (transformers' update_post_processor).
  auto c = make(j, R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": false, "add_eos_token": true})");
  EXPECT_EQ(c->encode("a"), (Ids{1, 21}));
  EXPECT_EQ(c->bos_id(), 20);
  EXPECT_EQ(c->eos_token(), "</s>");
}

TEST(Refusal, UnsupportedComponentsAreNamed) {
  struct Case {
    const char* key;
    json value;
    const char* name;
  };
  const Case cases[] = {
      {"normalizer", {{"type", "BertNormalizer"}}, "BertNormalizer"},
      {"pre_tokenizer", {{"type", "Punctuation"}}, "Punctuation"},
      {"decoder", {{"type", "WordPiece"}}, "WordPiece"},
      {"post_processor", {{"type", "Mystery"}}, "Mystery"},
      {"model", {{"type", "Unigram"}, {"vocab", json::array()}}, "Unigram"},
  };
  for (const auto& c : cases) {
    json j = {{"model", char_model()}};
    j[c.key] = c.value;
    auto t = Tokenizer::from_json(j.dump(), "");
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), StatusCode::kUnsupported) << c.name;
    EXPECT_NE(t.status().message().find(c.name), std::string::npos) << t.status().message();
  }
}

TEST(Refusal, MalformedInputs) {
  EXPECT_FALSE(Tokenizer::from_json("{", "").ok());
  EXPECT_FALSE(Tokenizer::from_json("[]", "").ok());
  EXPECT_FALSE(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})", "").ok());
  EXPECT_FALSE(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": -3}}})", "").ok());
  EXPECT_FALSE(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}},
      "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})", "").ok());
  EXPECT_EQ(Tokenizer::from_path("/nonexistent/tokenizer").status().code(), StatusCode::kNotFound);
  GgufVocab v;
  v.model = "bert";
  v.tokens = {"a"};
  EXPECT_EQ(Tokenizer::from_gguf_vocab(v).status().code(), StatusCode::kUnsupported);
  v.model = "gpt2";
  v.tokens.clear();
  EXPECT_FALSE(Tokenizer::from_gguf_vocab(v).ok());
  v.tokens = {"a", "b"};
  v.token_types = {1};
  EXPECT_FALSE(Tokenizer::from_gguf_vocab(v).ok());
}

// Byte-level GGUF vocabulary: all 256 byte tokens, no merges.
std::unique_ptr<Tokenizer> byte_vocab() {
  GgufVocab v;
  v.model = "gpt2";
  v.pre = "default";
  // GPT-2 byte alphabet: printable Latin-1 bytes spell themselves, the rest 256+k.
  for (int b = 0, extra = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    char32_t cp = printable ? b : 256 + extra++;
    std::string s;
    if (cp < 0x80) s.push_back(static_cast<char>(cp));
    else { s.push_back(static_cast<char>(0xC0 | (cp >> 6))); s.push_back(static_cast<char>(0x80 | (cp & 0x3F))); }
    v.tokens.push_back(s);
  }
  v.tokens.push_back("<|end|>");
  v.token_types.assign(256, 1);
  v.token_types.push_back(3);
  v.eos_id = 256;
  auto t = Tokenizer::from_gguf_vocab(v);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

TEST(Gguf, ByteLevelWithoutMerges) {
  auto t = byte_vocab();
  // Every byte is its own token; ids follow the byte alphabet order above.
  auto ids = t->encode("A \xC3\xA9<|end|>");
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids.back(), 256);
  EXPECT_EQ(t->decode(ids), "A \xC3\xA9<|end|>");
  EXPECT_EQ(t->decode(ids, true), "A \xC3\xA9");
  EXPECT_EQ(t->eos_id(), 256);
  EXPECT_FALSE(t->bos_id().has_value());
}

TEST(IncrementalDetokenizer, HoldsSplitCharacters) {
  auto t = byte_vocab();
  auto ids = t->encode("x\xE2\x82\xAC!");  // x € !
  ASSERT_EQ(ids.size(), 5u);
  IncrementalDetokenizer d(*t, false);
  EXPECT_EQ(d.step(ids[0]), "x");
  EXPECT_EQ(d.step(ids[1]), "");
  EXPECT_EQ(d.step(ids[2]), "");
  EXPECT_EQ(d.step(ids[3]), "\xE2\x82\xAC");
  EXPECT_EQ(d.step(ids[4]), "!");
  EXPECT_EQ(d.finish(), "");
  // A sequence that never completes is released by finish() as the full decode has it.
  IncrementalDetokenizer e(*t, false);
  EXPECT_EQ(e.step(ids[1]), "");
  EXPECT_EQ(e.finish(), t->decode(Ids{ids[1]}));
  // Prompt context produces no output.
  auto prompt = t->encode("ab");
  IncrementalDetokenizer p(*t, false, prompt);
  EXPECT_EQ(p.step(ids[0]), "x");
}

TEST(Encode, InvalidUtf8IsReadAsReplacement) {
  auto t = byte_vocab();
  EXPECT_EQ(t->encode("a\xFFz"), t->encode("a\xEF\xBF\xBDz"));
  EXPECT_EQ(t->encode(std::string_view("a\0b", 3)).size(), 3u);
}

}  // namespace
}  // namespace osprey
