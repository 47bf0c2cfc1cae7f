// BF16 compute on the CUDA backend against the CPU reference: row ops,
// matmul (GEMV and cuBLASLt paths, every weight dtype, BF16 and F32 out),
// the fused QKV norm + RoPE + KV write, paged attention with BF16 q and
// pages (decode with padded sequences, the graph contract), prefill attention
// (mixed batches; long prompts and chunks on every mma block shape), the
// seeded fill and conversions; and a dummy Llama-3.2-1B in bf16 against fp32
// on the GPU.
#include <numeric>
#include <optional>

#include "backend/cuda/attention/prefill_attention_mma.h"

#include "batch_runner.h"
#include "model/model.h"
#include "ops/rope_freq.h"

namespace osprey::gpu_test {
namespace {

// Output of 16-bit activations: each element rounded once (2^-9 relative).
constexpr double kBf16OutNmse = 1e-4;

class Bf16Ops : public GpuTest {};

TEST_F(Bf16Ops, RowOpsMatchCpu) {
  for (int64_t d : {64, 257, 4096}) {
    const int64_t n = 7;
    const auto x = round_bf16(random_floats(static_cast<size_t>(n * d), 1, -2, 2));
    const auto y = round_bf16(random_floats(static_cast<size_t>(n * d), 2, -2, 2));
    const auto w = random_floats(static_cast<size_t>(d), 3, 0.5f, 1.5f);
    // CPU reference in fp32 on the rounded inputs.
    std::vector<float> cx = x, cy = y, cout(x.size()), cres = x;
    Tensor tx(cx.data(), DType::kF32, {n, d}), ty(cy.data(), DType::kF32, {n, d}),
        to(cout.data(), DType::kF32, {n, d}), tr(cres.data(), DType::kF32, {n, d});
    std::vector<float> wv = w;
    Tensor tw(wv.data(), DType::kF32, {d});
    auto gx = upload(gpu(), to_bf16(x)), gy = upload(gpu(), to_bf16(y)), gw = upload(gpu(), w);
    DeviceMem go(gpu(), static_cast<size_t>(n * d) * 2);
    Tensor dx = dev_tensor(gx, DType::kBF16, {n, d}), dy = dev_tensor(gy, DType::kBF16, {n, d});
    Tensor dout = dev_tensor(go, DType::kBF16, {n, d}), dw = dev_tensor(gw, DType::kF32, {d});
    const std::string tag = " d=" + std::to_string(d);

    cpu().rms_norm(tx, tw, 1e-5f, to);
    gpu().rms_norm(dx, dw, 1e-5f, dout);
    expect_close(from_bf16(download<uint16_t>(gpu(), go, x.size())), cout, kBf16OutNmse, 1e-2, "rms_norm" + tag);

    cpu().add_rms_norm(tr, ty, tw, 1e-5f, to);
    gpu().add_rms_norm(dx, dy, dw, 1e-5f, dout);  // dx is the residual now
    expect_close(from_bf16(download<uint16_t>(gpu(), gx, x.size())), cres, kBf16OutNmse, 1e-2, "residual" + tag);
    expect_close(from_bf16(download<uint16_t>(gpu(), go, x.size())), cout, kBf16OutNmse, 2e-2, "add_rms_norm" + tag);

    if (d % 2 == 0) {
      const int64_t f = d / 2;
      Tensor cg(cy.data(), DType::kF32, {n, d});
      Tensor cact(cout.data(), DType::kF32, {n, f});
      cpu().silu_mul(cg, cact);
      Tensor dact = dev_tensor(go, DType::kBF16, {n, f});
      gpu().silu_mul(dy, dact);
      std::vector<float> ref(cout.begin(), cout.begin() + n * f);
      expect_close(from_bf16(download<uint16_t>(gpu(), go, static_cast<size_t>(n * f))), ref, kBf16OutNmse, 1e-2,
                   "silu_mul" + tag);
    }
  }
}

TEST_F(Bf16Ops, MatmulEveryWeightDtypeAndPath) {
  const int64_t m = 1000, k = 320;  // odd number of output rows
  for (DType wt : {DType::kBF16, DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    const auto wf = random_floats(static_cast<size_t>(m * k), 10, -0.5f, 0.5f);
    const auto packed = pack(wt, wf, m, k);
    // BF16 activations see the weights rounded to bf16 on the cuBLASLt
    // path, so the reference uses the unpacked weights (and bounds allow bf16).
    const auto wref = unpack(wt, packed, m, k);
    auto gw = upload_bytes(gpu(), packed.data(), packed.size());
    const auto bias = random_floats(static_cast<size_t>(m), 12);
    auto gb = upload(gpu(), bias);
    for (int64_t n : {1, 5, 8, 9, 33, 70}) {
      for (bool with_bias : {false, true}) {
        for (DType ot : {DType::kBF16, DType::kF32}) {
          const auto x = round_bf16(random_floats(static_cast<size_t>(n * k), 11 + static_cast<uint32_t>(n)));
          std::vector<double> ref(static_cast<size_t>(n * m));
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < m; ++j) {
              double s = with_bias ? bias[static_cast<size_t>(j)] : 0.0;
              for (int64_t c = 0; c < k; ++c) s += double{x[static_cast<size_t>(i * k + c)]} * wref[static_cast<size_t>(j * k + c)];
              ref[static_cast<size_t>(i * m + j)] = s;
            }
          auto gx = upload(gpu(), to_bf16(x));
          const size_t es = ot == DType::kF32 ? 4 : 2;
          DeviceMem go(gpu(), static_cast<size_t>(n * m) * es);
          Tensor dx = dev_tensor(gx, DType::kBF16, {n, k}), dwt = dev_tensor(gw, wt, {m, k});
          Tensor dout = dev_tensor(go, ot, {n, m});
          gpu().matmul(dx, dwt, with_bias ? dev_tensor(gb, DType::kF32, {m}) : Tensor(), dout);
          std::vector<float> got;
          if (ot == DType::kF32) {
            got = download<float>(gpu(), go, static_cast<size_t>(n * m));
          } else {
            got = from_bf16(download<uint16_t>(gpu(), go, static_cast<size_t>(n * m)));
          }
          // F32/F16 weights are rounded to bf16 on the GEMM path: 2^-9 relative per product.
          expect_close(got, ref, 2e-5 + (ot == DType::kBF16 ? kBf16OutNmse : 0.0), 3e-2,
                       std::string("matmul ") + std::string(dtype_name(wt)) + " n=" + std::to_string(n) +
                           (with_bias ? " bias" : "") + " out " + std::string(dtype_name(ot)));
        }
      }
    }
  }
}

// Slots: a permutation of pages with some tokens skipped (-1).
std::vector<int32_t> make_slots(int n, int num_slots, uint32_t seed) {
  std::vector<int32_t> s(static_cast<size_t>(num_slots));
  std::iota(s.begin(), s.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(s.begin(), s.end(), rng);
  s.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; i += 4) s[static_cast<size_t>(i)] = -1;
  return s;
}

TEST_F(Bf16Ops, FusedQkvRopeKvWriteMatchesCpu) {
  struct Shape {
    int hq, hk, hd;
  };
  for (Shape sh : {Shape{8, 8, 64}, Shape{8, 2, 128}, Shape{16, 2, 64}, Shape{4, 1, 128}}) {
    for (bool norm : {false, true}) {
      for (DType act : {DType::kF32, DType::kBF16}) {
        for (DType kvt : {DType::kF32, DType::kBF16}) {
          const int n = 11, bs = 4, num_blocks = 8, num_slots = bs * num_blocks;
          const int64_t cols = int64_t{sh.hq + 2 * sh.hk} * sh.hd;
          auto qkv = random_floats(static_cast<size_t>(n * cols), 20, -2, 2);
          if (act == DType::kBF16) qkv = round_bf16(qkv);
          std::vector<int32_t> pos(static_cast<size_t>(n));
          for (int i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = 3 * i + 1000 * (i % 3);
          const auto slots = make_slots(n, num_slots, 21);
          const auto qn = random_floats(static_cast<size_t>(sh.hd), 22, 0.5f, 1.5f);
          const auto kn = random_floats(static_cast<size_t>(sh.hd), 23, 0.5f, 1.5f);
          auto inv = ops::make_rope_inv_freq(500000.0f, sh.hd, {});
          // CPU reference (fp32).
          const size_t cache_elems = static_cast<size_t>(num_slots) * sh.hk * sh.hd;
          const size_t kv_es = kvt == DType::kF32 ? 4 : 2;
          std::vector<uint8_t> ck(cache_elems * kv_es), cv(cache_elems * kv_es);
          std::vector<float> cq(static_cast<size_t>(n) * sh.hq * sh.hd);
          std::vector<float> qkv_c = qkv, qn_c = qn, kn_c = kn;
          ops::LayerKv ckv{Tensor(ck.data(), kvt, {num_blocks, bs, sh.hk, sh.hd}),
                           Tensor(cv.data(), kvt, {num_blocks, bs, sh.hk, sh.hd})};
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
          auto gqkv = act == DType::kF32 ? upload(gpu(), qkv) : upload(gpu(), to_bf16(qkv));
          auto gpos = upload(gpu(), pos), gslots = upload(gpu(), slots), ginv = upload(gpu(), inv);
          auto gqn = upload(gpu(), qn), gkn = upload(gpu(), kn);
          DeviceMem gk(gpu(), cache_elems * kv_es), gv(gpu(), cache_elems * kv_es);
          const size_t aes = act == DType::kF32 ? 4 : 2;
          DeviceMem gq(gpu(), cq.size() * aes);
          ops::LayerKv gkv{dev_tensor(gk, kvt, {num_blocks, bs, sh.hk, sh.hd}),
                           dev_tensor(gv, kvt, {num_blocks, bs, sh.hk, sh.hd})};
          ops::AttentionBatch gb = cb;
          gb.positions = gpos.as<int32_t>();
          gb.slot_mapping = gslots.as<int32_t>();
          ops::RopeTable grt = rt;
          grt.inv_freq = ginv.as<float>();
          Tensor gq3 = dev_tensor(gq, act, {n, sh.hq, sh.hd});
          gpu().qkv_rope_kv_write(dev_tensor(gqkv, act, {n, cols}),
                                  norm ? dev_tensor(gqn, DType::kF32, {sh.hd}) : Tensor(),
                                  norm ? dev_tensor(gkn, DType::kF32, {sh.hd}) : Tensor(), 1e-6f, grt, gb, gkv, gq3);
          const std::string tag = "qkv hq=" + std::to_string(sh.hq) + " hk=" + std::to_string(sh.hk) +
                                  " hd=" + std::to_string(sh.hd) + (norm ? " norm" : "") + " act " +
                                  std::string(dtype_name(act)) + " kv " + std::string(dtype_name(kvt));
          std::vector<float> q_got = act == DType::kF32 ? download<float>(gpu(), gq, cq.size())
                                                        : from_bf16(download<uint16_t>(gpu(), gq, cq.size()));
          const double nmse = act == DType::kF32 ? 1e-11 : kBf16OutNmse;
          const double rel = act == DType::kF32 ? 1e-5 : 2e-2;
          expect_close(q_got, cq, nmse, rel, tag + " q");
          auto as_float = [&](const std::vector<uint8_t>& b) {
            std::vector<float> f(cache_elems);
            dequantize_row(kvt, b.data(), f.data(), static_cast<int64_t>(cache_elems));
            return f;
          };
          expect_close(as_float(download<uint8_t>(gpu(), gk, cache_elems * kv_es)), as_float(ck),
                       nmse + (kvt == DType::kBF16 ? kBf16OutNmse : 0), rel + (kvt == DType::kBF16 ? 2e-2 : 0),
                       tag + " k pages");
          expect_close(as_float(download<uint8_t>(gpu(), gv, cache_elems * kv_es)), as_float(cv),
                       nmse + (kvt == DType::kBF16 ? kBf16OutNmse : 0), rel + (kvt == DType::kBF16 ? 2e-2 : 0),
                       tag + " v pages");
        }
      }
    }
  }
}

// One decode step over sequences of lengths `lens` (0 = a padded sequence:
// kv_len 0, slot -1), K/V pages BF16, q BF16; against the CPU on the same
// (rounded) values. Also checks that the result does not depend on the
// step's max_kv_len / max_q_len (the graph contract).
TEST_F(Bf16Ops, DecodeAttentionBf16WithPaddingAndGraphContract) {
  struct Shape {
    int hq, hk, hd;
  };
  for (Shape sh : {Shape{8, 8, 128}, Shape{32, 8, 128}, Shape{32, 4, 64}, Shape{16, 2, 64}}) {
    const std::vector<int> lens = {0, 1, 300, 4099, 17, 0, 1025};
    const int bs = 16;
    const int num_seqs = static_cast<int>(lens.size());
    std::vector<int32_t> q_indptr = {0}, kv_lens, block_indptr = {0}, block_indices, positions, slots;
    int pages = 0;
    for (int s = 0; s < num_seqs; ++s) {
      const int len = lens[static_cast<size_t>(s)];
      const int np = (len + bs - 1) / bs;
      q_indptr.push_back(s + 1);
      kv_lens.push_back(len);
      for (int p = 0; p < np; ++p) block_indices.push_back(pages + np - 1 - p);  // reversed pages
      pages += np;
      block_indptr.push_back(static_cast<int32_t>(block_indices.size()));
      positions.push_back(std::max(0, len - 1));
      slots.push_back(-1);  // the K/V of this step is already in the pages
    }
    const int64_t page_elems = int64_t{bs} * sh.hk * sh.hd;
    auto kf = round_bf16(random_floats(static_cast<size_t>(pages * page_elems), 30));
    auto vf = round_bf16(random_floats(static_cast<size_t>(pages * page_elems), 31));
    auto qf = round_bf16(random_floats(static_cast<size_t>(num_seqs) * sh.hq * sh.hd, 32, -3, 3));
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
    // CPU: F32 pages holding the bf16 values.
    std::vector<float> cout(qf.size());
    ops::LayerKv ckv{Tensor(kf.data(), DType::kF32, {pages, bs, sh.hk, sh.hd}),
                     Tensor(vf.data(), DType::kF32, {pages, bs, sh.hk, sh.hd})};
    ops::AttentionBatch b;
    b.num_seqs = num_seqs;
    b.num_tokens = num_seqs;
    b.max_q_len = 1;
    b.max_kv_len = *std::max_element(lens.begin(), lens.end());
    b.q_indptr = q_indptr.data();
    b.kv_lens = kv_lens.data();
    b.block_indptr = block_indptr.data();
    b.block_indices = block_indices.data();
    b.positions = positions.data();
    b.slot_mapping = slots.data();
    // The CPU reference takes no padded sequences: run it on the others
    // and expect zeros for the padded ones.
    {
      std::vector<int32_t> cqi = {0}, ckl, cbi = {0}, cbx, cpos;
      std::vector<float> cqv;
      const int64_t row = int64_t{sh.hq} * sh.hd;
      for (int s = 0; s < num_seqs; ++s) {
        if (lens[static_cast<size_t>(s)] == 0) continue;
        cqi.push_back(cqi.back() + 1);
        ckl.push_back(kv_lens[static_cast<size_t>(s)]);
        cbx.insert(cbx.end(), block_indices.begin() + block_indptr[static_cast<size_t>(s)],
                   block_indices.begin() + block_indptr[static_cast<size_t>(s) + 1]);
        cbi.push_back(static_cast<int32_t>(cbx.size()));
        cpos.push_back(positions[static_cast<size_t>(s)]);
        cqv.insert(cqv.end(), qf.begin() + s * row, qf.begin() + (s + 1) * row);
      }
      const int nc = static_cast<int>(ckl.size());
      std::vector<int32_t> cslots(static_cast<size_t>(nc), -1);
      std::vector<float> co_v(cqv.size());
      ops::AttentionBatch cb = b;
      cb.num_seqs = nc;
      cb.num_tokens = nc;
      cb.q_indptr = cqi.data();
      cb.kv_lens = ckl.data();
      cb.block_indptr = cbi.data();
      cb.block_indices = cbx.data();
      cb.positions = cpos.data();
      cb.slot_mapping = cslots.data();
      Tensor cq(cqv.data(), DType::kF32, {nc, sh.hq, sh.hd});
      Tensor co(co_v.data(), DType::kF32, {nc, sh.hq, sh.hd});
      cpu().paged_attention(cq, ckv, cb, scale, 0, co);
      int c = 0;
      for (int s = 0; s < num_seqs; ++s) {
        if (lens[static_cast<size_t>(s)] == 0) continue;
        std::copy(co_v.begin() + c * row, co_v.begin() + (c + 1) * row, cout.begin() + s * row);
        ++c;
      }
    }
    // GPU: BF16 pages and q.
    auto gk = upload(gpu(), to_bf16(kf)), gv = upload(gpu(), to_bf16(vf)), gq = upload(gpu(), to_bf16(qf));
    auto d_qi = upload(gpu(), q_indptr), d_kl = upload(gpu(), kv_lens), d_bi = upload(gpu(), block_indptr);
    auto d_bx = upload(gpu(), block_indices), d_pos = upload(gpu(), positions), d_sl = upload(gpu(), slots);
    ops::AttentionBatch g = b;
    g.q_indptr = d_qi.as<int32_t>();
    g.kv_lens = d_kl.as<int32_t>();
    g.block_indptr = d_bi.as<int32_t>();
    g.block_indices = d_bx.as<int32_t>();
    g.positions = d_pos.as<int32_t>();
    g.slot_mapping = d_sl.as<int32_t>();
    ops::LayerKv gkv{dev_tensor(gk, DType::kBF16, {pages, bs, sh.hk, sh.hd}),
                     dev_tensor(gv, DType::kBF16, {pages, bs, sh.hk, sh.hd})};
    DeviceMem go(gpu(), qf.size() * 2), go2(gpu(), qf.size() * 2);
    Tensor dq = dev_tensor(gq, DType::kBF16, {num_seqs, sh.hq, sh.hd});
    Tensor dout = dev_tensor(go, DType::kBF16, {num_seqs, sh.hq, sh.hd});
    Tensor dout2 = dev_tensor(go2, DType::kBF16, {num_seqs, sh.hq, sh.hd});
    gpu().paged_attention(dq, gkv, g, scale, 0, dout);
    ops::AttentionBatch g2 = g;
    g2.max_kv_len = 1;  // a stale host scalar must not change a decode step
    gpu().paged_attention(dq, gkv, g2, scale, 0, dout2);
    const auto got = download<uint16_t>(gpu(), go, qf.size());
    const std::string tag = "decode hq=" + std::to_string(sh.hq) + " hk=" + std::to_string(sh.hk) +
                            " hd=" + std::to_string(sh.hd);
    expect_close(from_bf16(got), cout, kBf16OutNmse, 2e-2, tag);
    EXPECT_EQ(got, download<uint16_t>(gpu(), go2, qf.size())) << tag << ": depends on max_kv_len";
    // Padded sequences: exact zeros.
    for (int s = 0; s < num_seqs; ++s) {
      if (lens[static_cast<size_t>(s)] != 0) continue;
      for (int64_t i = 0; i < int64_t{sh.hq} * sh.hd; ++i)
        ASSERT_EQ(got[static_cast<size_t>(s * sh.hq * sh.hd + i)], 0u) << tag << " padded sequence " << s;
    }
  }
}

// A mixed step with BF16 q and pages (the tensor-core prefill kernel):
// sequences with earlier KV (prefix cache / earlier chunks), odd lengths,
// page boundaries, a single-token sequence, GQA 1/4/8, head_dim 64/128, and
// a sliding window; against the CPU on the same rounded values.
TEST_F(Bf16Ops, PrefillAttentionBf16MatchesCpu) {
  struct Shape {
    int hq, hk, hd, window;
  };
  for (Shape sh : {Shape{8, 8, 128, 0}, Shape{32, 8, 128, 0}, Shape{32, 4, 64, 0}, Shape{8, 1, 64, 0},
                   Shape{16, 2, 128, 37}}) {
    // (query tokens, tokens already in the cache before them)
    const std::vector<std::pair<int, int>> seqs = {{77, 0}, {1, 40}, {130, 66}, {16, 0}, {5, 203}};
    const int bs = 16;
    std::vector<int32_t> q_indptr = {0}, kv_lens, block_indptr = {0}, block_indices, positions, slots;
    int pages = 0, max_q = 0, max_kv = 0;
    for (auto [nq, past] : seqs) {
      const int len = past + nq;
      const int np = (len + bs - 1) / bs;
      for (int i = 0; i < nq; ++i) positions.push_back(past + i);
      q_indptr.push_back(q_indptr.back() + nq);
      kv_lens.push_back(len);
      for (int p = 0; p < np; ++p) block_indices.push_back(pages + (p * 7) % np);  // permuted pages
      pages += np;
      block_indptr.push_back(static_cast<int32_t>(block_indices.size()));
      max_q = std::max(max_q, nq);
      max_kv = std::max(max_kv, len);
    }
    const int n = q_indptr.back();
    slots.assign(static_cast<size_t>(n), -1);
    const int64_t page_elems = int64_t{bs} * sh.hk * sh.hd;
    auto kf = round_bf16(random_floats(static_cast<size_t>(pages * page_elems), 50));
    auto vf = round_bf16(random_floats(static_cast<size_t>(pages * page_elems), 51));
    auto qf = round_bf16(random_floats(static_cast<size_t>(n) * sh.hq * sh.hd, 52, -3, 3));
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
    ops::AttentionBatch b;
    b.num_seqs = static_cast<int>(seqs.size());
    b.num_tokens = n;
    b.max_q_len = max_q;
    b.max_kv_len = max_kv;
    b.q_indptr = q_indptr.data();
    b.kv_lens = kv_lens.data();
    b.block_indptr = block_indptr.data();
    b.block_indices = block_indices.data();
    b.positions = positions.data();
    b.slot_mapping = slots.data();
    std::vector<float> cout(qf.size());
    ops::LayerKv ckv{Tensor(kf.data(), DType::kF32, {pages, bs, sh.hk, sh.hd}),
                     Tensor(vf.data(), DType::kF32, {pages, bs, sh.hk, sh.hd})};
    Tensor cq(qf.data(), DType::kF32, {n, sh.hq, sh.hd}), co(cout.data(), DType::kF32, {n, sh.hq, sh.hd});
    cpu().paged_attention(cq, ckv, b, scale, sh.window, co);
    auto gk = upload(gpu(), to_bf16(kf)), gv = upload(gpu(), to_bf16(vf)), gq = upload(gpu(), to_bf16(qf));
    auto d_qi = upload(gpu(), q_indptr), d_kl = upload(gpu(), kv_lens), d_bi = upload(gpu(), block_indptr);
    auto d_bx = upload(gpu(), block_indices), d_pos = upload(gpu(), positions), d_sl = upload(gpu(), slots);
    ops::AttentionBatch g = b;
    g.q_indptr = d_qi.as<int32_t>();
    g.kv_lens = d_kl.as<int32_t>();
    g.block_indptr = d_bi.as<int32_t>();
    g.block_indices = d_bx.as<int32_t>();
    g.positions = d_pos.as<int32_t>();
    g.slot_mapping = d_sl.as<int32_t>();
    ops::LayerKv gkv{dev_tensor(gk, DType::kBF16, {pages, bs, sh.hk, sh.hd}),
                     dev_tensor(gv, DType::kBF16, {pages, bs, sh.hk, sh.hd})};
    DeviceMem go(gpu(), qf.size() * 2);
    Tensor dq = dev_tensor(gq, DType::kBF16, {n, sh.hq, sh.hd}), dout = dev_tensor(go, DType::kBF16, {n, sh.hq, sh.hd});
    gpu().paged_attention(dq, gkv, g, scale, sh.window, dout);
    // P is rounded to bf16 before P V: a little more error than the output rounding alone.
    expect_close(from_bf16(download<uint16_t>(gpu(), go, qf.size())), cout, 3 * kBf16OutNmse, 3e-2,
                 "prefill hq=" + std::to_string(sh.hq) + " hk=" + std::to_string(sh.hk) + " hd=" +
                     std::to_string(sh.hd) + " window=" + std::to_string(sh.window));
  }
}

TEST_F(Bf16Ops, FillUniformAndConvertMatchCpuBitForBit) {
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

// A ~1B random model (bundled llama-3.2-1b config, dummy weights) in bf16
// against the same weights in fp32 on the GPU: 32 prompt tokens, 8 steps.
TEST(DummyModel, Llama32_1bBf16AgreesWithFp32) {
  expect_dummy_1b_agrees_with_fp32("bfloat16", DType::kBF16, "bf16", 2e-2, 5e-2);
}

}  // namespace
}  // namespace osprey::gpu_test
