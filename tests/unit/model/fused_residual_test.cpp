// Model::forward's residual sequence on a backend that reports
// fuses_matmul_add: matmul_add (o and down projections into the residual)
// and rms_norm replace matmul + add_rms_norm, and no add runs before the
// final norm. Checked on the CPU through a forwarding backend that claims
// the fusion but keeps Backend::matmul_add's default (matmul into scratch,
// then add): the same fp32 operations as the unfused sequence, so the
// logits must be bit-identical to the plain CPU backend's; and the op
// counts show which sequence ran. Also ops::ProfilingBackend over such a
// backend: it forwards the claim and files matmul_add as "matmul+add MxK".
// The same for fuses_rms_norm_matmul (the norms folded into the qkv and
// gate/up projections): rms_norm_matmul and rms_norm_matmul_silu_mul with
// their defaults, the same fp32 operations again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "ops/backend.h"
#include "ops/profiling_backend.h"
#include "sequence_runner.h"

namespace osprey {
namespace {

// Forwards every op to a CPU backend, counting the residual and norm ops;
// reports fuses_matmul_add(F32) = claim_fusion,
// fuses_rms_norm_matmul(n, F32) = claim_norm for n <= norm_max_rows and
// folds_norms(F32) = claim_fold (the folding ops through Backend's host
// defaults).
class FusionClaimingBackend final : public ops::Backend {
 public:
  explicit FusionClaimingBackend(bool claim_fusion, bool claim_norm = false, bool claim_fold = false,
                                 int64_t norm_max_rows = INT64_MAX)
      : inner_(ops::make_cpu_backend(1)),
        claim_(claim_fusion),
        claim_norm_(claim_norm),
        claim_fold_(claim_fold),
        norm_max_rows_(norm_max_rows) {}
  std::map<std::string, int> calls;

  Device device() const override { return inner_->device(); }
  const char* name() const override { return "fusion-claiming cpu"; }
  void* alloc(size_t bytes) override { return inner_->alloc(bytes); }
  void free(void* p) override { inner_->free(p); }
  void copy_to_device(void* d, const void* s, size_t n) override { inner_->copy_to_device(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { inner_->copy_to_host(d, s, n); }
  void synchronize() override { inner_->synchronize(); }
  void embedding(const Tensor& t, const int32_t* ids, Tensor& out) override { inner_->embedding(t, ids, out); }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    ++calls["rms_norm"];
    inner_->rms_norm(x, w, eps, out);
  }
  void add_rms_norm(Tensor& r, const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    ++calls["add_rms_norm"];
    inner_->add_rms_norm(r, x, w, eps, out);
  }
  void add(Tensor& x, const Tensor& y) override {
    ++calls["add"];
    inner_->add(x, y);
  }
  void matmul(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& out) override {
    ++calls["matmul"];
    inner_->matmul(x, w, b, out);
  }
  void matmul_add(const Tensor& x, const Tensor& w, Tensor& residual, Tensor& scratch) override {
    ++calls["matmul_add"];
    ops::Backend::matmul_add(x, w, residual, scratch);  // the default, through this class's matmul and add
  }
  bool fuses_matmul_add(DType act) const override { return claim_ && act == DType::kF32; }
  void rms_norm_matmul(const Tensor& x, const Tensor& nw, float eps, const Tensor& w, const Tensor& b, Tensor& normed,
                       Tensor& out) override {
    ++calls["rms_norm_matmul"];
    ops::Backend::rms_norm_matmul(x, nw, eps, w, b, normed, out);  // this class's rms_norm and matmul
  }
  void rms_norm_matmul_silu_mul(const Tensor& x, const Tensor& nw, float eps, const Tensor& w, Tensor& normed,
                                Tensor& gate_up, Tensor& out) override {
    ++calls["rms_norm_matmul_silu_mul"];
    ops::Backend::rms_norm_matmul_silu_mul(x, nw, eps, w, normed, gate_up, out);
  }
  bool fuses_rms_norm_matmul(int64_t n, DType act) const override {
    return claim_norm_ && n > 0 && n <= norm_max_rows_ && act == DType::kF32;
  }
  bool folds_norms(DType act) const override { return claim_fold_ && act == DType::kF32; }
  void scale_columns(Tensor& w, const Tensor& scale) override {
    ++calls["scale_columns"];
    ops::Backend::scale_columns(w, scale);
  }
  void rms_scaled_qkv_rope_kv_write(const Tensor& x, float xe, const Tensor& qkv, const Tensor& bias, const Tensor& qn,
                                    const Tensor& kn, float eps, const ops::RopeTable& rope,
                                    const ops::AttentionBatch& b, ops::LayerKv& kv, Tensor& q) override {
    ++calls["rms_scaled_qkv_rope_kv_write"];
    ops::Backend::rms_scaled_qkv_rope_kv_write(x, xe, qkv, bias, qn, kn, eps, rope, b, kv, q);  // then this class's op
  }
  void rms_scaled_silu_mul(const Tensor& x, float xe, const Tensor& g, Tensor& out) override {
    ++calls["rms_scaled_silu_mul"];
    ops::Backend::rms_scaled_silu_mul(x, xe, g, out);
  }
  void head_rms_norm(Tensor& x, const Tensor& w, float eps) override { inner_->head_rms_norm(x, w, eps); }
  void rope(Tensor& q, Tensor& k, const int32_t* p, const ops::RopeTable& t) override { inner_->rope(q, k, p, t); }
  void silu_mul(const Tensor& g, Tensor& out) override { inner_->silu_mul(g, out); }
  void kv_write(const Tensor& k, const Tensor& v, const ops::AttentionBatch& b, ops::LayerKv& kv) override {
    inner_->kv_write(k, v, b, kv);
  }
  void paged_attention(const Tensor& q, const ops::LayerKv& kv, const ops::AttentionBatch& b, float scale, int window,
                       Tensor& out) override {
    inner_->paged_attention(q, kv, b, scale, window, out);
  }
  void gather_rows(const Tensor& x, const int32_t* rows, int n, Tensor& out) override {
    inner_->gather_rows(x, rows, n, out);
  }
  void fill_rows_from(const Tensor& x, const int32_t* rows, int n, Tensor& out) override {
    inner_->fill_rows_from(x, rows, n, out);
  }
  DType default_activation_dtype() const override { return inner_->default_activation_dtype(); }
  bool supports_activation_dtype(DType t) const override { return inner_->supports_activation_dtype(t); }
  void convert(const Tensor& s, Tensor& d) override { inner_->convert(s, d); }
  void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) override { inner_->fill_uniform(t, seed, lo, hi); }
  void qkv_rope_kv_write(const Tensor& qkv, const Tensor& qn, const Tensor& kn, float eps, const ops::RopeTable& rope,
                         const ops::AttentionBatch& b, ops::LayerKv& kv, Tensor& q) override {
    inner_->qkv_rope_kv_write(qkv, qn, kn, eps, rope, b, kv, q);
  }

 private:
  std::unique_ptr<ops::Backend> inner_;
  bool claim_;
  bool claim_norm_;
  bool claim_fold_;
  int64_t norm_max_rows_;
};

// A prompt (all rows' logits) and three decode steps through one fixture.
std::vector<float> run(ops::Backend& be, const std::string& fixture, int* num_layers, bool* folded = nullptr) {
  auto model = Model::load(std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/" + fixture, be, {});
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return {};
  *num_layers = (*model)->config().num_layers;
  if (folded) *folded = (*model)->norms_folded();
  testing::SequenceRunner seq(**model, 32, 4);
  std::vector<float> out = seq.feed({3, 17, 5, 9, 200, 44, 8, 1, 90}, true);
  for (int32_t t : {7, 300, 12}) {
    const std::vector<float> l = seq.feed({t}, false);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

TEST(FusedResidual, ClaimedFusionRunsMatmulAddAndKeepsTheLogits) {
  for (const char* fixture : {"llama", "qwen2", "qwen3", "mistral"}) {
    FusionClaimingBackend plain(false), fused(true);
    int layers = 0;
    const std::vector<float> want = run(plain, fixture, &layers);
    const std::vector<float> got = run(fused, fixture, &layers);
    ASSERT_FALSE(want.empty()) << fixture;
    EXPECT_EQ(got, want) << fixture << ": same fp32 operations, other order of calls";
    const int steps = 4;  // forwards
    // Unfused: add_rms_norm twice a layer but layer 0's first; the final add.
    EXPECT_EQ(plain.calls["matmul_add"], 0) << fixture;
    EXPECT_EQ(plain.calls["add_rms_norm"], steps * (2 * layers - 1)) << fixture;
    EXPECT_EQ(plain.calls["add"], steps) << fixture;
    EXPECT_EQ(plain.calls["rms_norm"], steps * 2) << fixture;
    // Fused: matmul_add for o and down (each an add through the default), norms without the add.
    EXPECT_EQ(fused.calls["matmul_add"], steps * 2 * layers) << fixture;
    EXPECT_EQ(fused.calls["add_rms_norm"], 0) << fixture;
    EXPECT_EQ(fused.calls["add"], steps * 2 * layers) << fixture;
    EXPECT_EQ(fused.calls["rms_norm"], steps * (2 * layers + 1)) << fixture;
    EXPECT_EQ(fused.calls["matmul"], plain.calls["matmul"]) << fixture;  // matmul_add's default calls matmul
  }
}

TEST(FusedResidual, ProfilingBackendForwardsTheClaimAndFilesMatmulAdd) {
  auto inner = std::make_unique<FusionClaimingBackend>(true);
  FusionClaimingBackend& rec = *inner;
  ops::ProfilingBackend prof(std::move(inner));
  EXPECT_TRUE(prof.fuses_matmul_add(DType::kF32));
  EXPECT_FALSE(prof.fuses_matmul_add(DType::kBF16));
  // One call by hand: x [3, 8], w [5, 8], residual [3, 5], all F32.
  std::vector<float> x(24, 0.5f), w(40, 0.25f), r(15, 1.0f), scratch(15, 0.0f);
  Tensor xt(x.data(), DType::kF32, {3, 8}), wt(w.data(), DType::kF32, {5, 8});
  Tensor rt(r.data(), DType::kF32, {3, 5}), st(scratch.data(), DType::kF32, {3, 5});
  const std::vector<int32_t> qi = {0, 3}, kl = {3};
  prof.begin_step({1, 3, qi, kl});
  prof.matmul_add(xt, wt, rt, st);
  prof.end_step();
  EXPECT_EQ(r, std::vector<float>(15, 2.0f));  // 1 + 8 * 0.5 * 0.25
  EXPECT_EQ(rec.calls["matmul_add"], 1);
  const ops::ProfileSnapshot snap = prof.snapshot();
  ASSERT_EQ(snap.groups.size(), 1u);
  EXPECT_EQ(snap.groups[0].phase, "prefill");
  EXPECT_EQ(snap.groups[0].group, "matmul+add 5x8 F32");
  EXPECT_EQ(snap.groups[0].calls, 1);
  EXPECT_DOUBLE_EQ(snap.groups[0].flops, 2.0 * 3 * 5 * 8);
  EXPECT_DOUBLE_EQ(snap.groups[0].bytes, 40 * 4 + 24 * 4 + 2 * 15 * 4);  // w + x + residual read and written

  // A fixture's steps through the profiler take the fused sequence and keep the logits.
  FusionClaimingBackend plain(false);
  int layers = 0;
  const std::vector<float> want = run(plain, "llama", &layers);
  EXPECT_EQ(run(prof, "llama", &layers), want);
  EXPECT_EQ(rec.calls["matmul_add"], 1 + 4 * 2 * layers);
  EXPECT_EQ(rec.calls["add_rms_norm"], 0);
}

TEST(FusedResidual, ClaimedNormFoldRunsRmsNormMatmulAndKeepsTheLogits) {
  for (const char* fixture : {"llama", "qwen2", "qwen3", "mistral"}) {
    FusionClaimingBackend plain(false), folded(true, true), norm_only(false, true);
    int layers = 0;
    const std::vector<float> want = run(plain, fixture, &layers);
    EXPECT_EQ(run(folded, fixture, &layers), want) << fixture << ": same fp32 operations";
    EXPECT_EQ(run(norm_only, fixture, &layers), want) << fixture;
    const int steps = 4;  // forwards
    // Every layer's qkv is one fused weight on the CPU: both norms folded.
    EXPECT_EQ(folded.calls["rms_norm_matmul"], steps * layers) << fixture;
    EXPECT_EQ(folded.calls["rms_norm_matmul_silu_mul"], steps * layers) << fixture;
    EXPECT_EQ(folded.calls["rms_norm"], steps * (2 * layers + 1)) << fixture;  // through the defaults
    EXPECT_EQ(folded.calls["add_rms_norm"], 0) << fixture;
    EXPECT_EQ(folded.calls["matmul"], plain.calls["matmul"]) << fixture;
    // The fold needs the plain norms of the fused residual form.
    EXPECT_EQ(norm_only.calls["rms_norm_matmul"], 0) << fixture;
    EXPECT_EQ(norm_only.calls["rms_norm_matmul_silu_mul"], 0) << fixture;
  }
}

TEST(FusedResidual, ProfilingBackendForwardsTheNormFold) {
  auto inner = std::make_unique<FusionClaimingBackend>(true, true);
  FusionClaimingBackend& rec = *inner;
  ops::ProfilingBackend prof(std::move(inner));
  EXPECT_TRUE(prof.fuses_rms_norm_matmul(1, DType::kF32));
  EXPECT_FALSE(prof.fuses_rms_norm_matmul(1, DType::kBF16));
  // x [3, 8] of 2.0 (rms 2: normed = norm weight), norm weight 0.5, w [5, 8] of 0.25.
  std::vector<float> x(24, 2.0f), nw(8, 0.5f), w(40, 0.25f), normed(24, 0.0f), out(15, 0.0f);
  Tensor xt(x.data(), DType::kF32, {3, 8}), nt(nw.data(), DType::kF32, {8}), wt(w.data(), DType::kF32, {5, 8});
  Tensor normt(normed.data(), DType::kF32, {3, 8}), ot(out.data(), DType::kF32, {3, 5});
  const std::vector<int32_t> qi = {0, 3}, kl = {3};
  prof.begin_step({1, 3, qi, kl});
  prof.rms_norm_matmul(xt, nt, 0.0f, wt, Tensor(), normt, ot);
  prof.end_step();
  EXPECT_EQ(out, std::vector<float>(15, 1.0f));  // 8 * 0.5 * 0.25
  EXPECT_EQ(rec.calls["rms_norm_matmul"], 1);
  const ops::ProfileSnapshot snap = prof.snapshot();
  ASSERT_EQ(snap.groups.size(), 1u);
  EXPECT_EQ(snap.groups[0].group, "rms_norm+matmul 5x8 F32");
  EXPECT_EQ(snap.groups[0].calls, 1);
  EXPECT_DOUBLE_EQ(snap.groups[0].flops, 2.0 * 3 * 5 * 8);
  EXPECT_DOUBLE_EQ(snap.groups[0].bytes, 40 * 4 + 24 * 4 + 8 * 4 + 15 * 4);  // w + x + norm weight + out

  // A fixture's steps through the profiler fold the norms and keep the logits.
  FusionClaimingBackend plain(false);
  int layers = 0;
  const std::vector<float> want = run(plain, "llama", &layers);
  EXPECT_EQ(run(prof, "llama", &layers), want);
  EXPECT_EQ(rec.calls["rms_norm_matmul"], 1 + 4 * layers);
  EXPECT_EQ(rec.calls["rms_norm_matmul_silu_mul"], 4 * layers);
}

// Norm weights folded into w_qkv / w_gate_up (folds_norms): the norms'
// per-row scale applied after the projections, by the ops reading them
// (Backend's host defaults here). Not the same fp32 operations (the norm
// weight multiplies the weights, the scale the products), so the logits
// agree to fp32 rounding, not bit for bit. Every fixture folds (qwen2's
// qkv bias is added after the scale, by the op that applies it).
// With the GEMV-size claim at one row, the decode steps run
// rms_norm_matmul* with the unit norm weight and the prompt the scaled ops.
TEST(FusedResidual, FoldedNormsScaleAfterTheProjectionsAndKeepTheLogits) {
  for (const char* fixture : {"llama", "qwen2", "qwen3", "mistral"}) {
    for (int64_t gemv_rows : {int64_t{0}, int64_t{1}}) {
      FusionClaimingBackend plain(false), folded(true, gemv_rows > 0, true, gemv_rows);
      int layers = 0;
      bool was_folded = true;
      const std::vector<float> want = run(plain, fixture, &layers, &was_folded);
      EXPECT_FALSE(was_folded) << fixture;
      const std::vector<float> got = run(folded, fixture, &layers, &was_folded);
      ASSERT_EQ(got.size(), want.size()) << fixture;
      const bool expect_fold = true;
      EXPECT_EQ(was_folded, expect_fold) << fixture;
      double err = 0, ref = 0, max_abs = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        err += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
        ref += double{want[i]} * want[i];
        max_abs = std::max(max_abs, std::fabs(double{got[i]} - want[i]));
      }
      EXPECT_LE(std::sqrt(err / ref), 2e-6) << fixture << " gemv_rows " << gemv_rows << " max abs " << max_abs;
      EXPECT_GT(ref, 0.0) << fixture;
      const int prompt_steps = 1, decode_steps = 3;
      const int scaled_steps = gemv_rows > 0 ? prompt_steps : prompt_steps + decode_steps;
      if (expect_fold) {
        EXPECT_EQ(folded.calls["scale_columns"], 2 * layers) << fixture;
        EXPECT_EQ(folded.calls["rms_scaled_qkv_rope_kv_write"], scaled_steps * layers) << fixture;
        EXPECT_EQ(folded.calls["rms_scaled_silu_mul"], scaled_steps * layers) << fixture;
        EXPECT_EQ(folded.calls["rms_norm_matmul"], (4 - scaled_steps) * layers) << fixture;
        // Only the final norm runs as rms_norm, plus the GEMV-size steps' norms through the default.
        EXPECT_EQ(folded.calls["rms_norm"], 4 + (4 - scaled_steps) * 2 * layers) << fixture;
      } else {
        EXPECT_EQ(folded.calls["scale_columns"], 0) << fixture;
        EXPECT_EQ(folded.calls["rms_scaled_qkv_rope_kv_write"], 0) << fixture;
        EXPECT_EQ(folded.calls["rms_scaled_silu_mul"], 0) << fixture;
      }
    }
  }
}

TEST(FusedResidual, FoldNeedsTheFusedResidual) {
  // folds_norms without fuses_matmul_add: resid lacks the last projection
  // between the norms, so the model keeps the norms (and the logits).
  FusionClaimingBackend plain(false), fold_only(false, false, true);
  int layers = 0;
  bool was_folded = true;
  const std::vector<float> want = run(plain, "llama", &layers);
  EXPECT_EQ(run(fold_only, "llama", &layers, &was_folded), want);
  EXPECT_FALSE(was_folded);
  EXPECT_EQ(fold_only.calls["scale_columns"], 0);
}

}  // namespace
}  // namespace osprey
