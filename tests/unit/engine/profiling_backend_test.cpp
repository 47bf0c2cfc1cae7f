// ops::ProfilingBackend (src/ops/profiling_backend.h): every Backend virtual
// reaches the inner backend with its arguments and results; ops are timed
// only inside a step, not during capture, not when disabled; the bytes and
// FLOPs formulas on hand-worked examples; and, over the CPU backend and a
// fixture model, one known step's groups and call counts and logits equal to
// the unwrapped backend's.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "model/model.h"
#include "ops/backend.h"
#include "ops/profiling_backend.h"

namespace osprey {
namespace {

using ops::ProfileGroup;
using ops::ProfilingBackend;

// Counts each virtual called; timer marks are a counter, so that the time
// from mark a to mark b is exactly (b - a) ms.
class RecordingBackend final : public ops::Backend {
 public:
  std::map<std::string, int> calls;
  uint64_t next_mark = 100;
  bool lose_marks = false;
  char memory[64] = {};

  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "recording"; }
  void* alloc(size_t) override {
    hit("alloc");
    return memory;
  }
  void free(void*) override { hit("free"); }
  void copy_to_device(void*, const void*, size_t) override { hit("copy_to_device"); }
  void copy_to_host(void*, const void*, size_t) override { hit("copy_to_host"); }
  void synchronize() override { hit("synchronize"); }
  void embedding(const Tensor&, const int32_t*, Tensor&) override { hit("embedding"); }
  void rms_norm(const Tensor&, const Tensor&, float, Tensor&) override { hit("rms_norm"); }
  void add_rms_norm(Tensor&, const Tensor&, const Tensor&, float, Tensor&) override { hit("add_rms_norm"); }
  void add(Tensor&, const Tensor&) override { hit("add"); }
  void matmul(const Tensor&, const Tensor&, const Tensor&, Tensor&) override { hit("matmul"); }
  void head_rms_norm(Tensor&, const Tensor&, float) override { hit("head_rms_norm"); }
  void rope(Tensor&, Tensor&, const int32_t*, const ops::RopeTable&) override { hit("rope"); }
  void silu_mul(const Tensor&, Tensor&) override { hit("silu_mul"); }
  void kv_write(const Tensor&, const Tensor&, const ops::AttentionBatch&, ops::LayerKv&) override { hit("kv_write"); }
  void paged_attention(const Tensor&, const ops::LayerKv&, const ops::AttentionBatch&, float, int, Tensor&) override {
    hit("paged_attention");
  }
  void gather_rows(const Tensor&, const int32_t*, int, Tensor&) override { hit("gather_rows"); }
  void fill_rows_from(const Tensor&, const int32_t*, int, Tensor&) override { hit("fill_rows_from"); }
  DType default_activation_dtype() const override { return DType::kBF16; }
  bool supports_activation_dtype(DType t) const override { return t == DType::kF16; }
  void convert(const Tensor&, Tensor&) override { hit("convert"); }
  void fill_uniform(Tensor&, uint64_t, float, float) override { hit("fill_uniform"); }
  void qkv_rope_kv_write(const Tensor&, const Tensor&, const Tensor&, float, const ops::RopeTable&,
                         const ops::AttentionBatch&, ops::LayerKv&, Tensor&) override {
    hit("qkv_rope_kv_write");
  }
  bool folds_norms(DType t) const override { return t == DType::kBF16; }
  void scale_columns(Tensor&, const Tensor&) override { hit("scale_columns"); }
  void rms_scaled_qkv_rope_kv_write(const Tensor&, float, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float,
                                    const ops::RopeTable&, const ops::AttentionBatch&, ops::LayerKv&,
                                    Tensor&) override {
    hit("rms_scaled_qkv_rope_kv_write");
  }
  void rms_scaled_silu_mul(const Tensor&, float, const Tensor&, Tensor&) override { hit("rms_scaled_silu_mul"); }
  void* alloc_host(size_t) override {
    hit("alloc_host");
    return memory + 8;
  }
  void free_host(void*) override { hit("free_host"); }
  void copy_to_device_async(void*, const void*, size_t) override { hit("copy_to_device_async"); }
  void copy_to_host_async(void*, const void*, size_t) override { hit("copy_to_host_async"); }
  void copy_device_to_device(void*, const void*, size_t) override { hit("copy_device_to_device"); }
  bool memory_info(size_t& f, size_t& t) override {
    hit("memory_info");
    f = 3;
    t = 7;
    return true;
  }
  bool supports_device_sampling() const override { return true; }
  void sample(const SampleBatch&) override { hit("sample"); }
  bool supports_graphs() const override { return true; }
  void begin_capture() override { hit("begin_capture"); }
  std::unique_ptr<Graph> end_capture() override {
    hit("end_capture");
    return nullptr;
  }
  uint64_t timer_mark() override {
    hit("timer_mark");
    return next_mark++;
  }
  double timer_elapsed_ms(uint64_t a, uint64_t b) override {
    hit("timer_elapsed_ms");
    return lose_marks ? -1.0 : static_cast<double>(b - a);
  }

 private:
  void hit(const char* what) { ++calls[what]; }
};

const ProfileGroup* find(const ops::ProfileSnapshot& s, const std::string& phase, const std::string& group) {
  for (const ProfileGroup& g : s.groups)
    if (g.phase == phase && g.group == group) return &g;
  return nullptr;
}

// One op of every kind through the decorator.
void call_every_op(ops::Backend& b) {
  float buf[64] = {};
  Tensor t(buf, DType::kF32, {2, 4});
  Tensor w(buf, DType::kF32, {4});
  Tensor q3(buf, DType::kF32, {2, 1, 4});
  ops::LayerKv kv;
  ops::AttentionBatch ab;
  ops::RopeTable rt;
  int32_t ids[2] = {0, 1};
  b.embedding(t, ids, t);
  b.rms_norm(t, w, 1e-5f, t);
  b.add_rms_norm(t, t, w, 1e-5f, t);
  b.add(t, t);
  b.matmul(t, t, Tensor(), t);
  b.head_rms_norm(q3, w, 1e-5f);
  b.rope(q3, q3, ids, rt);
  b.silu_mul(t, t);
  b.kv_write(q3, q3, ab, kv);
  b.paged_attention(q3, kv, ab, 1.0f, 0, q3);
  b.gather_rows(t, ids, 1, t);
  b.fill_rows_from(t, ids, 1, t);
  b.convert(t, t);
  b.fill_uniform(t, 1, 0.0f, 1.0f);
  b.qkv_rope_kv_write(t, Tensor(), Tensor(), 1e-5f, rt, ab, kv, q3);
  b.rms_scaled_qkv_rope_kv_write(t, 1e-5f, t, Tensor(), Tensor(), Tensor(), 1e-5f, rt, ab, kv, q3);
  b.rms_scaled_silu_mul(t, 1e-5f, t, t);
  b.copy_to_device_async(buf, buf, 4);
  b.copy_to_host_async(buf, buf, 4);
  b.copy_device_to_device(buf, buf, 4);
  ops::Backend::SampleBatch sb;
  sb.num_rows = 1;
  sb.vocab = 10;
  b.sample(sb);
}

const char* const kOps[] = {"embedding",
                            "rms_norm",
                            "add_rms_norm",
                            "add",
                            "matmul",
                            "head_rms_norm",
                            "rope",
                            "silu_mul",
                            "kv_write",
                            "paged_attention",
                            "gather_rows",
                            "fill_rows_from",
                            "convert",
                            "fill_uniform",
                            "qkv_rope_kv_write",
                            "rms_scaled_qkv_rope_kv_write",
                            "rms_scaled_silu_mul",
                            "copy_to_device_async",
                            "copy_to_host_async",
                            "copy_device_to_device",
                            "sample"};

TEST(ProfilingBackend, ForwardsEveryVirtual) {
  auto inner = std::make_unique<RecordingBackend>();
  RecordingBackend& rec = *inner;
  ProfilingBackend p(std::move(inner));
  EXPECT_EQ(&p.inner(), &rec);
  EXPECT_EQ(p.device(), Device::kCpu);
  EXPECT_STREQ(p.name(), "recording");
  EXPECT_EQ(p.alloc(8), rec.memory);
  p.free(rec.memory);
  p.copy_to_device(rec.memory, rec.memory, 1);
  p.copy_to_host(rec.memory, rec.memory, 1);
  p.synchronize();
  EXPECT_EQ(p.default_activation_dtype(), DType::kBF16);
  EXPECT_TRUE(p.supports_activation_dtype(DType::kF16));
  EXPECT_FALSE(p.supports_activation_dtype(DType::kF32));
  EXPECT_EQ(p.alloc_host(8), rec.memory + 8);
  p.free_host(rec.memory + 8);
  size_t f = 0, t = 0;
  EXPECT_TRUE(p.memory_info(f, t));
  EXPECT_EQ(f, 3u);
  EXPECT_EQ(t, 7u);
  EXPECT_TRUE(p.supports_device_sampling());
  EXPECT_TRUE(p.supports_graphs());
  p.begin_capture();
  EXPECT_EQ(p.end_capture(), nullptr);
  const uint64_t a = p.timer_mark(), b = p.timer_mark();
  EXPECT_EQ(b, a + 1);
  EXPECT_DOUBLE_EQ(p.timer_elapsed_ms(a, b + 2), 3.0);
  EXPECT_TRUE(p.folds_norms(DType::kBF16));
  EXPECT_FALSE(p.folds_norms(DType::kF16));
  Tensor none;
  p.scale_columns(none, none);  // a load-time op: forwarded, never timed
  call_every_op(p);
  for (const char* op : {"alloc", "free", "scale_columns", "copy_to_device", "copy_to_host", "synchronize", "alloc_host", "free_host",
                         "memory_info", "begin_capture", "end_capture"})
    EXPECT_EQ(rec.calls[op], 1) << op;
  for (const char* op : kOps) EXPECT_EQ(rec.calls[op], 1) << op;
  EXPECT_EQ(rec.calls["timer_mark"], 2);  // outside a step nothing is timed
  EXPECT_TRUE(p.snapshot().groups.empty());
}

TEST(ProfilingBackend, TimesOpsOnlyInsideAStepAndOutsideCapture) {
  auto inner = std::make_unique<RecordingBackend>();
  RecordingBackend& rec = *inner;
  ProfilingBackend p(std::move(inner));
  const std::vector<int32_t> qi = {0, 1, 2}, kl = {5, 9};
  p.begin_step({2, 2, qi, kl});  // two sequences, one token each: decode
  call_every_op(p);
  p.begin_capture();
  Tensor none;
  p.add(none, Tensor());  // not timed while capturing
  (void)p.end_capture();
  p.end_step();
  const ops::ProfileSnapshot s = p.snapshot();
  EXPECT_EQ(s.decode_steps, 1);
  EXPECT_EQ(s.prefill_steps, 0);
  EXPECT_EQ(s.untimed_calls, 0);
  EXPECT_EQ(rec.calls["timer_mark"], 2 * static_cast<int>(std::size(kOps)));
  const std::vector<std::string> groups = {
      "embedding",    "rms_norm",          "add_rms_norm",   "add",          "matmul 2x4 F32",        "head_rms_norm",
      "rope",         "silu_mul",          "kv_write",       "attention",    "gather_rows",           "fill_rows_from",
      "convert",      "fill_uniform", "qkv_rope_kv_write", "rms_scale+qkv_rope_kv_write", "rms_scale+silu_mul",
      "copy to device", "copy to host", "copy device to device", "sample"};
  ASSERT_EQ(s.groups.size(), groups.size());
  for (const std::string& g : groups) {
    const ProfileGroup* e = find(s, "decode", g);
    ASSERT_NE(e, nullptr) << g;
    EXPECT_EQ(e->calls, 1) << g;
    EXPECT_DOUBLE_EQ(e->total_ms, 1.0) << g;  // marks a, a + 1
  }
  // Disabled: forwarded, not timed; reset clears the totals.
  p.set_enabled(false);
  p.begin_step({2, 2, qi, kl});
  call_every_op(p);
  p.end_step();
  EXPECT_EQ(find(p.snapshot(), "decode", "add")->calls, 1);
  EXPECT_EQ(p.snapshot().decode_steps, 1);
  p.reset();
  EXPECT_TRUE(p.snapshot().groups.empty());
  EXPECT_EQ(p.snapshot().decode_steps, 0);
  // Lost marks are counted, not filed.
  p.set_enabled(true);
  rec.lose_marks = true;
  p.begin_step({2, 2, qi, kl});
  call_every_op(p);
  p.end_step();
  EXPECT_TRUE(p.snapshot().groups.empty());
  EXPECT_EQ(p.snapshot().untimed_calls, static_cast<int64_t>(std::size(kOps)));
}

TEST(ProfilingBackend, AttentionLengthFormulas) {
  // q = 3 tokens at positions 2, 3, 4 (kv = 5): 3 + 4 + 5 pairs; all 5 positions read.
  EXPECT_EQ(ops::attended_pairs(3, 5, 0), 12);
  EXPECT_EQ(ops::kv_positions_read(3, 5, 0), 5);
  // Window 2: each attends to 2 positions; positions 1..4 read.
  EXPECT_EQ(ops::attended_pairs(3, 5, 2), 6);
  EXPECT_EQ(ops::kv_positions_read(3, 5, 2), 4);
  // Window 4 over a whole prompt of 6: 1 + 2 + 3 + 4 + 4 + 4.
  EXPECT_EQ(ops::attended_pairs(6, 6, 4), 18);
  EXPECT_EQ(ops::kv_positions_read(6, 6, 4), 6);
  // Decode at kv = 7: 7 pairs (window 0), 3 (window 3).
  EXPECT_EQ(ops::attended_pairs(1, 7, 0), 7);
  EXPECT_EQ(ops::attended_pairs(1, 7, 3), 3);
  EXPECT_EQ(ops::kv_positions_read(1, 7, 3), 3);
  EXPECT_EQ(ops::attended_pairs(0, 7, 0), 0);
  EXPECT_EQ(ops::kv_positions_read(0, 7, 0), 0);
  // Brute force against the definition.
  for (int q = 0; q <= 9; ++q)
    for (int kv = q; kv <= 12; ++kv)
      for (int w : {0, 1, 2, 5, 20}) {
        int64_t pairs = 0, lo = kv;
        for (int p = kv - q; p < kv; ++p) {
          const int first = w > 0 ? std::max(0, p - w + 1) : 0;
          pairs += p - first + 1;
          lo = std::min<int64_t>(lo, first);
        }
        EXPECT_EQ(ops::attended_pairs(q, kv, w), pairs) << q << " " << kv << " " << w;
        EXPECT_EQ(ops::kv_positions_read(q, kv, w), q > 0 ? kv - lo : 0) << q << " " << kv << " " << w;
      }
}

TEST(ProfilingBackend, BytesAndFlopsByHand) {
  auto inner = std::make_unique<RecordingBackend>();
  ProfilingBackend p(std::move(inner));
  float buf[256] = {};
  // Two sequences: 3 new tokens at kv 5 (prefill chunk), 1 at kv 7.
  const std::vector<int32_t> qi = {0, 3, 4}, kl = {5, 7};
  p.begin_step({2, 4, qi, kl});
  Tensor x(buf, DType::kF32, {3, 8}), w(buf, DType::kF32, {5, 8}), out(buf, DType::kF32, {3, 5});
  p.matmul(x, w, Tensor(), out);
  // q [4 tokens, 2 heads, 4]; pages k, v [2 blocks, 8 rows, 1 kv head, 4] F32: 32 bytes a position.
  Tensor q(buf, DType::kF32, {4, 2, 4}), o(buf, DType::kF32, {4, 2, 4});
  ops::LayerKv kv{Tensor(buf, DType::kF32, {2, 8, 1, 4}), Tensor(buf, DType::kF32, {2, 8, 1, 4})};
  ops::AttentionBatch ab;
  p.paged_attention(q, kv, ab, 1.0f, 0, o);
  p.paged_attention(q, kv, ab, 1.0f, 2, o);  // sliding window 2: same group, added
  p.end_step();
  const ops::ProfileSnapshot s = p.snapshot();
  EXPECT_EQ(s.prefill_steps, 1);
  const ProfileGroup* mm = find(s, "prefill", "matmul 5x8 F32");
  ASSERT_NE(mm, nullptr);
  EXPECT_DOUBLE_EQ(mm->flops, 2.0 * 3 * 5 * 8);                    // 240
  EXPECT_DOUBLE_EQ(mm->bytes, 5 * 8 * 4 + 3 * 8 * 4 + 3 * 5 * 4);  // w + x + out = 316
  const ProfileGroup* at = find(s, "prefill", "attention");
  ASSERT_NE(at, nullptr);
  EXPECT_EQ(at->calls, 2);
  // Window 0: pairs 12 + 7 = 19, positions 5 + 7 = 12. Window 2: pairs 6 + 2 = 8, positions 4 + 2 = 6.
  // FLOPs 4 * (2 heads * 4) per pair; bytes q + out (128 each) + 32 per position.
  EXPECT_DOUBLE_EQ(at->flops, 4.0 * 8 * 19 + 4.0 * 8 * 8);
  EXPECT_DOUBLE_EQ(at->bytes, (256 + 32 * 12) + (256 + 32 * 6));
}

// A step of two prompts (5 and 3 tokens) through the llama fixture on the CPU.
struct FixtureStep {
  std::vector<int32_t> ids = {3, 17, 5, 9, 200, 44, 8, 1};
  std::vector<int32_t> positions = {0, 1, 2, 3, 4, 0, 1, 2};
  std::vector<int32_t> slots = {0, 1, 2, 3, 4, 8, 9, 10};  // page 0 and page 1 of 8 rows
  std::vector<int32_t> q_indptr = {0, 5, 8}, kv_lens = {5, 3}, block_indptr = {0, 1, 2}, blocks = {0, 1};
  std::vector<int32_t> rows = {4, 7};
  ForwardBatch batch() const {
    ForwardBatch b;
    b.token_ids = ids.data();
    b.attn.num_seqs = 2;
    b.attn.num_tokens = 8;
    b.attn.max_q_len = 5;
    b.attn.max_kv_len = 5;
    b.attn.q_indptr = q_indptr.data();
    b.attn.kv_lens = kv_lens.data();
    b.attn.block_indptr = block_indptr.data();
    b.attn.block_indices = blocks.data();
    b.attn.positions = positions.data();
    b.attn.slot_mapping = slots.data();
    b.logit_rows = rows.data();
    b.num_logit_rows = 2;
    return b;
  }
};

std::vector<float> run_fixture(ops::Backend& be, ProfilingBackend* prof) {
  auto model = Model::load(std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/llama", be, {});
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return {};
  KvCache kv = (*model)->allocate_kv(4, 8);
  (*model)->reserve(8, 2);
  FixtureStep st;
  if (prof) prof->begin_step({2, 8, st.q_indptr, st.kv_lens});
  Tensor logits = (*model)->forward(st.batch(), kv);
  be.synchronize();
  if (prof) prof->end_step();
  std::vector<float> out(logits.data_as<float>(), logits.data_as<float>() + logits.numel());
  (*model)->free_kv(kv);
  return out;
}

TEST(ProfilingBackend, FixtureModelStepGroupsAndSameLogits) {
  auto plain = ops::make_cpu_backend(1);
  const std::vector<float> want = run_fixture(*plain, nullptr);
  ProfilingBackend prof(ops::make_cpu_backend(1));
  const std::vector<float> got = run_fixture(prof, &prof);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(got, want);  // bit for bit

  // Llama fixture: 2 layers, hidden 64, 4 q heads and 4 kv heads of 16, ffn 160, vocab 512.
  const ops::ProfileSnapshot s = prof.snapshot();
  EXPECT_EQ(s.prefill_steps, 1);
  EXPECT_EQ(s.decode_steps, 0);
  std::map<std::string, int64_t> calls;
  int64_t matmul_calls = 0;
  for (const ProfileGroup& g : s.groups) {
    EXPECT_EQ(g.phase, "prefill");
    EXPECT_GE(g.total_ms, 0.0) << g.group;
    EXPECT_GT(g.bytes, 0.0) << g.group;
    calls[g.group] = g.calls;
    if (g.group.rfind("matmul ", 0) == 0) {
      matmul_calls += g.calls;
      EXPECT_GT(g.flops, 0.0) << g.group;
    }
  }
  const int L = 2;
  const bool fused = calls.count("qkv_rope_kv_write") > 0;
  EXPECT_EQ(calls["embedding"], 1);
  EXPECT_EQ(calls["attention"], L);
  EXPECT_EQ(calls["rms_norm"], 2);  // layer 0 and the final norm
  EXPECT_EQ(calls["add_rms_norm"], 2 * L - 1);
  EXPECT_EQ(calls["silu_mul"], L);
  EXPECT_EQ(calls["gather_rows"], 1);
  EXPECT_EQ(calls["add"], 1);
  EXPECT_EQ(matmul_calls, fused ? 4 * L + 1 : 6 * L + 1);
  EXPECT_EQ(calls["matmul 64x64 F32"], fused ? L : 4 * L);  // o_proj (and q, k, v when not fused)
  EXPECT_EQ(calls["matmul 320x64 F32"], L);                 // gate_up
  EXPECT_EQ(calls["matmul 64x160 F32"], L);                 // down
  EXPECT_EQ(calls["matmul 512x64 F32"], 1);                 // lm_head on the 2 logit rows
  // lm_head: 2 rows x 512 x 64.
  for (const ProfileGroup& g : s.groups)
    if (g.group == "matmul 512x64 F32") {
      EXPECT_DOUBLE_EQ(g.flops, 2.0 * 2 * 512 * 64);
    }
  // Attention: pairs 15 + 6 = 21 per layer, 4 x 64 FLOPs each.
  for (const ProfileGroup& g : s.groups)
    if (g.group == "attention") {
      EXPECT_DOUBLE_EQ(g.flops, L * 4.0 * 64 * 21);
    }
}

TEST(ProfilingBackend, CeilingsOnTheCpu) {
  auto be = ops::make_cpu_backend(1);
  const ops::Ceilings c = ops::measure_ceilings(*be);
  EXPECT_GT(c.copy_gbs, 0.0);
  EXPECT_GT(c.gemm_tflops, 0.0);
  EXPECT_EQ(c.gemm_shape, "F32 256x1024x1024");
}

}  // namespace
}  // namespace osprey
