// --load-format dummy on the CPU: config sources, shapes, determinism from a
// seed, clear errors; and the shared fill hash of Backend::fill_uniform.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loader/dummy_weights.h"
#include "model/model.h"
#include "ops/backend.h"
#include "ops/uniform_hash.h"
#include "sequence_runner.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;

// A tiny Qwen2-style config (biases) with GQA 4:2 and head_dim 16.
constexpr const char* kTinyConfig = R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
  "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false,
  "bos_token_id": 1, "eos_token_id": 2})";

class DummyModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("osprey_dummy_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << kTinyConfig;
    backend_ = ops::make_cpu_backend(1);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Expected<std::unique_ptr<Model>> load(const std::string& path, uint64_t seed = 7) {
    ModelLoadOptions o;
    o.load_format = "dummy";
    o.dummy_seed = seed;
    return Model::load(path, *backend_, o);
  }
  std::vector<float> logits(Model& m) {
    testing::SequenceRunner run(m, 32, 4);
    return run.feed({3, 5, 7, 11, 13, 17}, true);
  }

  fs::path dir_;
  std::unique_ptr<ops::Backend> backend_;
};

TEST_F(DummyModelTest, LoadsFromFolderAndConfigFileWithRightShapes) {
  for (const std::string& path : {dir_.string(), (dir_ / "config.json").string()}) {
    auto m = load(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const ModelConfig& c = (*m)->config();
    EXPECT_EQ(c.vocab_size, 97);
    EXPECT_EQ(c.num_layers, 3);
    EXPECT_TRUE((*m)->is_dummy());
    EXPECT_EQ((*m)->activation_dtype(), DType::kF32);
    EXPECT_EQ((*m)->kv_dtype(), DType::kF32);
    // Every float parameter counted once, all F32 on the CPU.
    const int64_t d = 64, f = 96, v = 97, hd = 16, hq = 4, hk = 2, layers = 3;
    const int64_t per_layer = d + (hq + 2 * hk) * hd * d + (hq + 2 * hk) * hd + hq * hd * d + d + 2 * f * d + d * f;
    const int64_t params = 2 * v * d + d + layers * per_layer;
    EXPECT_EQ((*m)->weight_bytes(), static_cast<size_t>(params) * 4);
    EXPECT_EQ((*m)->kv_bytes_per_token(), static_cast<size_t>(2 * layers * hk * hd * 4));
  }
}

TEST_F(DummyModelTest, SameSeedSameLogitsOtherSeedOthers) {
  auto a = load(dir_.string(), 7);
  auto b = load(dir_.string(), 7);
  auto c = load(dir_.string(), 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const auto la = logits(**a), lb = logits(**b), lc = logits(**c);
  ASSERT_EQ(la.size(), 6u * 97u);
  EXPECT_EQ(la, lb);
  EXPECT_NE(la, lc);
  double ss = 0;
  for (float x : la) {
    ASSERT_TRUE(std::isfinite(x));
    ss += double{x} * x;
  }
  EXPECT_GT(ss, 0.0);  // not all zeros
}

TEST_F(DummyModelTest, BundledConfigNameResolves) {
  // The config alone: shapes of SmolLM2-135M; only parse, do not fill 135M weights here.
  ModelLoadOptions o;
  o.load_format = "dummy";
  o.dtype = "bfloat16";  // rejected before any weight is made
  auto m = Model::load("SmolLM2-135M", *backend_, o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(m.status().message().find("float32"), std::string::npos) << m.status().message();
}

TEST_F(DummyModelTest, ErrorsAreClear) {
  auto missing = load((dir_ / "nope").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("bundled config"), std::string::npos);

  std::ofstream(dir_ / "bad.json") << "{not json";
  auto bad = load((dir_ / "bad.json").string());
  EXPECT_FALSE(bad.ok());

  std::ofstream(dir_ / "arch.json") << R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})";
  auto arch = load((dir_ / "arch.json").string());
  EXPECT_FALSE(arch.ok());

  ModelLoadOptions o;
  o.load_format = "pickle";
  auto fmt = Model::load(dir_.string(), *backend_, o);
  ASSERT_FALSE(fmt.ok());
  EXPECT_EQ(fmt.status().code(), StatusCode::kInvalidArgument);

  o.load_format = "dummy";
  o.kv_cache_dtype = "int3";
  auto kvd = Model::load(dir_.string(), *backend_, o);
  ASSERT_FALSE(kvd.ok());
  EXPECT_EQ(kvd.status().code(), StatusCode::kInvalidArgument);

  // Weight quantisation: an unknown kind is invalid; fp8 needs FP8 tensor
  // cores, which the CPU backend does not have (checked before any weight
  // is made); "none" loads as the default does.
  o.kv_cache_dtype = "auto";
  o.quantization = "int4";
  auto q = Model::load(dir_.string(), *backend_, o);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("none or fp8"), std::string::npos) << q.status().message();
  o.quantization = "fp8";
  auto f8 = Model::load(dir_.string(), *backend_, o);
  ASSERT_FALSE(f8.ok());
  EXPECT_EQ(f8.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(f8.status().message().find("compute capability 8.9"), std::string::npos) << f8.status().message();
  EXPECT_FALSE(backend_->supports_fp8_weights(DType::kF32));
  o.quantization = "none";
  EXPECT_TRUE(Model::load(dir_.string(), *backend_, o).ok());
}

// The host recipe of Backend::quantize_weight_fp8 (the reference the CUDA
// kernels are tested against): one scale amax / 448, codes of w * 448 /
// amax rounded to nearest even, the scale after the bytes.
TEST(QuantizeWeightFp8, HostRecipe) {
  auto be = ops::make_cpu_backend(1);
  const int64_t m = 3, k = 16;
  std::vector<float> w(static_cast<size_t>(m * k));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(static_cast<int>(i) - 20);
  w[7] = -0.9f;  // the amax
  std::vector<uint8_t> q(static_cast<size_t>(fp8_weight_bytes(m, k)), 0xaa);
  Tensor wt(w.data(), DType::kF32, {m, k});
  Tensor qt(q.data(), DType::kF8E4M3, {m, k});
  ASSERT_TRUE(be->quantize_weight_fp8(wt, qt).ok());
  float s = 0;
  std::memcpy(&s, q.data() + fp8_scale_offset(m, k), sizeof(s));
  EXPECT_EQ(s, 0.9f / 448.0f);
  const float inv = 448.0f / 0.9f;
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_EQ(q[i], f32_to_f8e4m3(w[i] * inv)) << i;
    EXPECT_NEAR(f8e4m3_to_f32(q[i]) * s, w[i], 0.9f / 16) << i;  // within half a step of the largest binade
  }
  EXPECT_EQ(q[7], 0xfe);  // -448
  // All zeros: scale 1, zero codes. A non-finite weight is an error.
  std::fill(w.begin(), w.end(), 0.0f);
  ASSERT_TRUE(be->quantize_weight_fp8(wt, qt).ok());
  std::memcpy(&s, q.data() + fp8_scale_offset(m, k), sizeof(s));
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(q[0], 0);
  for (float v : {std::nanf(""), INFINITY, -INFINITY}) {
    w[5] = v;
    const Status st = be->quantize_weight_fp8(wt, qt);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << v;
    EXPECT_NE(st.message().find("non-finite weight in row 0"), std::string::npos) << st.message();
  }
}

TEST_F(DummyModelTest, Bf16KvPagesOnTheCpuHalveKvBytes) {
  ModelLoadOptions o;
  o.load_format = "dummy";
  o.kv_cache_dtype = "bfloat16";
  auto m = Model::load(dir_.string(), *backend_, o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->kv_dtype(), DType::kBF16);
  EXPECT_EQ((*m)->kv_bytes_per_token(), static_cast<size_t>(2 * 3 * 2 * 16 * 2));
}

TEST(DummyFill, NormsAreOneMatricesSmallSeedsDiffer) {
  const DummyFill n = dummy_fill("model.layers.0.input_layernorm.weight", 1);
  EXPECT_EQ(n.lo, 1.0f);
  EXPECT_EQ(n.hi, 1.0f);
  const DummyFill w = dummy_fill("model.layers.0.self_attn.q_proj.weight", 1);
  EXPECT_NEAR(w.hi, 0.02f * std::sqrt(3.0f), 1e-6);
  EXPECT_EQ(w.lo, -w.hi);
  EXPECT_NE(w.seed, dummy_fill("model.layers.1.self_attn.q_proj.weight", 1).seed);
  EXPECT_NE(w.seed, dummy_fill("model.layers.0.self_attn.q_proj.weight", 2).seed);
  const DummyFill b = dummy_fill("model.layers.0.self_attn.q_proj.bias", 1);
  EXPECT_LT(b.hi, w.hi);
}

TEST(FillUniform, CpuMatchesTheSharedHashAndIsUniform) {
  auto be = ops::make_cpu_backend(1);
  std::vector<float> v(4096);
  Tensor t(v.data(), DType::kF32, {4096});
  be->fill_uniform(t, 42, -2.0f, 2.0f);
  double mean = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v[i], std::fmaf(4.0f, ops::uniform_hash01(42, i), -2.0f));
    ASSERT_GE(v[i], -2.0f);
    ASSERT_LT(v[i], 2.0f);
    mean += v[i];
  }
  EXPECT_NEAR(mean / v.size(), 0.0, 0.1);
  std::vector<uint16_t> h(16);
  Tensor th(h.data(), DType::kBF16, {16});
  be->fill_uniform(th, 42, -2.0f, 2.0f);
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(h[i], f32_to_bf16(v[i]));
}

TEST(Convert, CpuRoundTripsBetweenFloatDtypes) {
  auto be = ops::make_cpu_backend(1);
  std::vector<float> src = {1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f};
  std::vector<uint16_t> bf(src.size());
  std::vector<float> back(src.size());
  Tensor s(src.data(), DType::kF32, {5}), b(bf.data(), DType::kBF16, {5}), r(back.data(), DType::kF32, {5});
  be->convert(s, b);
  be->convert(b, r);
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(bf[i], f32_to_bf16(src[i]));
    EXPECT_EQ(back[i], bf16_to_f32(bf[i]));
  }
}

}  // namespace
}  // namespace osprey
