// Backend::matmul_silu_mul on CUDA: at one activation row of 16-bit weights
// it is one kernel (gemm/gemv.cu, launch_gemv_silu_mul) that must give
// exactly what matmul then silu_mul give (the gate_up scratch is left
// unwritten), near a double-precision reference; more rows take the two-op
// path. (The batch-1 decode chain with it, queued and as a graph against the
// serialised ops, is MatmulTest.DecodeChainQueuedEqualsSerialised.)
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "gpu_test_util.h"
#include "ops/rope_freq.h"

namespace osprey::gpu_test {
namespace {

std::vector<uint8_t> pack16(DType t, const std::vector<float>& v) {
  return pack(t, v, 1, static_cast<int64_t>(v.size()));
}

bool fused_switched_off() {
  const char* v = std::getenv("OSPREY_FUSED_SILU");
  return v != nullptr && std::string(v) == "0";
}

// out = silu(x W_g^T) * (x W_u^T) for x [n, k] of act, w [2 f, k] of wt.
void check_matmul_silu_mul(ops::Backend& be, DType act, DType wt, int64_t n, int64_t f, int64_t k, uint32_t seed) {
  const std::string what = std::string(dtype_name(act)) + " x " + std::string(dtype_name(wt)) +
                           " n=" + std::to_string(n) + " f=" + std::to_string(f) + " k=" + std::to_string(k);
  const auto xb = pack16(act, random_floats(static_cast<size_t>(n * k), seed, -1.0f, 1.0f));
  const auto wb = pack(wt, random_floats(static_cast<size_t>(2 * f * k), seed + 1, -0.1f, 0.1f), 2 * f, k);
  const auto xd = unpack(act, xb, n, k);
  const auto wd = unpack(wt, wb, 2 * f, k);
  const auto round_act = [&](double v) {
    const auto r = unpack(act, pack16(act, {static_cast<float>(v)}), 1, 1);
    return r[0];
  };
  std::vector<double> ref(static_cast<size_t>(n * f));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < f; ++j) {
      double g = 0.0, u = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double x = xd[static_cast<size_t>(i * k + c)];
        g += x * wd[static_cast<size_t>(j * k + c)];
        u += x * wd[static_cast<size_t>((f + j) * k + c)];
      }
      g = round_act(g);
      u = round_act(u);
      ref[static_cast<size_t>(i * f + j)] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  const std::vector<uint8_t> poison_gu(static_cast<size_t>(n * 2 * f * 2), 0xff);  // NaN in F16 and BF16
  const std::vector<uint8_t> poison_out(static_cast<size_t>(n * f * 2), 0xff);
  DeviceMem gx = upload(be, xb), gw = upload(be, wb);
  DeviceMem ggu = upload(be, poison_gu), gout = upload(be, poison_out);
  DeviceMem ggu2 = upload(be, poison_gu), gout2 = upload(be, poison_out);
  Tensor x = dev_tensor(gx, act, {n, k}), w = dev_tensor(gw, wt, {2 * f, k});
  Tensor gu = dev_tensor(ggu, act, {n, 2 * f}), out = dev_tensor(gout, act, {n, f});
  Tensor gu2 = dev_tensor(ggu2, act, {n, 2 * f}), out2 = dev_tensor(gout2, act, {n, f});
  be.matmul_silu_mul(x, w, gu, out);
  be.matmul(x, w, Tensor(), gu2);
  be.silu_mul(gu2, out2);
  const auto fused = download<uint8_t>(be, gout, poison_out.size());
  EXPECT_EQ(fused, download<uint8_t>(be, gout2, poison_out.size())) << what << ": not bit for bit the two ops";
  const bool w16 = wt == DType::kBF16 || wt == DType::kF16;
  if (n == 1 && w16 && !fused_switched_off()) {
    EXPECT_EQ(download<uint8_t>(be, ggu, poison_gu.size()), poison_gu) << what << ": gate_up written (not fused)";
  }
  const auto got = unpack(act, fused, n, f);
  // Rounding: g and u to act, the output to act (2^-9 relative for BF16).
  // A sum on the other side of a rounding boundary moves g or u by one ulp.
  const bool bf16 = act == DType::kBF16;
  expect_close(std::vector<double>(got.begin(), got.end()), ref, bf16 ? 3e-5 : 1e-6, bf16 ? 1.6e-2 : 2e-3, what);
}

class FusedDecodeTest : public GpuTest {};

TEST_F(FusedDecodeTest, MatmulSiluMulMatchesTwoOpsAndReference) {
  uint32_t seed = 7000;
  for (DType act : {DType::kBF16, DType::kF16}) {
    for (DType wt : {DType::kBF16, DType::kF16}) {
      check_matmul_silu_mul(gpu(), act, wt, 1, 4, 8, seed += 7);        // one block
      check_matmul_silu_mul(gpu(), act, wt, 1, 37, 40, seed += 7);      // f % 4 != 0: the last block's tail
      check_matmul_silu_mul(gpu(), act, wt, 1, 1024, 2056, seed += 7);  // k not a multiple of the lane stride
    }
    check_matmul_silu_mul(gpu(), act, act, 3, 64, 256, seed += 7);  // more rows: the two-op path
  }
  check_matmul_silu_mul(gpu(), DType::kBF16, DType::kBF16, 1, 14336 / 8, 4096, seed += 7);
  check_matmul_silu_mul(gpu(), DType::kBF16, DType::kQ8_0, 1, 64, 256, seed += 7);  // not 16-bit: two ops
}

// The attention part of decode steps (qkv GEMM -> qkv_rope_kv_write ->
// paged_attention -> o GEMM -> residual add, three layers), queued back to
// back and as a CUDA graph, must give bit for bit what the same ops give
// with the stream drained after each. qkv_rope_kv_write and the decode
// attention kernel run with programmatic dependent launch: the attention
// starts copying the K/V of earlier positions before qkv_rope_kv_write has
// finished. Before every run the pages hold the earlier positions' K/V and
// NaN in each sequence's new slot, and the activations are NaN, so a read of
// this step's K/V or q before they are written shows.
void check_attention_chain(ops::Backend& be, const std::vector<int>& kv_lens, uint32_t seed) {
  constexpr int hq = 8, hk = 2, hd = 128, bs = 16, d = 512, layers = 3;
  const int n = static_cast<int>(kv_lens.size());
  const int qkv_cols = (hq + 2 * hk) * hd;
  HostAttentionBatch hb;
  int pages = 0;
  for (int len : kv_lens) {
    std::vector<int32_t> p(static_cast<size_t>((len + bs - 1) / bs));
    for (auto& x : p) x = pages++;
    std::reverse(p.begin(), p.end());  // not in order
    hb.add_seq(1, len, p, bs, true);
  }
  DeviceAttentionBatch db(be, hb);
  db.b.num_leading_decodes = n;
  const size_t page_elems = static_cast<size_t>(pages) * bs * hk * hd;
  // Earlier positions' K/V: random; every sequence's new slot: NaN.
  std::vector<std::vector<uint16_t>> k0, v0;
  for (int l = 0; l < layers; ++l) {
    k0.push_back(to_bf16(random_floats(page_elems, seed + 10 * l, -1.0f, 1.0f)));
    v0.push_back(to_bf16(random_floats(page_elems, seed + 10 * l + 1, -1.0f, 1.0f)));
    for (int32_t slot : hb.slots) {
      for (int e = 0; e < hk * hd; ++e) {
        k0.back()[static_cast<size_t>(slot) * hk * hd + e] = 0xffff;
        v0.back()[static_cast<size_t>(slot) * hk * hd + e] = 0xffff;
      }
    }
  }
  std::vector<DeviceMem> gk, gv, gwqkv, gwo;
  std::vector<ops::LayerKv> kv;
  for (int l = 0; l < layers; ++l) {
    gk.emplace_back(be, page_elems * 2);
    gv.emplace_back(be, page_elems * 2);
    gwqkv.push_back(upload(be, to_bf16(random_floats(static_cast<size_t>(qkv_cols) * d, seed + 100 + l, -0.05f, 0.05f))));
    gwo.push_back(upload(be, to_bf16(random_floats(static_cast<size_t>(d) * hq * hd, seed + 200 + l, -0.05f, 0.05f))));
  }
  for (int l = 0; l < layers; ++l)
    kv.push_back({dev_tensor(gk[static_cast<size_t>(l)], DType::kBF16, {pages, bs, hk, hd}),
                  dev_tensor(gv[static_cast<size_t>(l)], DType::kBF16, {pages, bs, hk, hd})});
  const auto x0 = to_bf16(random_floats(static_cast<size_t>(n) * d, seed + 300, -1.0f, 1.0f));
  DeviceMem gx(be, x0.size() * 2), gqkv(be, static_cast<size_t>(n) * qkv_cols * 2),
      gq(be, static_cast<size_t>(n) * hq * hd * 2), gattn(be, static_cast<size_t>(n) * hq * hd * 2),
      gproj(be, static_cast<size_t>(n) * d * 2);
  const std::vector<float> inv = ops::make_rope_inv_freq(500000.0f, hd, {});
  DeviceMem ginv = upload(be, inv);
  ops::RopeTable rt;
  rt.inv_freq = ginv.as<float>();
  rt.rotary_dim = hd;
  Tensor x = dev_tensor(gx, DType::kBF16, {n, d}), qkv = dev_tensor(gqkv, DType::kBF16, {n, qkv_cols});
  Tensor q = dev_tensor(gq, DType::kBF16, {n, hq, hd}), attn = dev_tensor(gattn, DType::kBF16, {n, hq, hd});
  Tensor attn2 = dev_tensor(gattn, DType::kBF16, {n, hq * hd}), proj = dev_tensor(gproj, DType::kBF16, {n, d});
  const std::vector<uint16_t> poison(static_cast<size_t>(n) * qkv_cols, 0xffff);
  auto reset = [&] {
    be.copy_to_device(gx.get(), x0.data(), x0.size() * 2);
    for (int l = 0; l < layers; ++l) {
      be.copy_to_device(gk[static_cast<size_t>(l)].get(), k0[static_cast<size_t>(l)].data(), page_elems * 2);
      be.copy_to_device(gv[static_cast<size_t>(l)].get(), v0[static_cast<size_t>(l)].data(), page_elems * 2);
    }
    for (DeviceMem* m : {&gqkv, &gq, &gattn, &gproj}) be.copy_to_device(m->get(), poison.data(), m->bytes());
    be.synchronize();
  };
  auto chain = [&](bool serial) {
    auto step = [&] {
      if (serial) be.synchronize();
    };
    for (int l = 0; l < layers; ++l) {
      be.matmul(x, dev_tensor(gwqkv[static_cast<size_t>(l)], DType::kBF16, {qkv_cols, d}), Tensor(), qkv);
      step();
      be.qkv_rope_kv_write(qkv, Tensor(), Tensor(), 1e-6f, rt, db.b, kv[static_cast<size_t>(l)], q);
      step();
      be.paged_attention(q, kv[static_cast<size_t>(l)], db.b, 1.0f / std::sqrt(static_cast<float>(hd)), 0, attn);
      step();
      be.matmul(attn2, dev_tensor(gwo[static_cast<size_t>(l)], DType::kBF16, {d, hq * hd}), Tensor(), proj);
      step();
      be.add(x, proj);
      step();
    }
  };
  const std::string what = "attention chain, " + std::to_string(n) + " sequences";
  reset();
  chain(true);
  const auto want = download<uint16_t>(be, gx, x0.size());
  int finite = 0;
  for (uint16_t v : want) finite += std::isfinite(bf16_to_f32(v)) ? 1 : 0;
  ASSERT_EQ(finite, static_cast<int>(want.size())) << what << ": the serialised chain must give finite values";
  for (int rep = 0; rep < 3; ++rep) {
    reset();
    chain(false);
    EXPECT_EQ(download<uint16_t>(be, gx, x0.size()), want) << what << ", queued run " << rep;
  }
  if (be.supports_graphs()) {
    reset();
    be.begin_capture();
    chain(false);
    auto graph = be.end_capture();
    ASSERT_NE(graph, nullptr);
    for (int rep = 0; rep < 3; ++rep) {
      reset();
      graph->launch();
      EXPECT_EQ(download<uint16_t>(be, gx, x0.size()), want) << what << ", graph replay " << rep;
    }
  }
}

TEST_F(FusedDecodeTest, AttentionChainQueuedEqualsSerialised) {
  check_attention_chain(gpu(), {700}, 8100);                      // batch 1: the GEMV chain, split KV
  check_attention_chain(gpu(), {700, 33, 1, 256, 1500, 17}, 8200);  // short, one-token and long contexts
  std::vector<int> many(40);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 64 + 37 * static_cast<int>(i);
  check_attention_chain(gpu(), many, 8300);  // cuBLASLt GEMMs around it
}

}  // namespace
}  // namespace osprey::gpu_test
