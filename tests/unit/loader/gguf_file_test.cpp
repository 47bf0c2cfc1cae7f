#include "loader/gguf_file.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "test_builders.h"

namespace osprey {
namespace {

using testing::GgufBuilder;
using namespace osprey::testing;  // NOLINT: type id enums

std::string default_model_path() {
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "") + "/.cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

Expected<std::unique_ptr<GgufFile>> parse(const std::vector<uint8_t>& b) {
  return GgufFile::parse(b.data(), b.size(), "test.gguf");
}

// Expects a parse error whose message names the file and contains `needle`.
void expect_error(const std::vector<uint8_t>& b, const std::string& needle) {
  auto r = parse(b);
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_NE(r.status().message().find("test.gguf"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

std::vector<uint8_t> f32_bytes(std::vector<float> v) { return to_bytes(v); }

// One tensor of each supported type, and metadata of every value type.
GgufBuilder full_builder() {
  GgufBuilder g;
  g.kv_string("general.architecture", "llama");
  g.kv<uint8_t>("t.u8", kGU8, 200);
  g.kv<int8_t>("t.i8", kGI8, -5);
  g.kv<uint16_t>("t.u16", kGU16, 60000);
  g.kv<int16_t>("t.i16", kGI16, -30000);
  g.kv<uint32_t>("t.u32", kGU32, 4000000000u);
  g.kv<int32_t>("t.i32", kGI32, -2000000000);
  g.kv<float>("t.f32", kGF32, 1.5f);
  g.kv<uint8_t>("t.bool", kGBool, 1);
  g.kv<uint64_t>("t.u64", kGU64, 1ull << 40);
  g.kv<uint64_t>("t.u64big", kGU64, ~0ull);
  g.kv<int64_t>("t.i64", kGI64, -(1ll << 40));
  g.kv<double>("t.f64", kGF64, 0.25);
  g.kv_string("t.utf8", "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80");
  g.kv_string_array("t.strs", {"a", "", "\xc4\xa0the"});
  g.kv_array<int32_t>("t.ints", kGI32, {1, -2, 3});
  g.kv_array<float>("t.floats", kGF32, {0.5f, -1.0f});
  g.kv_array<uint8_t>("t.bools", kGBool, {1, 0});
  g.tensor("w.f32", {3, 2}, kTF32, f32_bytes({1, 2, 3, 4, 5, 6}));
  g.tensor("w.f16", {4}, kTF16, std::vector<uint8_t>(8, 0x11));
  g.tensor("w.bf16", {2, 1, 1, 2}, kTBF16, std::vector<uint8_t>(8, 0x22));
  g.tensor("w.q8", {64, 3}, kTQ8_0, std::vector<uint8_t>(6 * 34, 0x33));
  g.tensor("w.q40", {32}, kTQ4_0, std::vector<uint8_t>(18, 0x44));
  g.tensor("w.q41", {32, 2}, kTQ4_1, std::vector<uint8_t>(40, 0x55));
  return g;
}

TEST(GgufFile, RoundTripMetadataAndTensors) {
  const auto bytes = full_builder().build();
  auto r = parse(bytes);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.name(), "test.gguf");
  EXPECT_EQ(f.metadata().size(), 18u);
  EXPECT_EQ(f.metadata()[0].first, "general.architecture");
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("t.u8"), 200);
  EXPECT_EQ(f.get_int("t.i8"), -5);
  EXPECT_EQ(f.get_int("t.u16"), 60000);
  EXPECT_EQ(f.get_int("t.i16"), -30000);
  EXPECT_EQ(f.get_int("t.u32"), 4000000000ll);
  EXPECT_EQ(f.get_int("t.i32"), -2000000000);
  EXPECT_EQ(f.get_int("t.bool"), 1);
  EXPECT_EQ(f.get_int("t.u64"), 1ll << 40);
  EXPECT_EQ(f.get_int("t.u64big"), std::nullopt);
  EXPECT_EQ(f.find("t.u64big")->u, ~0ull);
  EXPECT_EQ(f.get_int("t.i64"), -(1ll << 40));
  EXPECT_EQ(f.get_int("t.f32"), std::nullopt);
  EXPECT_EQ(f.get_float("t.f32"), 1.5);
  EXPECT_EQ(f.get_float("t.f64"), 0.25);
  EXPECT_EQ(f.get_float("t.i32"), -2000000000.0);
  EXPECT_EQ(f.get_string("t.utf8"), "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(f.get_string("t.u8"), std::nullopt);
  EXPECT_EQ(f.get_string("missing"), std::nullopt);
  EXPECT_EQ(f.find("missing"), nullptr);
  ASSERT_NE(f.get_string_array("t.strs"), nullptr);
  EXPECT_EQ(*f.get_string_array("t.strs"), (std::vector<std::string>{"a", "", "\xc4\xa0the"}));
  EXPECT_EQ(f.get_string_array("t.ints"), nullptr);
  EXPECT_EQ(f.get_int_array("t.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get_int_array("t.bools"), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(f.get_int_array("t.floats"), std::nullopt);
  EXPECT_EQ(f.get_float_array("t.floats"), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(f.get_float_array("t.ints"), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(f.find("t.strs")->type, GgufType::kArray);
  EXPECT_EQ(f.find("t.strs")->array_type, GgufType::kString);

  ASSERT_EQ(f.tensors().size(), 6u);
  const GgufTensorInfo* t = f.find_tensor("w.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));  // ne {3, 2} reversed
  EXPECT_EQ(t->nbytes, 24u);
  EXPECT_EQ(t->offset, 0u);
  float vals[6];
  std::memcpy(vals, t->data, 24);
  EXPECT_EQ(vals[0], 1.0f);
  EXPECT_EQ(vals[5], 6.0f);
  EXPECT_EQ(t->data, f.data_section());
  EXPECT_EQ((f.data_section() - bytes.data()) % 32, 0);

  EXPECT_EQ(f.find_tensor("w.f16")->dtype, DType::kF16);
  EXPECT_EQ(f.find_tensor("w.f16")->offset, 32u);
  EXPECT_EQ(f.find_tensor("w.bf16")->dtype, DType::kBF16);
  EXPECT_EQ(f.find_tensor("w.bf16")->shape, (std::vector<int64_t>{2, 1, 1, 2}));
  const GgufTensorInfo* q8 = f.find_tensor("w.q8");
  EXPECT_EQ(q8->dtype, DType::kQ8_0);
  EXPECT_EQ(q8->shape, (std::vector<int64_t>{3, 64}));
  EXPECT_EQ(q8->nbytes, 6u * 34);
  EXPECT_EQ(q8->data[0], 0x33);
  EXPECT_EQ(f.find_tensor("w.q40")->dtype, DType::kQ4_0);
  EXPECT_EQ(f.find_tensor("w.q40")->nbytes, 18u);
  EXPECT_EQ(f.find_tensor("w.q41")->dtype, DType::kQ4_1);
  EXPECT_EQ(f.find_tensor("w.q41")->nbytes, 40u);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

TEST(GgufFile, Version2AndCustomAlignment) {
  GgufBuilder g;
  g.version = 2;
  g.alignment = 64;
  g.kv<uint32_t>("general.alignment", kGU32, 64);
  g.tensor("a", {4}, kTF32, f32_bytes({1, 2, 3, 4}));
  g.tensor("b", {4}, kTF32, f32_bytes({5, 6, 7, 8}));
  const auto bytes = g.build();
  auto r = parse(bytes);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->version(), 2u);
  EXPECT_EQ((*r)->alignment(), 64u);
  EXPECT_EQ((*r)->find_tensor("b")->offset, 64u);
  float x;
  std::memcpy(&x, (*r)->find_tensor("b")->data, 4);
  EXPECT_EQ(x, 5.0f);
}

TEST(GgufFile, MetadataOnlyFileWithoutPadding) {
  GgufBuilder g;
  g.kv_string("general.architecture", "llama");
  auto r = parse(g.build());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE((*r)->tensors().empty());
}

TEST(GgufFile, EveryTruncationIsAnError) {
  const auto bytes = full_builder().build();
  // Data of the last tensor ends before the final padding; cutting anywhere
  // before that end must fail cleanly.
  auto full = parse(bytes);
  ASSERT_TRUE(full.ok());
  const GgufTensorInfo& last = (*full)->tensors().back();
  const size_t needed = static_cast<size_t>(last.data - bytes.data()) + last.nbytes;
  for (size_t n = 0; n < needed; ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = parse(cut);
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_NE(r.status().message().find("test.gguf"), std::string::npos);
  }
}

TEST(GgufFile, EmptyAndNullInput) {
  EXPECT_FALSE(GgufFile::parse(nullptr, 0, "test.gguf").ok());
  EXPECT_FALSE(GgufFile::parse(nullptr, 100, "test.gguf").ok());
  expect_error({}, "truncated");
}

TEST(GgufFile, BadMagicAndVersion) {
  auto b = full_builder().build();
  b[0] = 'X';
  expect_error(b, "bad magic");
  GgufBuilder g;
  g.version = 1;
  expect_error(g.build(), "version 1");
  g.version = 4;
  expect_error(g.build(), "version 4");
  g.version = 0x03000000;  // a big-endian file
  expect_error(g.build(), "big-endian");
}

TEST(GgufFile, HugeCountsAreRejectedBeforeAllocating) {
  GgufBuilder g;
  g.kv_string("a", "b");
  g.kv_count_override = int64_t{1} << 62;
  expect_error(g.build(), "metadata count");
  GgufBuilder t;
  t.tensor_count_override = int64_t{1} << 62;
  expect_error(t.build(), "tensor count");

  // A string whose length is larger than the file.
  ByteWriter w;
  w.str("key");
  w.pod<uint32_t>(kGString);
  w.pod<uint64_t>(~0ull);
  GgufBuilder s;
  s.add_raw_kv(w.bytes());
  expect_error(s.build(), "has length");

  // An array claiming 2^61 u64 elements.
  ByteWriter a;
  a.str("arr");
  a.pod<uint32_t>(kGArray);
  a.pod<uint32_t>(kGU64);
  a.pod<uint64_t>(1ull << 61);
  GgufBuilder ab;
  ab.add_raw_kv(a.bytes());
  expect_error(ab.build(), "claims");

  // An array of 2^60 strings.
  ByteWriter as;
  as.str("arr");
  as.pod<uint32_t>(kGArray);
  as.pod<uint32_t>(kGString);
  as.pod<uint64_t>(1ull << 60);
  GgufBuilder asb;
  asb.add_raw_kv(as.bytes());
  expect_error(asb.build(), "claims");

  // Key length huge.
  ByteWriter k;
  k.pod<uint64_t>(1ull << 50);
  k.pod<uint64_t>(0);  // enough bytes for the kv count check to pass
  GgufBuilder kb;
  kb.add_raw_kv(k.bytes());
  expect_error(kb.build(), "has length");
}

TEST(GgufFile, NestedArraysAndUnknownTypes) {
  ByteWriter a;
  a.str("nested");
  a.pod<uint32_t>(kGArray);
  a.pod<uint32_t>(kGArray);
  a.pod<uint64_t>(1);
  a.pod<uint32_t>(kGArray);
  a.pod<uint32_t>(kGU8);
  a.pod<uint64_t>(0);
  GgufBuilder g;
  g.add_raw_kv(a.bytes());
  expect_error(g.build(), "nested arrays");

  GgufBuilder u;
  u.kv<uint32_t>("weird", 13, 0);
  expect_error(u.build(), "unknown value type 13");

  ByteWriter e;
  e.str("arr");
  e.pod<uint32_t>(kGArray);
  e.pod<uint32_t>(99);
  e.pod<uint64_t>(0);
  GgufBuilder eb;
  eb.add_raw_kv(e.bytes());
  expect_error(eb.build(), "unknown element type 99");

  GgufBuilder b;
  b.kv<uint8_t>("flag", kGBool, 7);
  expect_error(b.build(), "bool with value 7");
}

TEST(GgufFile, InvalidUtf8) {
  GgufBuilder k;
  k.kv_string("bad\xff" "key", "v");
  expect_error(k.build(), "not valid UTF-8");
  GgufBuilder v;
  v.kv_string("key", "\xc0\xaf");  // overlong '/'
  expect_error(v.build(), "not valid UTF-8");
  GgufBuilder s;
  s.kv_string("key", "\xed\xa0\x80");  // surrogate
  expect_error(s.build(), "not valid UTF-8");
  GgufBuilder a;
  a.kv_string_array("arr", {"ok", "\xe2\x82"});  // truncated sequence
  expect_error(a.build(), "not valid UTF-8");
  GgufBuilder t;
  t.tensor("w\x80", {4}, kTF32, f32_bytes({1, 2, 3, 4}));
  expect_error(t.build(), "not valid UTF-8");
}

TEST(GgufFile, DuplicateKeysAndTensorNames) {
  GgufBuilder g;
  g.kv<uint32_t>("a.b", kGU32, 1);
  g.kv<uint32_t>("a.b", kGU32, 2);
  expect_error(g.build(), "duplicate metadata key 'a.b'");
  GgufBuilder t;
  t.tensor("w", {4}, kTF32, f32_bytes({1, 2, 3, 4}));
  t.tensor("w", {4}, kTF32, f32_bytes({1, 2, 3, 4}));
  expect_error(t.build(), "duplicate tensor name 'w'");
}

TEST(GgufFile, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufBuilder g;
    g.kv<uint32_t>("general.alignment", kGU32, a);
    expect_error(g.build(), "general.alignment is " + std::to_string(a));
  }
  GgufBuilder s;
  s.kv_string("general.alignment", "32");
  expect_error(s.build(), "general.alignment has type string");
}

TEST(GgufFile, BadShapes) {
  GgufBuilder z;
  z.tensor("w", {}, kTF32, {});
  expect_error(z.build(), "tensor 'w' has 0 dimensions");
  GgufBuilder five;
  five.tensor("w", {1, 1, 1, 1, 1}, kTF32, f32_bytes({1}));
  expect_error(five.build(), "tensor 'w' has 5 dimensions");
  GgufBuilder zero;
  zero.tensor("w", {4, 0}, kTF32, {});
  expect_error(zero.build(), "zero-length dimension");
  GgufBuilder ovf;
  ovf.tensor("w", {1ull << 32, 1ull << 32}, kTF32, {});
  expect_error(ovf.build(), "overflows");
  GgufBuilder huge;
  huge.tensor("w", {~0ull}, kTF32, {});
  expect_error(huge.build(), "overflows");
  GgufBuilder bytes_ovf;  // element count fits, byte count does not
  bytes_ovf.tensor("w", {1ull << 62}, kTF32, {});
  expect_error(bytes_ovf.build(), "byte size that overflows");
  GgufBuilder block;
  block.tensor("w", {33, 2}, kTQ8_0, std::vector<uint8_t>(68, 0));
  expect_error(block.build(), "not a multiple of the block size 32");
}

TEST(GgufFile, UnsupportedTypeIsNamed) {
  GgufBuilder g;
  g.tensor("blk.0.ffn_up.weight", {256}, kTQ6_K, std::vector<uint8_t>(210, 0));
  auto r = parse(g.build());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find(
                "tensor 'blk.0.ffn_up.weight' has type Q6_K (14), which osprey does not support"),
            std::string::npos)
      << r.status().message();
  GgufBuilder u;
  u.tensor("w", {32}, 1000, std::vector<uint8_t>(64, 0));
  expect_error(u.build(), "type unknown (1000)");
}

TEST(GgufFile, BadOffsets) {
  GgufBuilder past;
  past.tensor("w", {4}, kTF32, f32_bytes({1, 2, 3, 4}));
  past.tensors()[0].offset_override = 1 << 20;
  expect_error(past.build(), "past the end of the data section");

  GgufBuilder wrap;  // offset + nbytes wraps around 2^64
  wrap.tensor("w", {4}, kTF32, f32_bytes({1, 2, 3, 4}));
  wrap.tensors()[0].offset_override = static_cast<int64_t>(~0ull / 64 * 32);
  expect_error(wrap.build(), "past the end");

  GgufBuilder mis;
  mis.tensor("w", {4}, kTF32, f32_bytes({1, 2, 3, 4}));
  mis.tensors()[0].offset_override = 4;
  expect_error(mis.build(), "not a multiple of the alignment 32");

  GgufBuilder overlap;
  overlap.tensor("a", {16}, kTF32, std::vector<uint8_t>(64, 0));
  overlap.tensor("b", {16}, kTF32, std::vector<uint8_t>(64, 0));
  overlap.tensors()[1].offset_override = 32;
  expect_error(overlap.build(), "overlap");

  GgufBuilder same;
  same.tensor("a", {8}, kTF32, std::vector<uint8_t>(32, 0));
  same.tensor("b", {8}, kTF32, std::vector<uint8_t>(32, 0));
  same.tensors()[1].offset_override = 0;
  expect_error(same.build(), "overlap");
}

TEST(GgufFile, OpenMissingFile) {
  auto r = GgufFile::open("/nonexistent/osprey/model.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/osprey/model.gguf"), std::string::npos);
}

TEST(GgufFile, OpenEmptyFile) {
  const std::string path = ::testing::TempDir() + "/osprey_empty.gguf";
  { std::FILE* f = std::fopen(path.c_str(), "wb"); ASSERT_NE(f, nullptr); std::fclose(f); }
  auto r = GgufFile::open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos);
  std::remove(path.c_str());
}

TEST(GgufFile, DefaultModel) {
  const std::string path = default_model_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << "default model not installed at " << path << " (run scripts/fetch_model.sh)";
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.metadata().size(), 33u);  // kv_count in the header, as gguf-py reads it
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  ASSERT_NE(f.get_string_array("tokenizer.ggml.tokens"), nullptr);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type")->size(), 49152u);
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_NE(f.get_string("tokenizer.chat_template")->find("<|im_start|>"), std::string::npos);
  const GgufTensorInfo* e = f.find_tensor("token_embd.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, DType::kQ8_0);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(e->nbytes, 30081024u);
  const GgufTensorInfo* q = f.find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kQ4_1);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{576, 576}));
  EXPECT_EQ(f.find_tensor("blk.0.attn_k.weight")->shape, (std::vector<int64_t>{192, 576}));
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->shape, (std::vector<int64_t>{576, 1536}));
  EXPECT_EQ(f.find_tensor("blk.29.attn_norm.weight")->dtype, DType::kF32);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

// The fuzz seeds (tests/fuzz/make_seeds.py) must stay valid files, or the
// fuzzers start from nothing.
TEST(GgufFile, FuzzSeedsParse) {
  const std::filesystem::path dir = std::filesystem::path(OSPREY_SOURCE_DIR) / "tests/fuzz/corpus/gguf";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    auto r = GgufFile::open(e.path().string());
    EXPECT_TRUE(r.ok()) << e.path() << ": " << r.status().to_string();
    ++n;
  }
  EXPECT_GE(n, 4);
  auto tiny = GgufFile::open((dir / "llama_tiny.gguf").string());
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ((*tiny)->tensors().size(), 6u);
}

}  // namespace
}  // namespace osprey
