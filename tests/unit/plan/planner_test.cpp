// osprey plan: the GPU table, the memory model and the roofline against
// hand-computed figures (docs/plan.md works the same formulas).
#include <gtest/gtest.h>

#include <cmath>

#include "osprey/model_info.h"
#include "plan/gpu_table.h"
#include "plan/plan_report.h"
#include "plan/planner.h"

namespace osprey::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

ModelShape bundled(const char* name) {
  auto s = model_shape(name);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return *s;
}

GpuSpec gpu(const char* key) {
  auto g = GpuTable::builtin().find(key);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return *g;
}

PlanResult plan_of(const ModelShape& m, const GpuSpec& g, const PlanOptions& o) {
  auto p = make_plan(m, g, o);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return *p;
}

// A toy model small enough to work by hand: 2 layers, hidden 64, 4 heads of
// 16, 2 KV heads, ffn 128, vocab 1000, tied embeddings.
// Per layer 64*64 + 2*64*32 + 64*64 + 3*64*128 + 2*64 = 36,992 parameters.
ModelShape toy() {
  ModelShape m;
  m.source = "toy";
  m.architecture = "llama";
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 16;
  m.intermediate_size = 128;
  m.vocab_size = 1000;
  m.max_position_embeddings = 4096;
  m.tie_word_embeddings = true;
  m.num_parameters = 2 * 36992 + 64000 + 64;  // 138,048
  return m;
}

// 1 GiB, 100 GB/s, 1 TFLOP/s, link 100 GB/s with no latency.
GpuSpec toy_gpu() {
  GpuSpec g;
  g.key = g.name = "toy";
  g.memory_gib = 1;
  g.bandwidth_gbs = 100;
  g.tflops_16 = 1;
  g.link_gbs = 100;
  return g;
}

PlanOptions toy_options() {
  PlanOptions o;
  o.context = 100;
  o.prompt_len = 100;
  o.batches = {1};
  o.overhead_gib = 0;
  o.max_batched_tokens = 16;
  o.max_num_seqs = 16;
  return o;
}

TEST(GpuTable, EveryEntryHasPositiveFigures) {
  const GpuTable t = GpuTable::builtin();
  ASSERT_GE(t.entries().size(), 14u);
  for (const GpuSpec& g : t.entries()) {
    SCOPED_TRACE(g.key);
    EXPECT_TRUE(validate_gpu(g).ok());
    EXPECT_GT(g.memory_gib, 0);
    EXPECT_GT(g.bandwidth_gbs, 0);
    EXPECT_GT(g.tflops_16, 0);
    EXPECT_GT(g.link_gbs, 0);
    EXPECT_GT(g.link_latency_us, 0);
    EXPECT_FALSE(g.name.empty());
    // FP8 and INT8, where present, run at least at the 16-bit rate.
    if (g.tflops_fp8 > 0) {
      EXPECT_GE(g.tflops_fp8, g.tflops_16);
    }
    if (g.tops_int8 > 0) {
      EXPECT_GE(g.tops_int8, g.tflops_16);
    }
  }
  for (const char* key : {"rtx-4090", "t4", "v100-16gb", "v100-32gb", "a30", "a10g", "l4", "l40s", "a100-40gb",
                          "a100-80gb", "h100-pcie", "h100-sxm", "h200", "b200"}) {
    EXPECT_TRUE(t.find(key).ok()) << key;
  }
}

TEST(GpuTable, FindsAliasesAndRejectsUnknown) {
  const GpuTable t = GpuTable::builtin();
  EXPECT_EQ(t.find("H100 SXM")->key, "h100-sxm");
  EXPECT_EQ(t.find("h100")->key, "h100-sxm");
  EXPECT_EQ(t.find("A100_80GB")->key, "a100-80gb");
  EXPECT_EQ(t.find("4090")->key, "rtx-4090");
  auto bad = t.find("h900");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("h100-sxm"), std::string::npos);  // lists the known keys
  EXPECT_EQ(t.find("h200")->memory_gib, 141);
  EXPECT_EQ(t.find("t4")->tflops_fp8, 0);
}

TEST(GpuTable, MergesJsonAndValidates) {
  GpuTable t = GpuTable::builtin();
  ASSERT_TRUE(t.merge_json(R"([{"key": "h100-sxm", "bandwidth_gbs": 3000},
                               {"key": "mi300x", "name": "MI300X", "memory_gb": 192, "bandwidth_gbs": 5300,
                                "tflops_bf16": 1307, "tflops_fp8": 2615, "link_gbs": 448}])",
                           "test")
                  .ok());
  EXPECT_EQ(t.find("h100-sxm")->bandwidth_gbs, 3000);
  EXPECT_EQ(t.find("h100-sxm")->memory_gib, 80);  // untouched fields kept
  EXPECT_EQ(t.find("mi300x")->memory_gib, 192);
  EXPECT_FALSE(t.merge_json("not json", "x").ok());
  EXPECT_FALSE(t.merge_json(R"({"key": "z", "memory_gb": -1, "bandwidth_gbs": 1, "tflops_bf16": 1})", "x").ok());
  EXPECT_FALSE(t.merge_json(R"({"key": "z", "memory_gb": 1, "bandwidth_gbs": 1})", "x").ok());  // no rate
  EXPECT_FALSE(
      t.merge_json(R"({"key": "z", "memory_gb": 1, "bandwidth_gbs": 1, "tflops_bf16": 1, "oops": 1})", "x").ok());
  EXPECT_FALSE(t.merge_json(R"({"memory_gb": 1})", "x").ok());  // no key
  EXPECT_FALSE(t.find("z").ok());                               // failed merges leave the table unchanged
}

TEST(GpuTable, OverridesAndCustom) {
  GpuOverrides o;
  EXPECT_FALSE(apply_overrides(*GpuTable::builtin().find("custom"), o).ok());  // custom needs figures
  o.memory_gib = 24;
  o.bandwidth_gbs = 40;
  o.tflops_16 = 0.19;
  auto g = apply_overrides(*GpuTable::builtin().find("custom"), o);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->bandwidth_gbs, 40);
  o.bandwidth_gbs = -5;
  EXPECT_FALSE(apply_overrides(*GpuTable::builtin().find("custom"), o).ok());
  o.bandwidth_gbs = std::nan("");
  EXPECT_FALSE(apply_overrides(*GpuTable::builtin().find("custom"), o).ok());
}

TEST(ModelShape, BundledParameterCounts) {
  EXPECT_EQ(bundled("llama-3-8b").num_parameters, 8030261248);
  EXPECT_EQ(bundled("llama-3-70b").num_parameters, 70553706496);
  EXPECT_EQ(bundled("qwen2.5-7b").num_parameters, 7615616512);  // with q/k/v biases
  EXPECT_EQ(bundled("mistral-7b").num_parameters, 7241732096);
  EXPECT_EQ(bundled("Mistral-7B").sliding_window, 4096);
  EXPECT_EQ(bundled("smollm2-135m").num_parameters, 134515008);
  EXPECT_FALSE(model_shape("/nonexistent/model").ok());
}

// Weights and KV per token, bf16, against hand-computed values.
TEST(Plan, WeightsAndKvPerToken) {
  PlanOptions o;
  const GpuSpec h100 = gpu("h100-sxm");
  struct Case {
    const char* model;
    double weight_bytes;  // 2 x parameters
    double kv_per_token;  // layers x 2 x kv_heads x head_dim x 2
  };
  const Case cases[] = {
      {"llama-3-8b", 2.0 * 8030261248, 32 * 2 * 8 * 128 * 2},
      {"qwen2.5-7b", 2.0 * 7615616512, 28 * 2 * 4 * 128 * 2},
      {"mistral-7b", 2.0 * 7241732096, 32 * 2 * 8 * 128 * 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    PlanResult p = plan_of(bundled(c.model), h100, o);
    EXPECT_DOUBLE_EQ(p.weight_bytes_total, c.weight_bytes);
    EXPECT_DOUBLE_EQ(p.kv_bytes_per_token_total, c.kv_per_token);
    EXPECT_DOUBLE_EQ(p.kv_bytes_per_token_per_gpu, c.kv_per_token);
    EXPECT_TRUE(p.fits);
  }
  // Llama-3-8B: the untied embedding (128256 x 4096 x 2 B) is not streamed.
  PlanResult p = plan_of(bundled("llama-3-8b"), h100, o);
  EXPECT_DOUBLE_EQ(p.weight_read_bytes_per_gpu, 2.0 * 8030261248 - 2.0 * 128256 * 4096);
  EXPECT_EQ(p.context, 4096);
  // Mistral's 4096-token window caps the KV of a longer context.
  o.context = 8192;
  PlanResult m = plan_of(bundled("mistral-7b"), h100, o);
  EXPECT_EQ(m.context_kv, 4096);
  // Llama-3-70B does not fit one H100 in bf16; fp8 on two does.
  o.context = 0;
  PlanResult big = plan_of(bundled("llama-3-70b"), h100, o);
  EXPECT_DOUBLE_EQ(big.weight_bytes_total, 2.0 * 70553706496);
  EXPECT_DOUBLE_EQ(big.kv_bytes_per_token_total, 80 * 2 * 8 * 128 * 2);
  EXPECT_FALSE(big.fits);
  EXPECT_NE(big.fit_problem.find("exceed"), std::string::npos);
}

TEST(Plan, QuantisedFormats) {
  PlanOptions o;
  o.dtype = "int4";  // layers 4 bits, embedding and lm_head stay bf16
  PlanResult p = plan_of(bundled("llama-3-8b"), gpu("h100-sxm"), o);
  const double layers = 8030261248.0 - 2.0 * 525336576 - 4096;
  EXPECT_DOUBLE_EQ(p.params_layers, layers);
  EXPECT_DOUBLE_EQ(p.weight_bytes_total, layers * 0.5 + 2.0 * 525336576 * 2 + 4096 * 2);
  o.dtype = "q4_1";  // 5 bits (20-byte blocks of 32), head q8_0 at 8.5 bits
  p = plan_of(bundled("smollm2-135m"), gpu("h100-sxm"), o);
  EXPECT_DOUBLE_EQ(p.layer_bits, 5.0);
  EXPECT_DOUBLE_EQ(p.head_bits, 8.5);
  o.weight_bits = 4.5;
  p = plan_of(bundled("smollm2-135m"), gpu("h100-sxm"), o);
  EXPECT_DOUBLE_EQ(p.layer_bits, 4.5);
  o.weight_bits = 0;
  EXPECT_FALSE(make_plan(bundled("smollm2-135m"), gpu("h100-sxm"), o).ok());
  o.weight_bits.reset();
  o.dtype = "fp8";
  o.kv_dtype = "fp8";
  p = plan_of(bundled("llama-3-8b"), gpu("h100-sxm"), o);
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token_total, 32 * 2 * 8 * 128 * 1);
  o.dtype = "file";  // a bundled config holds no weights
  EXPECT_FALSE(make_plan(bundled("llama-3-8b"), gpu("h100-sxm"), o).ok());
}

// The toy model's memory budget and roofline, worked by hand.
TEST(Plan, HandWorkedToy) {
  PlanResult p = plan_of(toy(), toy_gpu(), toy_options());
  EXPECT_EQ(p.params_layers, 73984);
  // bf16: (73,984 + 64,000 + 64) x 2; tied, so all of it is read per step.
  EXPECT_DOUBLE_EQ(p.weight_bytes_total, 276096);
  EXPECT_DOUBLE_EQ(p.weight_read_bytes_per_gpu, 276096);
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token_total, 2 * 2 * 2 * 16 * 2);  // 256 B
  // Activations: 16 tokens x (3 x 128 + 4 x 64 + 64 + 2 x 32) x 2 B + 16 x 1000 x 4 B.
  EXPECT_DOUBLE_EQ(p.activation_bytes, 24576 + 64000);
  EXPECT_DOUBLE_EQ(p.kv_budget_bytes, 0.9 * kGiB - 276096 - 88576);
  EXPECT_EQ(p.kv_tokens, 235840 * 16);  // floor(budget / (16 x 256)) pages
  EXPECT_EQ(p.max_batch, 235840 / 7);   // 100 tokens: 7 pages per sequence

  // Prefill of 100 tokens: matmul 2 x 73,984 x 100 + 2 x 64,000 (last token's
  // logits), attention 4 x 2 x 64 x 5050 = 17,510,400 FLOP -> 17.5104 us at
  // 1 TFLOP/s; bytes 276,096 + 100 x 256 -> 3.01696 us: compute-bound.
  EXPECT_DOUBLE_EQ(p.prefill_flops, 17510400);
  EXPECT_NEAR(p.ttft_sol.time_s, 17.5104e-6, 1e-15);
  EXPECT_NEAR(p.ttft_sol.memory_s, 3.01696e-6, 1e-15);
  EXPECT_TRUE(p.ttft_sol.compute_bound);
  EXPECT_NEAR(p.ttft_expected.time_s, 17.5104e-6 / 0.6, 1e-15);

  // Decode, batch 1, 100 tokens of context: 2 x 137,984 + 4 x 2 x 64 x 100 =
  // 327,168 FLOP (0.327 us); bytes 276,096 + 25,600 = 301,696 (3.01696 us).
  ASSERT_GE(p.decode.size(), 1u);
  const DecodePoint& d = p.decode[0];
  EXPECT_EQ(d.batch, 1);
  EXPECT_DOUBLE_EQ(d.flops, 327168);
  EXPECT_DOUBLE_EQ(d.bytes, 301696);
  EXPECT_FALSE(d.sol.compute_bound);
  EXPECT_NEAR(d.sol.time_s, 3.01696e-6, 1e-15);
  EXPECT_NEAR(d.expected.time_s, 3.01696e-6 / 0.8, 1e-15);
  EXPECT_NEAR(d.tokens_per_s_per_gpu_sol, 1 / 3.01696e-6, 1e-3);
  // The largest batch is appended to the list.
  EXPECT_EQ(p.decode.back().batch, p.max_batch);

  // Crossover: 2,760.96 ns of weights / (327.168 - 256 ns per sequence);
  // weights only: 2,760.96 / 275.968.
  ASSERT_TRUE(p.crossover_sol.has_value());
  EXPECT_NEAR(*p.crossover_sol, 2760.96 / 71.168, 1e-9);
  EXPECT_NEAR(*p.crossover_weights_only_sol, 2760.96 / 275.968, 1e-9);
  ASSERT_TRUE(p.crossover_expected.has_value());
  EXPECT_NEAR(*p.crossover_expected, (2760.96 / 0.8) / (327.168 / 0.6 - 256 / 0.8), 1e-9);
  // Below the crossover memory-bound, above it compute-bound.
  PlanOptions o = toy_options();
  o.batches = {38, 39};
  PlanResult q = plan_of(toy(), toy_gpu(), o);
  EXPECT_FALSE(q.decode[0].sol.compute_bound);
  EXPECT_TRUE(q.decode[1].sol.compute_bound);

  // Price: $3.6/hour = $0.001/s; tokens/s = 1/3.01696e-6.
  o = toy_options();
  o.price_per_hour = 3.6;
  q = plan_of(toy(), toy_gpu(), o);
  EXPECT_NEAR(q.decode[0].cost_per_mtok_sol, 0.001 * 3.01696e-6 * 1e6, 1e-12);
}

TEST(Plan, NoCrossoverWhenKvDominates) {
  PlanOptions o = toy_options();
  o.context = 4000;  // 4000 x 256 B per sequence outweighs its FLOPs
  PlanResult p = plan_of(toy(), toy_gpu(), o);
  EXPECT_FALSE(p.crossover_sol.has_value());
  EXPECT_TRUE(p.crossover_weights_only_sol.has_value());
}

TEST(Plan, TensorParallelDivision) {
  PlanOptions o = toy_options();
  o.tp = 2;
  PlanResult p = plan_of(toy(), toy_gpu(), o);
  EXPECT_DOUBLE_EQ(p.weight_bytes_per_gpu, 276096 / 2.0);
  EXPECT_EQ(p.kv_heads_per_gpu, 1);
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token_per_gpu, 128);
  // Two ring all-reduces per layer of 1 x 64 x 2 B: 2 x 2 x (2 x 1/2 x 128 B / 100 GB/s).
  EXPECT_NEAR(p.decode[0].sol.comm_s, 4 * 1.28e-9, 1e-18);
  EXPECT_NEAR(p.decode[0].sol.time_s, 301696 / 2.0 / 1e11 + 4 * 1.28e-9, 1e-15);
  EXPECT_NEAR(p.decode[0].tokens_per_s_per_gpu_sol, 1 / p.decode[0].sol.time_s / 2, 1e-6);

  // tp 4 > 2 KV heads: one replicated head per GPU.
  o.tp = 4;
  p = plan_of(toy(), toy_gpu(), o);
  EXPECT_EQ(p.kv_heads_per_gpu, 1);
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token_per_gpu, 128);
  EXPECT_FALSE(p.notes.empty());

  // Llama-3-70B on 4 x H100: weights / 4, 2 KV heads per GPU.
  PlanOptions big;
  big.tp = 4;
  PlanResult l = plan_of(bundled("llama-3-70b"), gpu("h100-sxm"), big);
  EXPECT_DOUBLE_EQ(l.weight_bytes_per_gpu, 2.0 * 70553706496 / 4);
  EXPECT_DOUBLE_EQ(l.kv_bytes_per_token_per_gpu, 80 * 2 * 2 * 128 * 2);
  EXPECT_TRUE(l.fits);
  EXPECT_GT(l.decode[0].sol.comm_s, 0);

  o.tp = 3;  // does not divide 4 heads
  EXPECT_FALSE(make_plan(toy(), toy_gpu(), o).ok());
  o.tp = 2;
  GpuSpec no_link = toy_gpu();
  no_link.link_gbs = 0;
  EXPECT_FALSE(make_plan(toy(), no_link, o).ok());
}

TEST(Plan, BadInputIsAnError) {
  const ModelShape m = bundled("llama-3-8b");
  PlanOptions o;
  o.dtype = "fp8";
  auto t4 = make_plan(m, gpu("t4"), o);
  ASSERT_FALSE(t4.ok());
  EXPECT_EQ(t4.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(t4.status().message().find("FP8"), std::string::npos);
  o.dtype = "int8";
  EXPECT_FALSE(make_plan(m, gpu("v100-32gb"), o).ok());
  EXPECT_TRUE(make_plan(m, gpu("t4"), o).ok());

  auto bad = [&](auto mutate) {
    PlanOptions x;
    mutate(x);
    return !make_plan(m, gpu("h100-sxm"), x).ok();
  };
  EXPECT_TRUE(bad([](PlanOptions& x) { x.tp = 0; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.tp = -2; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.context = -1; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.context = 8193; }));  // beyond Llama-3-8B's 8192
  EXPECT_TRUE(bad([](PlanOptions& x) { x.prompt_len = -1; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.batches = {4, -1}; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.batches.clear(); }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.price_per_hour = -1; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.gpu_memory_utilization = 1.5; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.gpu_memory_utilization = 0; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.mbu = -0.1; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.mfu = std::nan(""); }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.dtype = "int3"; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.kv_dtype = "int4"; }));
  EXPECT_TRUE(bad([](PlanOptions& x) { x.overhead_gib = -1; }));
  EXPECT_FALSE(bad([](PlanOptions& x) { x.dtype = "FP8"; }));  // case-insensitive
}

TEST(Plan, CompareAndBatchParsing) {
  auto c = parse_compare("gpu=h100-sxm,a100-80gb, l40s");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->field, "gpu");
  EXPECT_EQ(c->values, (std::vector<std::string>{"h100-sxm", "a100-80gb", "l40s"}));
  c = parse_compare("dtype=bf16,fp8,int4");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->values.size(), 3u);
  EXPECT_EQ(parse_compare("kv_dtype=fp8")->field, "kv-dtype");
  EXPECT_FALSE(parse_compare("gpu").ok());
  EXPECT_FALSE(parse_compare("colour=red").ok());
  EXPECT_FALSE(parse_compare("gpu=").ok());
  EXPECT_FALSE(parse_compare("gpu=a,,b").ok());

  auto b = parse_batches("1,8,32");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int64_t>{1, 8, 32}));
  EXPECT_FALSE(parse_batches("").ok());
  EXPECT_FALSE(parse_batches("1,-8").ok());
  EXPECT_FALSE(parse_batches("0").ok());
  EXPECT_FALSE(parse_batches("1,x").ok());
  EXPECT_FALSE(parse_batches("99999999999999999999").ok());
}

TEST(Plan, ReportsRender) {
  PlanOptions o;
  o.price_per_hour = 2.5;
  PlanResult p = plan_of(bundled("llama-3-8b"), gpu("h100-sxm"), o);
  const std::string text = format_text(p);
  EXPECT_NE(text.find("TTFT"), std::string::npos);
  EXPECT_NE(text.find("crossover"), std::string::npos);
  const std::string json = format_json(p);
  EXPECT_NE(json.find("\"kv_bytes_per_token_total\": 131072"), std::string::npos);
  std::vector<CompareColumn> cols(2);
  cols[0].value = "bf16";
  cols[0].plan = p;
  cols[1].value = "fp8";
  cols[1].error = "no fp8";
  const std::string cmp = format_compare_text("dtype", cols);
  EXPECT_NE(cmp.find("no fp8"), std::string::npos);
  EXPECT_NE(format_compare_json("dtype", cols).find("\"error\": \"no fp8\""), std::string::npos);
}

}  // namespace
}  // namespace osprey::plan
