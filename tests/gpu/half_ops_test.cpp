// 16-bit compute (BF16 and F16 activations, one parameterised suite) on the
// CUDA backend against the CPU reference: row ops (rms_norm, add_rms_norm
// with the residual, in-place head norm, add, silu_mul), embedding for every
// table dtype, matmul (GEMV and cuBLASLt paths, every weight dtype, 16-bit
// and F32 out; fp32 accumulation), the fused QKV norm + RoPE + KV write into
// F32/BF16/F16 pages, paged attention with 16-bit q over decode steps
// (padded sequences, the graph contract) and prefill/mixed steps (the
// tensor-core prefill kernel for pages of the activation dtype, the generic
// kernel for other pages and forced splits); a dummy Llama-3.2-1B against
// fp32 on the GPU; and the dtype-independent checks (seeded fill and
// conversions bit-identical to the CPU, F16 loading).
//
// Inputs are rounded to the activation dtype first; the CPU computes in fp32
// on those values. Bounds per dtype are in kHalfCases: an output rounded
// once to bf16 has relative error <= 2^-9 (NMSE ~3e-7), to f16 <= 2^-11
// (NMSE ~8e-8); the bounds leave room for fp32 order differences, inputs
// rounded on the GEMM path and, in the prefill kernel, P rounded to the
// 16-bit type before P V.
#include <ostream>

#include "batch_runner.h"
#include "model/model.h"
#include "ops/rope_freq.h"

namespace osprey::gpu_test {
namespace {

struct Tol {
  double nmse;
  double max_rel;
};

// Error of values rounded once to dtype t (F32: fp32 order differences only).
Tol rounding_tol(DType t) {
  switch (t) {
    case DType::kBF16:
      return {1e-4, 2e-2};
    case DType::kF16:
      return {1e-6, 3e-3};
    default:
      return {1e-11, 1e-5};
  }
}

Tol max_tol(Tol a, Tol b) { return {std::max(a.nmse, b.nmse), std::max(a.max_rel, b.max_rel)}; }

struct HalfCase {
  DType act;
  const char* dtype;  // EngineConfig / model_bench spelling
  const char* tag;
  Tol out;            // row ops, embedding: one rounding
  Tol matmul;         // plus out.nmse when the output is 16-bit
  Tol decode;         // decode attention
  Tol prefill;        // prefill / mixed attention
  double dummy_nmse;  // the dummy 1B model's logits against fp32
  double dummy_tie_frac;  // greedy divergence allowed under this top-2 margin (of max |logit|)
};

const HalfCase kHalfCases[] = {
    {DType::kBF16, "bfloat16", "bf16", {1e-4, 1e-2}, {2e-5, 3e-2}, {1e-4, 2e-2}, {3e-4, 3e-2}, 2e-2, 5e-2},
    // dummy 1B in f16: NMSE measured 1.0e-5 - 1.5e-5 on an H200 (bf16: 8e-4).
    {DType::kF16, "float16", "f16", {1e-6, 3e-3}, {1e-6, 5e-3}, {1e-6, 3e-3}, {1e-6, 3e-3}, 2e-4, 2e-2},
};

void PrintTo(const HalfCase& c, std::ostream* os) { *os << c.tag; }

// The other 16-bit dtype.
DType other_half(DType t) { return t == DType::kF16 ? DType::kBF16 : DType::kF16; }

std::vector<uint16_t> to_half(DType t, const std::vector<float>& v) {
  return t == DType::kF16 ? to_f16(v) : to_bf16(v);
}
std::vector<float> from_half(DType t, const std::vector<uint16_t>& v) {
  return t == DType::kF16 ? from_f16(v) : from_bf16(v);
}
std::vector<float> round_to(DType t, const std::vector<float>& v) {
  if (t == DType::kF32) return v;
  return from_half(t, to_half(t, v));
}
// Device copy of v stored as dtype t (F32, F16 or BF16), and back.
DeviceMem upload_as(ops::Backend& be, DType t, const std::vector<float>& v) {
  return t == DType::kF32 ? upload(be, v) : upload(be, to_half(t, v));
}
std::vector<float> download_as(ops::Backend& be, DType t, const DeviceMem& m, size_t count) {
  if (t == DType::kF32) return download<float>(be, m, count);
  return from_half(t, download<uint16_t>(be, m, count));
}

class HalfOps : public GpuTest, public ::testing::WithParamInterface<HalfCase> {
 protected:
  DType act() const { return GetParam().act; }
  const HalfCase& hc() const { return GetParam(); }
  std::string tag(const std::string& what) const { return std::string(hc().tag) + " " + what; }
};

TEST_P(HalfOps, RowOpsMatchCpu) {
  const DType t = act();
  const Tol tol = hc().out;
  for (int64_t d : {64, 257, 4096}) {
    const int64_t n = 7;
    const auto x = round_to(t, random_floats(static_cast<size_t>(n * d), 1, -2, 2));
    const auto y = round_to(t, random_floats(static_cast<size_t>(n * d), 2, -2, 2));
    const auto w = random_floats(static_cast<size_t>(d), 3, 0.5f, 1.5f);
    // CPU reference in fp32 on the rounded inputs.
    std::vector<float> cx = x, cy = y, cout(x.size()), cres = x;
    Tensor tx(cx.data(), DType::kF32, {n, d}), ty(cy.data(), DType::kF32, {n, d}),
        to(cout.data(), DType::kF32, {n, d}), tr(cres.data(), DType::kF32, {n, d});
    std::vector<float> wv = w;
    Tensor tw(wv.data(), DType::kF32, {d});
    auto gx = upload_as(gpu(), t, x), gy = upload_as(gpu(), t, y), gw = upload(gpu(), w);
    DeviceMem go(gpu(), static_cast<size_t>(n * d) * 2);
    Tensor dx = dev_tensor(gx, t, {n, d}), dy = dev_tensor(gy, t, {n, d});
    Tensor dout = dev_tensor(go, t, {n, d}), dw = dev_tensor(gw, DType::kF32, {d});
    const std::string sfx = " d=" + std::to_string(d);

    cpu().rms_norm(tx, tw, 1e-5f, to);
    gpu().rms_norm(dx, dw, 1e-5f, dout);
    expect_close(download_as(gpu(), t, go, x.size()), cout, tol.nmse, tol.max_rel, tag("rms_norm" + sfx));

    cpu().add_rms_norm(tr, ty, tw, 1e-5f, to);
    gpu().add_rms_norm(dx, dy, dw, 1e-5f, dout);  // dx is the residual now
    expect_close(download_as(gpu(), t, gx, x.size()), cres, tol.nmse, tol.max_rel, tag("residual" + sfx));
    expect_close(download_as(gpu(), t, go, x.size()), cout, tol.nmse, 2 * tol.max_rel, tag("add_rms_norm" + sfx));

    // In place (head_rms_norm's path): rows of d as heads.
    {
      auto gh = upload_as(gpu(), t, y);
      Tensor dh = dev_tensor(gh, t, {n, d});
      gpu().head_rms_norm(dh, dw, 1e-5f);
      std::vector<float> ch = y, cho(y.size());
      Tensor th(ch.data(), DType::kF32, {n, d}), tho(cho.data(), DType::kF32, {n, d});
      cpu().rms_norm(th, tw, 1e-5f, tho);
      expect_close(download_as(gpu(), t, gh, y.size()), cho, tol.nmse, tol.max_rel, tag("head_rms_norm" + sfx));
    }

    // add: x + y (fresh copies of the rounded inputs).
    {
      auto ga = upload_as(gpu(), t, x);
      Tensor da = dev_tensor(ga, t, {n, d});
      gpu().add(da, dy);
      std::vector<float> ref(x.size());
      for (size_t i = 0; i < x.size(); ++i) ref[i] = x[i] + y[i];
      expect_close(download_as(gpu(), t, ga, x.size()), ref, tol.nmse, tol.max_rel, tag("add" + sfx));
    }

    if (d % 2 == 0) {
      const int64_t f = d / 2;
      Tensor cg(cy.data(), DType::kF32, {n, d});
      Tensor cact(cout.data(), DType::kF32, {n, f});
      cpu().silu_mul(cg, cact);
      Tensor dact = dev_tensor(go, t, {n, f});
      gpu().silu_mul(dy, dact);
      std::vector<float> ref(cout.begin(), cout.begin() + n * f);
      expect_close(download_as(gpu(), t, go, static_cast<size_t>(n * f)), ref, tol.nmse, tol.max_rel,
                   tag("silu_mul" + sfx));
    }
  }
}

TEST_P(HalfOps, EmbeddingEveryTableDtype) {
  const DType t = act();
  const int64_t vocab = 50, d = 96;
  const auto tf = random_floats(static_cast<size_t>(vocab * d), 5, -1, 1);
  const std::vector<int32_t> ids = {0, 49, 7, -1, 50, 7, 3};  // -1 and 50: outside the vocabulary
  const int64_t n = static_cast<int64_t>(ids.size());
  auto gids = upload(gpu(), ids);
  for (DType tt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_1}) {
    const auto packed = pack(tt, tf, vocab, d);
    const auto table = unpack(tt, packed, vocab, d);
    auto gt = upload_bytes(gpu(), packed.data(), packed.size());
    DeviceMem go(gpu(), static_cast<size_t>(n * d) * 2);
    Tensor out = dev_tensor(go, t, {n, d});
    gpu().embedding(dev_tensor(gt, tt, {vocab, d}), gids.as<int32_t>(), out);
    std::vector<double> ref(static_cast<size_t>(n * d), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t id = ids[static_cast<size_t>(i)];
      if (id < 0 || id >= vocab) continue;
      for (int64_t c = 0; c < d; ++c) ref[static_cast<size_t>(i * d + c)] = table[static_cast<size_t>(id * d + c)];
    }
    const auto got = download_as(gpu(), t, go, ref.size());
    expect_close(got, ref, hc().out.nmse, hc().out.max_rel, tag("embedding " + std::string(dtype_name(tt))));
    for (int64_t c = 0; c < d; ++c) {
      ASSERT_EQ(got[static_cast<size_t>(3 * d + c)], 0.0f);
      ASSERT_EQ(got[static_cast<size_t>(4 * d + c)], 0.0f);
    }
  }
}

TEST_P(HalfOps, MatmulEveryWeightDtypeAndPath) {
  const DType t = act();
  const int64_t m = 1000, k = 320;  // odd number of output rows
  for (DType wt : {DType::kF16, DType::kBF16, DType::kF32, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    const auto wf = random_floats(static_cast<size_t>(m * k), 10, -0.5f, 0.5f);
    const auto packed = pack(wt, wf, m, k);
    // Weights of other dtypes are rounded to the activation dtype on the
    // cuBLASLt path: the reference uses the unpacked weights and the bound
    // allows that rounding.
    const auto wref = unpack(wt, packed, m, k);
    auto gw = upload_bytes(gpu(), packed.data(), packed.size());
    const auto bias = random_floats(static_cast<size_t>(m), 12);
    auto gb = upload(gpu(), bias);
    for (int64_t n : {1, 5, 8, 9, 33, 70}) {  // both GEMV instances, quantised GEMV up to 32, cuBLASLt
      for (bool with_bias : {false, true}) {
        for (DType ot : {t, DType::kF32}) {
          const auto x = round_to(t, random_floats(static_cast<size_t>(n * k), 11 + static_cast<uint32_t>(n)));
          std::vector<double> ref(static_cast<size_t>(n * m));
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < m; ++j) {
              double s = with_bias ? bias[static_cast<size_t>(j)] : 0.0;
              for (int64_t c = 0; c < k; ++c)
                s += double{x[static_cast<size_t>(i * k + c)]} * wref[static_cast<size_t>(j * k + c)];
              ref[static_cast<size_t>(i * m + j)] = s;
            }
          auto gx = upload_as(gpu(), t, x);
          const size_t es = ot == DType::kF32 ? 4 : 2;
          DeviceMem go(gpu(), static_cast<size_t>(n * m) * es);
          Tensor dx = dev_tensor(gx, t, {n, k}), dwt = dev_tensor(gw, wt, {m, k});
          Tensor dout = dev_tensor(go, ot, {n, m});
          gpu().matmul(dx, dwt, with_bias ? dev_tensor(gb, DType::kF32, {m}) : Tensor(), dout);
          const auto got = download_as(gpu(), ot, go, static_cast<size_t>(n * m));
          expect_close(got, ref, hc().matmul.nmse + (ot == DType::kF32 ? 0.0 : hc().out.nmse), hc().matmul.max_rel,
                       tag("matmul " + std::string(dtype_name(wt)) + " n=" + std::to_string(n) +
                           (with_bias ? " bias" : "") + " out " + std::string(dtype_name(ot))));
        }
      }
    }
  }
}

// Large sums stay finite and exact: fp32 accumulation, 16-bit only at the input.
TEST_P(HalfOps, MatmulAccumulatesInFp32) {
  const DType t = act();
  const int64_t m = 64, k = 8192;
  for (int64_t n : {1, 64}) {
    std::vector<float> x(static_cast<size_t>(n * k), 8.0f), w(static_cast<size_t>(m * k), 0.5f);
    auto gx = upload_as(gpu(), t, x), gw = upload_as(gpu(), t, w);
    DeviceMem go(gpu(), static_cast<size_t>(n * m) * 4);
    Tensor out = dev_tensor(go, DType::kF32, {n, m});
    gpu().matmul(dev_tensor(gx, t, {n, k}), dev_tensor(gw, t, {m, k}), Tensor(), out);
    const auto got = download<float>(gpu(), go, static_cast<size_t>(n * m));
    for (float v : got) ASSERT_EQ(v, 4.0f * k) << tag("n=" + std::to_string(n));  // 8192 products of 4
  }
}

// Activations of the parameter's dtype (and F32 once, under the bf16
// parameter) into F32, BF16 and F16 pages. The GPU rounds k/v to the
// activation dtype before the page dtype, the CPU rounds fp32 k/v to the page
// dtype: pages of another 16-bit dtype allow that dtype's rounding.
TEST_P(HalfOps, FusedQkvRopeKvWriteMatchesCpu) {
  struct Shape {
    int hq, hk, hd;
  };
  for (Shape sh : {Shape{8, 8, 64}, Shape{8, 2, 128}, Shape{16, 2, 64}, Shape{4, 1, 128}}) {
    for (bool norm : {false, true}) {
      for (DType at : {act(), DType::kF32}) {
        if (at == DType::kF32 && act() != DType::kBF16) continue;  // independent of the parameter: run once
        for (DType kvt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI8}) {
          if (kvt == DType::kI8 && at == DType::kF32) continue;  // I8 pages on CUDA: BF16 / F16 compute
          const int n = 11, bs = 4, num_blocks = 8, num_slots = bs * num_blocks;
          const int64_t cols = int64_t{sh.hq + 2 * sh.hk} * sh.hd;
          const auto qkv = round_to(at, random_floats(static_cast<size_t>(n * cols), 20, -2, 2));
          std::vector<int32_t> pos(static_cast<size_t>(n));
          for (int i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = 3 * i + 1000 * (i % 3);
          const auto slots = shuffled_slots(n, num_slots, 21, 0, 4);  // every fourth token skipped
          const auto qn = random_floats(static_cast<size_t>(sh.hd), 22, 0.5f, 1.5f);
          const auto kn = random_floats(static_cast<size_t>(sh.hd), 23, 0.5f, 1.5f);
          auto inv = ops::make_rope_inv_freq(500000.0f, sh.hd, {});
          // CPU reference (fp32).
          const size_t cache_elems = static_cast<size_t>(num_slots) * sh.hk * sh.hd;
          const size_t kv_es = static_cast<size_t>(dtype_block_bytes(kvt));
          std::vector<uint8_t> ck(cache_elems * kv_es), cv(cache_elems * kv_es);
          std::vector<float> cq(static_cast<size_t>(n) * sh.hq * sh.hd);
          std::vector<float> qkv_c = qkv, qn_c = qn, kn_c = kn;
          // F8 pages: K and V scales (codes of |k| up to ~60 and |v| up to ~8).
          ops::LayerKv ckv{Tensor(ck.data(), kvt, {num_blocks, bs, sh.hk, sh.hd}),
                           Tensor(cv.data(), kvt, {num_blocks, bs, sh.hk, sh.hd}), 0.05f, 0.25f};
          // I8 pages: a scale a (slot, head) row.
          const bool i8 = kvt == DType::kI8;
          std::vector<float> cks(static_cast<size_t>(num_slots) * sh.hk), cvs(cks.size());
          if (i8) {
            ckv.k_row_scales = Tensor(cks.data(), DType::kF32, {num_blocks, sh.hk, bs});
            ckv.v_row_scales = Tensor(cvs.data(), DType::kF32, {num_blocks, sh.hk, bs});
          }
          ops::AttentionBatch cb;
          cb.num_tokens = n;
          cb.positions = pos.data();
          cb.slot_mapping = slots.data();
          ops::RopeTable rt;
          rt.inv_freq = inv.data();
          rt.rotary_dim = sh.hd;
          Tensor cq3(cq.data(), DType::kF32, {n, sh.hq, sh.hd});
          cpu().qkv_rope_kv_write(Tensor(qkv_c.data(), DType::kF32, {n, cols}),
                                  norm ? Tensor(qn_c.data(), DType::kF32, {sh.hd}) : Tensor(),
                                  norm ? Tensor(kn_c.data(), DType::kF32, {sh.hd}) : Tensor(), 1e-6f, rt, cb, ckv,
                                  cq3);
          // GPU.
          auto gqkv = upload_as(gpu(), at, qkv);
          auto gpos = upload(gpu(), pos), gslots = upload(gpu(), slots), ginv = upload(gpu(), inv);
          auto gqn = upload(gpu(), qn), gkn = upload(gpu(), kn);
          DeviceMem gk(gpu(), cache_elems * kv_es), gv(gpu(), cache_elems * kv_es);
          const size_t aes = at == DType::kF32 ? 4 : 2;
          DeviceMem gq(gpu(), cq.size() * aes);
          ops::LayerKv gkv{dev_tensor(gk, kvt, {num_blocks, bs, sh.hk, sh.hd}),
                           dev_tensor(gv, kvt, {num_blocks, bs, sh.hk, sh.hd}), 0.05f, 0.25f};
          DeviceMem gks(gpu(), cks.size() * 4), gvs(gpu(), cks.size() * 4);
          if (i8) {
            gkv.k_row_scales = dev_tensor(gks, DType::kF32, {num_blocks, sh.hk, bs});
            gkv.v_row_scales = dev_tensor(gvs, DType::kF32, {num_blocks, sh.hk, bs});
          }
          ops::AttentionBatch gb = cb;
          gb.positions = gpos.as<int32_t>();
          gb.slot_mapping = gslots.as<int32_t>();
          ops::RopeTable grt = rt;
          grt.inv_freq = ginv.as<float>();
          Tensor gq3 = dev_tensor(gq, at, {n, sh.hq, sh.hd});
          gpu().qkv_rope_kv_write(dev_tensor(gqkv, at, {n, cols}),
                                  norm ? dev_tensor(gqn, DType::kF32, {sh.hd}) : Tensor(),
                                  norm ? dev_tensor(gkn, DType::kF32, {sh.hd}) : Tensor(), 1e-6f, grt, gb, gkv, gq3);
          const std::string what = "qkv hq=" + std::to_string(sh.hq) + " hk=" + std::to_string(sh.hk) +
                                   " hd=" + std::to_string(sh.hd) + (norm ? " norm" : "") + " act " +
                                   std::string(dtype_name(at)) + " kv " + std::string(dtype_name(kvt));
          const Tol q_tol = rounding_tol(at);
          expect_close(download_as(gpu(), at, gq, cq.size()), cq, q_tol.nmse, q_tol.max_rel, tag(what + " q"));
          // F8: a value rounded to act first may land one E4M3 step away; a step is at most 1/8 of
          // the largest value (measured on an H100: 1/13).
          // I8: a row's values within half a step (1/254 of the row's largest) plus act's rounding.
          const Tol page_tol = kvt == at               ? q_tol
                               : kvt == DType::kF8E4M3 ? max_tol(q_tol, Tol{2e-3, 0.13})
                               : i8                    ? max_tol(q_tol, Tol{1e-4, 0.01})
                                                       : max_tol(q_tol, rounding_tol(kvt));
          auto as_float = [&](const std::vector<uint8_t>& b, const std::vector<float>& row_scales) {
            std::vector<float> f(cache_elems);
            dequantize_row(kvt, b.data(), f.data(), static_cast<int64_t>(cache_elems));
            if (i8) {
              for (size_t e = 0; e < cache_elems; ++e) {
                const int64_t r = static_cast<int64_t>(e) / sh.hd;  // slot * hk + head
                f[e] *= row_scales[static_cast<size_t>(ops::kv_row_scale_index(r / sh.hk, r % sh.hk, sh.hk, bs))];
              }
            }
            return f;
          };
          // Slots no token wrote: scales and codes as allocated on both sides (zeros) only on the CPU; mask them.
          auto written = [&](std::vector<float> f) {
            std::vector<bool> w(static_cast<size_t>(num_slots), false);
            for (int i = 0; i < n; ++i)
              if (slots[static_cast<size_t>(i)] >= 0) w[static_cast<size_t>(slots[static_cast<size_t>(i)])] = true;
            for (size_t e = 0; e < cache_elems; ++e)
              if (!w[e / static_cast<size_t>(sh.hk * sh.hd)]) f[e] = 0.0f;
            return f;
          };
          const auto gks_h = i8 ? download<float>(gpu(), gks, cks.size()) : cks;
          const auto gvs_h = i8 ? download<float>(gpu(), gvs, cvs.size()) : cvs;
          expect_close(written(as_float(download<uint8_t>(gpu(), gk, cache_elems * kv_es), gks_h)),
                       written(as_float(ck, cks)), page_tol.nmse, page_tol.max_rel, tag(what + " k pages"));
          expect_close(written(as_float(download<uint8_t>(gpu(), gv, cache_elems * kv_es), gvs_h)),
                       written(as_float(cv, cvs)), page_tol.nmse, page_tol.max_rel, tag(what + " v pages"));
        }
      }
    }
  }
}

// An attention step with q/out of the parameter's dtype: sequences (query
// tokens, tokens before them), pages of kv dtype in permuted order; padded
// sequences (0, 0) have kv_len 0 and must give exact zeros. The CPU reference
// runs on F32 pages holding the rounded values, without the padded sequences.
struct AttnSeq {
  int q_len;
  int past;
};
struct AttnShape {
  int hq, hk, hd, window;
};

class HalfAttention : public HalfOps {
 protected:
  // Checks the GPU output against the CPU (bound `tol`); where every sequence
  // has one query token, also that a stale max_kv_len changes nothing.
  void run(AttnShape sh, const std::vector<AttnSeq>& seqs, DType kvt, int splits_option, Tol tol,
           const std::string& what) {
    const DType t = act();
    const int bs = 16;
    // The K/V of this step is already in the pages (slots -1); a sequence's
    // pages are its own range of the pool, permuted.
    HostAttentionBatch h;
    int pages = 0;
    for (auto [nq, past] : seqs) {
      const bool padded = nq == 0;
      const int len = padded ? 0 : past + nq;
      const int np = (len + bs - 1) / bs;
      std::vector<int32_t> own(static_cast<size_t>(np));
      for (int p = 0; p < np; ++p) own[static_cast<size_t>(p)] = pages + (p * 7 + 3) % np;
      pages += np;
      h.add_seq(padded ? 1 : nq, len, own, bs, false);
    }
    const int n = h.num_tokens();
    const int num_seqs = h.num_seqs();
    const std::vector<int32_t>& q_indptr = h.q_indptr;
    const std::vector<int32_t>& kv_lens = h.kv_lens;
    const int64_t page_elems = int64_t{bs} * sh.hk * sh.hd;
    const auto kf = round_to(kvt, random_floats(static_cast<size_t>(std::max(pages, 1) * page_elems), 60, -2, 2));
    const auto vf = round_to(kvt, random_floats(static_cast<size_t>(std::max(pages, 1) * page_elems), 61, -2, 2));
    const auto qf = round_to(t, random_floats(static_cast<size_t>(n) * sh.hq * sh.hd, 62, -2, 2));
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
    const int64_t row = int64_t{sh.hq} * sh.hd;

    // CPU on the non-padded sequences.
    std::vector<float> ref(qf.size(), 0.0f);
    {
      HostAttentionBatch cb;
      std::vector<float> cqv;
      std::vector<int> token_of;  // CPU token -> GPU token
      for (int s = 0; s < num_seqs; ++s) {
        const int len = kv_lens[static_cast<size_t>(s)];
        if (len == 0) continue;
        const int t0 = q_indptr[static_cast<size_t>(s)], t1 = q_indptr[static_cast<size_t>(s) + 1];
        for (int tk = t0; tk < t1; ++tk) {
          token_of.push_back(tk);
          cqv.insert(cqv.end(), qf.begin() + tk * row, qf.begin() + (tk + 1) * row);
        }
        cb.add_seq(t1 - t0, len, h.pages_of(s), bs, false);
      }
      const int nc = cb.num_tokens();
      std::vector<float> co(cqv.size()), ck = kf, cv = vf;
      ops::LayerKv ckv{Tensor(ck.data(), DType::kF32, {std::max(pages, 1), bs, sh.hk, sh.hd}),
                       Tensor(cv.data(), DType::kF32, {std::max(pages, 1), bs, sh.hk, sh.hd})};
      Tensor cq(cqv.data(), DType::kF32, {nc, sh.hq, sh.hd}), cot(co.data(), DType::kF32, {nc, sh.hq, sh.hd});
      cpu().paged_attention(cq, ckv, cb.host(), scale, sh.window, cot);
      for (int c = 0; c < nc; ++c)
        std::copy(co.begin() + c * row, co.begin() + (c + 1) * row,
                  ref.begin() + token_of[static_cast<size_t>(c)] * row);
    }

    cuda::CudaBackendOptions o;
    o.attention_splits = splits_option;
    auto be = cuda::make_cuda_backend(o);
    ASSERT_NE(be, nullptr);
    auto gk = upload_as(*be, kvt, kf), gv = upload_as(*be, kvt, vf), gq = upload_as(*be, t, qf);
    const DeviceAttentionBatch db(*be, h);
    const ops::AttentionBatch& g = db.b;
    ops::LayerKv gkv{dev_tensor(gk, kvt, {std::max(pages, 1), bs, sh.hk, sh.hd}),
                     dev_tensor(gv, kvt, {std::max(pages, 1), bs, sh.hk, sh.hd})};
    // Output poisoned with NaN (0xFFFF in both 16-bit dtypes) so unwritten rows fail.
    auto go = upload(*be, std::vector<uint16_t>(qf.size(), 0xFFFF));
    Tensor dq = dev_tensor(gq, t, {n, sh.hq, sh.hd}), dout = dev_tensor(go, t, {n, sh.hq, sh.hd});
    be->paged_attention(dq, gkv, g, scale, sh.window, dout);
    const auto got = download<uint16_t>(*be, go, qf.size());
    const std::string tg = tag(what + " hq=" + std::to_string(sh.hq) + " hk=" + std::to_string(sh.hk) +
                               " hd=" + std::to_string(sh.hd) + " window=" + std::to_string(sh.window) + " kv " +
                               std::string(dtype_name(kvt)) + " splits=" + std::to_string(splits_option));
    expect_close(from_half(t, got), ref, tol.nmse, tol.max_rel, tg);
    for (int s = 0; s < num_seqs; ++s) {
      if (kv_lens[static_cast<size_t>(s)] != 0) continue;
      const int tk = q_indptr[static_cast<size_t>(s)];
      for (int64_t i = 0; i < row; ++i)
        ASSERT_EQ(got[static_cast<size_t>(tk * row + i)], 0u) << tg << ": padded sequence " << s;
    }
    if (h.max_q_len == 1) {  // decode step: a stale max_kv_len must not change it (graph contract)
      DeviceMem go2(*be, qf.size() * 2);
      Tensor dout2 = dev_tensor(go2, t, {n, sh.hq, sh.hd});
      ops::AttentionBatch g2 = g;
      g2.max_kv_len = 1;
      be->paged_attention(dq, gkv, g2, scale, sh.window, dout2);
      EXPECT_EQ(download<uint16_t>(*be, go2, qf.size()), got) << tg << ": depends on max_kv_len";
    }
  }
};

// Decode steps: the split-KV decode kernel (hd 64/128, G 1/2/4/8) and the
// generic kernel (hd 96, G 3; a window), padded sequences and long contexts,
// pages of every KV dtype.
TEST_P(HalfAttention, DecodeWithPaddingAndGraphContract) {
  const std::vector<AttnSeq> seqs = {{0, 0}, {1, 0}, {1, 299}, {1, 4098}, {1, 16}, {0, 0}, {1, 1024}};
  for (AttnShape sh : {AttnShape{32, 8, 128, 0}, AttnShape{16, 2, 64, 0}, AttnShape{8, 8, 128, 0},
                       AttnShape{32, 4, 64, 0}, AttnShape{12, 4, 96, 0}, AttnShape{16, 2, 64, 200}}) {
    for (DType kvt : {act(), other_half(act()), DType::kF32}) run(sh, seqs, kvt, 0, hc().decode, "decode");
  }
}

// Prefill and mixed steps (earlier pages, odd lengths, page boundaries,
// single tokens, GQA 1/4/8 and MQA, hd 64/128, windows): pages of the
// activation dtype on the tensor-core prefill kernel, pages of the other
// 16-bit dtype and forced KV splits (the merge in 16 bits) on the generic kernel.
TEST_P(HalfAttention, PrefillAndMixedSteps) {
  const std::vector<AttnSeq> seqs = {{77, 0}, {1, 40}, {130, 66}, {16, 0}, {5, 203}, {33, 1500}};
  for (AttnShape sh : {AttnShape{8, 8, 128, 0}, AttnShape{32, 8, 128, 0}, AttnShape{32, 4, 64, 0},
                       AttnShape{8, 1, 64, 0}, AttnShape{16, 2, 128, 37}}) {
    for (DType kvt : {act(), other_half(act())}) run(sh, seqs, kvt, 0, hc().prefill, "prefill");
    run(sh, seqs, act(), 3, hc().prefill, "prefill");
  }
}

// A ~1B random model (bundled llama-3.2-1b config, dummy weights) in 16 bits
// against the same weights in fp32 on the GPU: 32 prompt tokens, 8 steps;
// activations stay finite through 16 layers.
TEST_P(HalfOps, DummyLlama32_1bAgreesWithFp32) {
  expect_dummy_1b_agrees_with_fp32(hc().dtype, act(), hc().tag, hc().dummy_nmse, hc().dummy_tie_frac);
}

std::string case_name(const ::testing::TestParamInfo<HalfCase>& info) { return info.param.tag; }

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfOps, ::testing::ValuesIn(kHalfCases), case_name);
INSTANTIATE_TEST_SUITE_P(Dtypes, HalfAttention, ::testing::ValuesIn(kHalfCases), case_name);

class HalfCommon : public GpuTest {};

TEST_F(HalfCommon, BackendComputesInF16AndBf16) {
  EXPECT_TRUE(gpu().supports_activation_dtype(DType::kF16));
  EXPECT_TRUE(gpu().supports_activation_dtype(DType::kBF16));
  EXPECT_EQ(gpu().default_activation_dtype(), DType::kBF16);  // auto is bfloat16
}

TEST_F(HalfCommon, FillUniformAndConvertMatchCpuBitForBit) {
  const int64_t n = 100003;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const size_t es = t == DType::kF32 ? 4 : 2;
    std::vector<uint8_t> host(static_cast<size_t>(n) * es);
    Tensor th(host.data(), t, {n});
    cpu().fill_uniform(th, 99, -0.5f, 0.25f);
    DeviceMem g(gpu(), host.size());
    Tensor tg = dev_tensor(g, t, {n});
    gpu().fill_uniform(tg, 99, -0.5f, 0.25f);
    EXPECT_EQ(download<uint8_t>(gpu(), g, host.size()), host) << dtype_name(t);
  }
  const auto src = random_floats(static_cast<size_t>(n), 40, -1e4f, 1e4f);
  auto gs = upload(gpu(), src);
  for (DType t : {DType::kBF16, DType::kF16}) {
    DeviceMem g(gpu(), static_cast<size_t>(n) * 2), back(gpu(), static_cast<size_t>(n) * 4);
    Tensor s = dev_tensor(gs, DType::kF32, {n}), d = dev_tensor(g, t, {n}), b = dev_tensor(back, DType::kF32, {n});
    gpu().convert(s, d);
    gpu().convert(d, b);
    std::vector<uint16_t> host(static_cast<size_t>(n));
    std::vector<float> sc = src, hb(static_cast<size_t>(n));
    Tensor cs(sc.data(), DType::kF32, {n}), cd(host.data(), t, {n}), cb(hb.data(), DType::kF32, {n});
    cpu().convert(cs, cd);
    cpu().convert(cd, cb);
    EXPECT_EQ(download<uint16_t>(gpu(), g, static_cast<size_t>(n)), host) << dtype_name(t);
    EXPECT_EQ(download<float>(gpu(), back, static_cast<size_t>(n)), hb) << dtype_name(t);
  }
}

// Loading a fixture in f16 on the CUDA backend gives F16 activations and KV
// (or the KV dtype asked for); the CPU backend refuses float16.
TEST(F16Load, CpuRefusesCudaAccepts) {
  const std::string path = std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/llama";
  auto cpu = ops::make_cpu_backend(1);
  ModelLoadOptions o;
  o.dtype = "float16";
  auto mc = Model::load(path, *cpu, o);
  ASSERT_FALSE(mc.ok());
  EXPECT_NE(mc.status().to_string().find("float32 only"), std::string::npos) << mc.status().to_string();
  ASSERT_GT(cuda::device_count(), 0);
  auto be = cuda::make_cuda_backend({});
  ASSERT_NE(be, nullptr);
  auto mg = Model::load(path, *be, o);
  ASSERT_TRUE(mg.ok()) << mg.status().to_string();
  EXPECT_EQ((*mg)->activation_dtype(), DType::kF16);
  EXPECT_EQ((*mg)->kv_dtype(), DType::kF16);
  o.kv_cache_dtype = "bfloat16";
  auto mk = Model::load(path, *be, o);
  ASSERT_TRUE(mk.ok()) << mk.status().to_string();
  EXPECT_EQ((*mk)->kv_dtype(), DType::kBF16);
}

}  // namespace
}  // namespace osprey::gpu_test
