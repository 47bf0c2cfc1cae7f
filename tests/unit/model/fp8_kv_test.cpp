// KV pages in FP8 E4M3 (--kv-cache-dtype fp8) on the CPU backend: the
// committed fixtures' logits and greedy tokens against transformers within
// the bounds of 3-mantissa-bit K and V, the checkpoint's per-layer
// self_attn.k_scale / v_scale (and the other tools' names for them) read
// and refused when malformed, the option names, and the page size.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "../loader/fp8_checkpoint.h"
#include "model/model.h"
#include "sequence_runner.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;

std::string fixture_dir(const std::string& name) {
  return std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/" + name;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

Expected<std::unique_ptr<Model>> load(const std::string& dir, ops::Backend& be, const std::string& kv) {
  ModelLoadOptions o;
  o.kv_cache_dtype = kv;
  return Model::load(dir, be, o);
}

// Logit error bounds of FP8 K and V pages (each value within 2^-4 relative
// of itself, scale 1) over these fixtures (hidden 64, 2 layers, random
// weights), measured here (2026-11-28): the worst prompt of each fixture
// at NMSE 0.0023 - 0.0071, greedy divergences at reference top-2 margins up
// to 0.03 of max |logit|. A wrong scale or layout gives NMSE ~1. A greedy
// divergence is accepted where the reference's top-2 margin is at most
// kFp8KvMargin of max |logit|.
constexpr double kFp8KvNmse = 1.5e-2;
constexpr double kFp8KvMargin = 0.05;

class Fp8KvFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8KvFixture, LogitsAndGreedyNearTransformers) {
  const std::string dir = fixture_dir(GetParam());
  auto backend = ops::make_cpu_backend(2);
  auto model = load(dir, *backend, "fp8");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  ASSERT_EQ((*model)->kv_dtype(), DType::kF8E4M3);
  const nlohmann::json expected = read_json(dir + "/expected.json");
  const int vocab = (*model)->config().vocab_size;
  double worst = 0;
  for (const auto& p : expected["prompts"]) {
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    const auto positions = p["logits_positions"].get<std::vector<size_t>>();
    const auto& ref_logits = p["logits"];
    ASSERT_EQ(ref_logits.size(), positions.size());
    testing::SequenceRunner runner(**model, static_cast<int>(ids.size()) + 40);
    const std::vector<float> logits = runner.feed(ids, true);
    ASSERT_EQ(logits.size(), ids.size() * static_cast<size_t>(vocab));
    double err = 0, norm = 0;
    for (size_t i = 0; i < positions.size(); ++i) {
      for (int v = 0; v < vocab; ++v) {
        const double r = ref_logits[i][static_cast<size_t>(v)].get<double>();
        const double d = logits[positions[i] * static_cast<size_t>(vocab) + static_cast<size_t>(v)] - r;
        err += d * d;
        norm += r * r;
      }
    }
    const double nmse = err / std::max(norm, 1e-30);
    worst = std::max(worst, nmse);
    EXPECT_LE(nmse, kFp8KvNmse) << GetParam() << " prompt of " << ids.size() << " tokens";
    if (ids.size() > 1) EXPECT_GT(nmse, 0.0) << "FP8 pages round K and V: the logits cannot be exact";
    // Greedy: the first divergence from the reference must sit at a near tie
    // of the reference's logits (its top-2 margin at that step).
    const std::vector<int32_t> ref_greedy = p["greedy"].get<std::vector<int32_t>>();
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    const double max_abs = p["greedy_logits_max_abs"].get<double>();
    testing::SequenceRunner gen(**model, static_cast<int>(ids.size() + ref_greedy.size()) + 1);
    const std::vector<int32_t> got = gen.greedy(ids, static_cast<int>(ref_greedy.size()));
    ASSERT_EQ(got.size(), ref_greedy.size());
    size_t k = 0;
    while (k < got.size() && got[k] == ref_greedy[k]) ++k;
    if (k < got.size()) {
      EXPECT_LE(margins[k], kFp8KvMargin * max_abs)
          << GetParam() << ": greedy diverges at token " << k << " of " << got.size() << " without a near tie";
      std::printf("%s prompt of %zu tokens: greedy diverges at token %zu (reference margin %.3g of max |logit|)\n",
                  GetParam().c_str(), ids.size(), k, margins[k] / max_abs);
    }
  }
  std::printf("%s: fp8 KV logits NMSE <= %.3g\n", GetParam().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8KvFixture,
                         ::testing::Values("llama", "llama_gqa", "llama_mqa", "mistral", "qwen2", "qwen3",
                                           "llama_bf16"));

TEST(Fp8Kv, OptionNamesAndPageBytes) {
  auto backend = ops::make_cpu_backend(1);
  const std::string dir = fixture_dir("llama_gqa");
  auto f32 = load(dir, *backend, "auto");
  ASSERT_TRUE(f32.ok()) << f32.status().to_string();
  for (const char* name : {"fp8", "fp8_e4m3"}) {
    auto m = load(dir, *backend, name);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().to_string();
    EXPECT_EQ((*m)->kv_dtype(), DType::kF8E4M3);
    EXPECT_EQ((*m)->kv_bytes_per_token() * 4, (*f32)->kv_bytes_per_token());
    // No scales in the fixture: 1.
    EXPECT_EQ((*m)->kv_k_scale(0), 1.0f);
    EXPECT_EQ((*m)->kv_v_scale(1), 1.0f);
  }
  auto bad = load(dir, *backend, "int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("fp8"), std::string::npos) << bad.status().message();
}

// A copy of the llama fixture with per-layer KV scales added as FP8
// quantisation tools write them (self_attn.k_scale / v_scale, F32 of shape
// []), or a malformed one; `extra` edits the list before writing.
fs::path with_kv_scales(const std::string& tag, const std::function<void(std::vector<testing::StEntry>&)>& extra) {
  const fs::path src = fixture_dir("llama");
  const fs::path dir = fs::temp_directory_path() / ("osprey_kv_scales_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.path().filename() != "model.safetensors") fs::copy(e.path(), dir / e.path().filename());
  }
  auto w = load_weights(src.string());
  EXPECT_TRUE(w.ok());
  std::vector<testing::StEntry> entries;
  for (const auto& [name, t] : w->tensors) {
    const auto* b = static_cast<const uint8_t*>(t.data());
    entries.push_back({name, t.dtype(), std::vector<int64_t>(t.shape(), t.shape() + t.ndim()),
                       std::vector<uint8_t>(b, b + t.nbytes())});
  }
  extra(entries);
  testing::write_safetensors(dir / "model.safetensors", entries);
  return dir;
}

TEST(Fp8Kv, CheckpointScalesAreReadAndUsed) {
  const fs::path dir = with_kv_scales("ok", [](std::vector<testing::StEntry>& e) {
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      e.push_back(
          {p + "k_scale", DType::kF32, {}, testing::bytes_of(std::vector<float>{0.125f * static_cast<float>(l + 1)})});
      e.push_back({p + "v_scale", DType::kF32, {1}, testing::bytes_of(std::vector<float>{3.0f})});
    }
  });
  auto backend = ops::make_cpu_backend(2);
  auto m = load(dir.string(), *backend, "fp8");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->kv_k_scale(0), 0.125f);
  EXPECT_EQ((*m)->kv_k_scale(1), 0.25f);
  EXPECT_EQ((*m)->kv_v_scale(0), 3.0f);
  EXPECT_EQ((*m)->kv_scale_layers(), 2);  // what the start-up log reports
  EXPECT_EQ((*m)->kv_scale_name(), "k_scale");
  KvCache kv = (*m)->allocate_kv(2, 16);
  EXPECT_EQ(kv.layers[1].k_scale, 0.25f);
  EXPECT_EQ(kv.layers[0].v_scale, 3.0f);
  (*m)->free_kv(kv);
  // The scales change what the pages hold: V values (|v| well under 1) / 3
  // fall into E4M3's coarser subnormal steps, so the logits move; still near
  // the model without them.
  auto plain = load(fixture_dir("llama"), *backend, "fp8");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->kv_scale_layers(), 0);  // the start-up log's warning
  EXPECT_EQ((*plain)->kv_scale_name(), "");
  const std::vector<int32_t> ids = {1, 5, 9, 14, 3, 7, 21, 2, 8, 30, 4};
  testing::SequenceRunner a(**m, 16), b(**plain, 16);
  const auto la = a.feed(ids, false), lb = b.feed(ids, false);
  EXPECT_NE(la, lb);
  double err = 0, norm = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    err += (la[i] - lb[i]) * (la[i] - lb[i]);
    norm += lb[i] * lb[i];
  }
  EXPECT_LT(err / norm, 5e-2);
  // Other KV dtypes ignore the scales.
  auto f32 = load(dir.string(), *backend, "auto");
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ((*f32)->kv_k_scale(0), 1.0f);
  EXPECT_EQ((*f32)->kv_scale_layers(), -1);
  fs::remove_all(dir);
}

// The other tools' names for the same scales (model.cpp, read_kv_scale):
// ModelOpt's k_proj.k_scale / v_proj.v_scale, Quark's k_proj.output_scale /
// v_proj.output_scale, early AutoFP8's one kv_scale for both; and the
// current name first where a file has two.
TEST(Fp8Kv, OtherToolsScaleNamesAreRead) {
  auto backend = ops::make_cpu_backend(1);
  auto scalar = [](float x) { return testing::bytes_of(std::vector<float>{x}); };
  struct Layout {
    const char* tag;
    const char* k;  // after "model.layers.N.self_attn."
    const char* v;  // nullptr: k's tensor is both
    float want_k, want_v;
  };
  for (const Layout& lay : {Layout{"modelopt", "k_proj.k_scale", "v_proj.v_scale", 0.5f, 2.0f},
                            Layout{"quark", "k_proj.output_scale", "v_proj.output_scale", 0.5f, 2.0f},
                            Layout{"autofp8", "kv_scale", nullptr, 0.5f, 0.5f}}) {
    const fs::path dir = with_kv_scales(lay.tag, [&](std::vector<testing::StEntry>& e) {
      for (int l = 0; l < 2; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
        e.push_back({p + lay.k, DType::kF32, {}, scalar(0.5f)});
        if (lay.v != nullptr) e.push_back({p + lay.v, DType::kBF16, {1}, std::vector<uint8_t>{0x00, 0x40}});  // 2.0
      }
    });
    auto m = load(dir.string(), *backend, "fp8");
    ASSERT_TRUE(m.ok()) << lay.tag << ": " << m.status().to_string();
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ((*m)->kv_k_scale(l), lay.want_k) << lay.tag;
      EXPECT_EQ((*m)->kv_v_scale(l), lay.want_v) << lay.tag;
    }
    EXPECT_EQ((*m)->kv_scale_layers(), 2) << lay.tag;
    EXPECT_EQ((*m)->kv_scale_name(), lay.k) << lay.tag;
    fs::remove_all(dir);
  }
  // Both names in one file: self_attn.k_scale wins; a malformed other one is
  // still refused where it is the one read.
  const fs::path dir = with_kv_scales("both", [&](std::vector<testing::StEntry>& e) {
    e.push_back({"model.layers.0.self_attn.k_scale", DType::kF32, {}, scalar(0.25f)});
    e.push_back({"model.layers.0.self_attn.kv_scale", DType::kF32, {}, scalar(4.0f)});
    e.push_back({"model.layers.1.self_attn.v_proj.v_scale", DType::kF32, {}, scalar(-1.0f)});
  });
  auto m = load(dir.string(), *backend, "fp8");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model.layers.1.self_attn.v_proj.v_scale"), std::string::npos)
      << m.status().message();
  fs::remove_all(dir);
  const fs::path dir2 = with_kv_scales("both2", [&](std::vector<testing::StEntry>& e) {
    e.push_back({"model.layers.0.self_attn.k_scale", DType::kF32, {}, scalar(0.25f)});
    e.push_back({"model.layers.0.self_attn.kv_scale", DType::kF32, {}, scalar(4.0f)});
  });
  auto m2 = load(dir2.string(), *backend, "fp8");
  ASSERT_TRUE(m2.ok()) << m2.status().to_string();
  EXPECT_EQ((*m2)->kv_k_scale(0), 0.25f);
  EXPECT_EQ((*m2)->kv_v_scale(0), 4.0f);  // V's only name here is kv_scale
  EXPECT_EQ((*m2)->kv_k_scale(1), 1.0f);
  EXPECT_EQ((*m2)->kv_scale_layers(), 1);
  fs::remove_all(dir2);
}

TEST(Fp8Kv, MalformedCheckpointScalesAreRefused) {
  auto backend = ops::make_cpu_backend(1);
  struct Bad {
    const char* tag;
    testing::StEntry entry;
    const char* want;
  };
  for (const Bad& bad :
       {Bad{"two", {"model.layers.0.self_attn.k_scale", DType::kF32, {2}, std::vector<uint8_t>(8, 0)}, "one float"},
        Bad{"neg",
            {"model.layers.1.self_attn.v_scale", DType::kF32, {}, testing::bytes_of(std::vector<float>{-1.0f})},
            "positive"},
        Bad{"zero",
            {"model.layers.0.self_attn.v_scale", DType::kF32, {}, testing::bytes_of(std::vector<float>{0.0f})},
            "positive"},
        Bad{"nan",
            {"model.layers.0.self_attn.k_scale", DType::kF32, {}, testing::bytes_of(std::vector<float>{NAN})},
            "positive"},
        Bad{"int", {"model.layers.0.self_attn.k_scale", DType::kI32, {}, std::vector<uint8_t>(4, 1)}, "one float"}}) {
    const fs::path dir = with_kv_scales(bad.tag, [&](std::vector<testing::StEntry>& e) { e.push_back(bad.entry); });
    auto m = load(dir.string(), *backend, "fp8");
    ASSERT_FALSE(m.ok()) << bad.tag;
    EXPECT_EQ(m.status().code(), StatusCode::kCorrupt) << bad.tag;
    EXPECT_NE(m.status().message().find(bad.entry.name), std::string::npos) << m.status().message();
    EXPECT_NE(m.status().message().find(bad.want), std::string::npos) << m.status().message();
    // A model without FP8 pages does not read them.
    EXPECT_TRUE(load(dir.string(), *backend, "auto").ok()) << bad.tag;
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace osprey
