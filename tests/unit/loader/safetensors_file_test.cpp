#include "loader/safetensors_file.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_builders.h"

namespace osprey {
namespace {

using testing::make_safetensors;
using testing::to_bytes;

Expected<std::unique_ptr<SafetensorsFile>> parse(const std::vector<uint8_t>& b) {
  return SafetensorsFile::parse(b.data(), b.size(), "test.safetensors");
}

void expect_error(const std::vector<uint8_t>& b, const std::string& needle) {
  auto r = parse(b);
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_NE(r.status().message().find("test.safetensors"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

// A header describing one tensor, for the hostile cases.
std::vector<uint8_t> one(const std::string& desc, size_t data_bytes = 16) {
  return make_safetensors("{\"t\":" + desc + "}", std::vector<uint8_t>(data_bytes, 0));
}

TEST(SafetensorsFile, RoundTrip) {
  std::vector<uint8_t> data;
  auto append = [&](const std::vector<uint8_t>& b) { data.insert(data.end(), b.begin(), b.end()); };
  append(to_bytes(std::vector<float>{1, 2, 3, 4, 5, 6}));           // a: F32 [2,3]   0..24
  append(to_bytes(std::vector<uint16_t>{0x3c00, 0xc000}));          // b: F16 [2]     24..28
  append(to_bytes(std::vector<uint16_t>{0x3f80}));                  // c: BF16 []     28..30
  append(std::vector<uint8_t>{9, 8});                               // d: U8 [2,1]    30..32
  append(to_bytes(std::vector<int32_t>{-7}));                       // e: I32 [1]     32..36
  append(std::vector<uint8_t>(4, 0));                               //                36..40
  append(to_bytes(std::vector<int64_t>{1ll << 40}));                // f: I64 [1,1,1,1] 40..48
  const std::string header =
      R"({"__metadata__":{"format":"pt","note":"x"},)"
      R"("b":{"dtype":"F16","shape":[2],"data_offsets":[24,28]},)"
      R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("c":{"dtype":"BF16","shape":[],"data_offsets":[28,30]},)"
      R"("d":{"dtype":"U8","shape":[2,1],"data_offsets":[30,32]},)"
      R"("e":{"dtype":"I32","shape":[1],"data_offsets":[32,36]},)"
      R"("z":{"dtype":"F32","shape":[0,5],"data_offsets":[36,36]},)"
      R"("f":{"dtype":"I64","shape":[1,1,1,1],"data_offsets":[40,48]}}      )";  // trailing padding
  const auto bytes = make_safetensors(header, data);
  auto r = parse(bytes);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const SafetensorsFile& f = **r;
  EXPECT_EQ(f.tensors().size(), 7u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "x");
  const size_t data_start = 8 + header.size();
  const SafetensorsTensorInfo* a = f.find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->nbytes, 24u);
  EXPECT_EQ(a->data, bytes.data() + data_start);
  float x;
  std::memcpy(&x, a->data + 20, 4);
  EXPECT_EQ(x, 6.0f);
  EXPECT_EQ(f.find_tensor("b")->dtype, DType::kF16);
  EXPECT_EQ(f.find_tensor("b")->offset, 24u);
  EXPECT_EQ(f.find_tensor("c")->dtype, DType::kBF16);
  EXPECT_TRUE(f.find_tensor("c")->shape.empty());
  EXPECT_EQ(f.find_tensor("d")->dtype, DType::kU8);
  EXPECT_EQ(f.find_tensor("d")->data[0], 9);
  EXPECT_EQ(f.find_tensor("e")->dtype, DType::kI32);
  EXPECT_EQ(f.find_tensor("f")->dtype, DType::kI64);
  EXPECT_EQ(f.find_tensor("z")->nbytes, 0u);
  EXPECT_EQ(f.find_tensor("__metadata__"), nullptr);
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
  // Sorted by offset.
  for (size_t k = 1; k < f.tensors().size(); ++k) EXPECT_LE(f.tensors()[k - 1].offset, f.tensors()[k].offset);
}

TEST(SafetensorsFile, EmptyHeaderObject) {
  auto r = parse(make_safetensors("{}", {}));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE((*r)->tensors().empty());
}

TEST(SafetensorsFile, EveryTruncationIsAnError) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  const auto bytes = make_safetensors(header, std::vector<uint8_t>(16, 1));
  ASSERT_TRUE(parse(bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(parse(cut).ok()) << "prefix of " << n << " bytes parsed";
  }
  EXPECT_FALSE(SafetensorsFile::parse(nullptr, 0, "x").ok());
}

TEST(SafetensorsFile, HeaderLength) {
  expect_error(make_safetensors("{}", {}, 1000), "exceeds the file size");
  expect_error(make_safetensors("{}", {}, int64_t{1} << 62), "exceeds the file size");
  expect_error(std::vector<uint8_t>{1, 2, 3}, "too short");
  expect_error(make_safetensors("[1, 2]", {}), "not a JSON object");
  expect_error(make_safetensors("", {}), "not a JSON object");
}

TEST(SafetensorsFile, BadJson) {
  expect_error(make_safetensors("{\"a\":", {}), "not valid JSON");
  expect_error(make_safetensors("{\"a\": 1} trailing", {}), "not valid JSON");
  expect_error(make_safetensors("{\"\xff\":1}", {}), "not valid JSON");
  std::string deep(100000, '[');
  expect_error(make_safetensors("{\"a\":" + deep + "}", {}), "nests too deeply");
  expect_error(make_safetensors("{\"a\":1}", {}), "tensor 'a' is not described by an object");
}

TEST(SafetensorsFile, MissingOrMistypedFields) {
  expect_error(one(R"({"shape":[4],"data_offsets":[0,16]})"), "no string 'dtype'");
  expect_error(one(R"({"dtype":"F32","data_offsets":[0,16]})"), "no array 'shape'");
  expect_error(one(R"({"dtype":"F32","shape":[4]})"), "'data_offsets' pair");
  expect_error(one(R"({"dtype":"F32","shape":[4],"data_offsets":[0]})"), "'data_offsets' pair");
  expect_error(one(R"({"dtype":"F32","shape":[-4],"data_offsets":[0,16]})"), "not a non-negative integer");
  expect_error(one(R"({"dtype":"F32","shape":[4.0],"data_offsets":[0,16]})"), "not a non-negative integer");
  expect_error(one(R"({"dtype":"F32","shape":["4"],"data_offsets":[0,16]})"), "not a non-negative integer");
  expect_error(one(R"({"dtype":"F32","shape":[4],"data_offsets":[-1,16]})"), "not non-negative integers");
  expect_error(one(R"({"dtype":"F32","shape":[1,1,1,1,4],"data_offsets":[0,16]})"), "5 dimensions");
  expect_error(make_safetensors(R"({"__metadata__":{"a":1}})", {}), "__metadata__ value of 'a' is not a string");
  expect_error(make_safetensors(R"({"__metadata__":[]})", {}), "__metadata__ is not an object");
}

TEST(SafetensorsFile, UnsupportedDtypeIsNamed) {
  auto r = parse(one(R"({"dtype":"F64","shape":[2],"data_offsets":[0,16]})"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("tensor 't' has dtype F64, which osprey does not support"),
            std::string::npos)
      << r.status().message();
  expect_error(one(R"({"dtype":"F8_E5M2","shape":[16],"data_offsets":[0,16]})"), "dtype F8_E5M2");
  // F8_E4M3 (FP8 checkpoints) loads: one byte an element, checked as any other.
  auto f8 = parse(one(R"({"dtype":"F8_E4M3","shape":[16],"data_offsets":[0,16]})"));
  ASSERT_TRUE(f8.ok()) << f8.status().to_string();
  expect_error(one(R"({"dtype":"F8_E4M3","shape":[16],"data_offsets":[0,15]})"), "should take 16 bytes");
}

TEST(SafetensorsFile, SizeAndOffsetChecks) {
  expect_error(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,16]})"), "should take 12 bytes but data_offsets span 16");
  expect_error(one(R"({"dtype":"F32","shape":[8],"data_offsets":[0,32]})"), "past the end of the data section");
  expect_error(one(R"({"dtype":"F32","shape":[4],"data_offsets":[16,0]})"), "reversed");
  expect_error(one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]})"), "overflows");
  expect_error(one(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,16]})"), "overflows");
  expect_error(one(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,16]})"), "should take");
  expect_error(one(R"({"dtype":"F32","shape":[4],"data_offsets":[18446744073709551600,18446744073709551615]})"),
               "past the end");
  expect_error(make_safetensors(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                std::vector<uint8_t>(16, 0)),
               "overlap");
  expect_error(make_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                std::vector<uint8_t>(16, 0)),
               "duplicate tensor name 'a'");
}

TEST(SafetensorsFile, OpenMissingFile) {
  auto r = SafetensorsFile::open("/nonexistent/osprey/model.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

TEST(SafetensorsFile, FuzzSeedsParse) {
  const std::filesystem::path dir = std::filesystem::path(OSPREY_SOURCE_DIR) / "tests/fuzz/corpus/safetensors";
  auto mixed = SafetensorsFile::open((dir / "mixed.safetensors").string());
  ASSERT_TRUE(mixed.ok()) << mixed.status().to_string();
  EXPECT_EQ((*mixed)->tensors().size(), 6u);
  EXPECT_TRUE(SafetensorsFile::open((dir / "empty.safetensors").string()).ok());
  auto f64 = SafetensorsFile::open((dir / "unsupported.safetensors").string());
  ASSERT_FALSE(f64.ok());
  EXPECT_EQ(f64.status().code(), StatusCode::kUnsupported);
  auto fp8 = SafetensorsFile::open((dir / "fp8.safetensors").string());
  ASSERT_TRUE(fp8.ok()) << fp8.status().to_string();
  ASSERT_EQ((*fp8)->tensors().size(), 2u);
  const auto* q = (*fp8)->find_tensor("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kF8E4M3);
  EXPECT_EQ(q->nbytes, 16u);
}

}  // namespace
}  // namespace osprey
