// Row-wise ops of the CUDA backend against the CPU backend on the same random
// inputs: embedding (every table dtype), rms_norm, add_rms_norm, add,
// head_rms_norm, rope, silu_mul, gather_rows; empty and single-row cases.
#include <numeric>

#include "gpu_test_util.h"
#include "ops/rope_freq.h"

namespace osprey::gpu_test {
namespace {

constexpr DType kWeightTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1};

class OpsTest : public GpuTest {};

TEST_F(OpsTest, EmbeddingAllDtypes) {
  uint32_t seed = 1;
  for (DType t : kWeightTypes) {
    for (int64_t d : {32, 64, 576, 4096}) {
      for (int64_t n : {0, 1, 7, 33}) {
        const int64_t vocab = 301;
        auto table = pack(t, random_floats(static_cast<size_t>(vocab * d), seed++), vocab, d);
        std::vector<int32_t> ids(static_cast<size_t>(n));
        std::mt19937 rng(seed++);
        for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
        if (n > 2) ids[1] = static_cast<int32_t>(vocab - 1);
        std::vector<float> ref(static_cast<size_t>(n * d), -1.0f);
        Tensor ct(table.data(), t, {vocab, d});
        Tensor co(ref.data(), DType::kF32, {n, d});
        cpu().embedding(ct, ids.data(), co);

        DeviceMem gt = upload(gpu(), table), gi = upload(gpu(), ids);
        DeviceMem go(gpu(), static_cast<size_t>(std::max<int64_t>(1, n * d)) * 4);
        Tensor gtt(gt.get(), t, {vocab, d}, Device::kCuda);
        Tensor got = dev_tensor(go, DType::kF32, {n, d});
        gpu().embedding(gtt, gi.as<int32_t>(), got);
        auto out = download<float>(gpu(), go, static_cast<size_t>(n * d));
        expect_close(out, ref, 1e-14, 1e-6,
                     std::string("embedding ") + std::string(dtype_name(t)) + " d=" + std::to_string(d) +
                         " n=" + std::to_string(n));
      }
    }
  }
}

TEST_F(OpsTest, EmbeddingOutOfRangeIdGivesZeroRow) {
  const int64_t vocab = 5, d = 8;
  auto table = random_floats(static_cast<size_t>(vocab * d), 3);
  std::vector<int32_t> ids = {2, 5, -1};
  DeviceMem gt = upload(gpu(), table), gi = upload(gpu(), ids), go(gpu(), 3 * d * 4);
  Tensor tt(gt.get(), DType::kF32, {vocab, d}, Device::kCuda);
  Tensor ot = dev_tensor(go, DType::kF32, {3, d});
  gpu().embedding(tt, gi.as<int32_t>(), ot);
  auto out = download<float>(gpu(), go, static_cast<size_t>(3 * d));
  for (int64_t i = 0; i < d; ++i) {
    EXPECT_EQ(out[static_cast<size_t>(i)], table[static_cast<size_t>(2 * d + i)]);
    EXPECT_EQ(out[static_cast<size_t>(d + i)], 0.0f);
    EXPECT_EQ(out[static_cast<size_t>(2 * d + i)], 0.0f);
  }
}

TEST_F(OpsTest, RmsNormAndFusedAdd) {
  uint32_t seed = 100;
  for (int64_t d : {1, 31, 64, 576, 2049, 8192}) {
    for (int64_t n : {0, 1, 5, 64}) {
      const std::string tag = " d=" + std::to_string(d) + " n=" + std::to_string(n);
      auto x = random_floats(static_cast<size_t>(n * d), seed++, -3.0f, 3.0f);
      auto r = random_floats(static_cast<size_t>(n * d), seed++, -3.0f, 3.0f);
      auto w = random_floats(static_cast<size_t>(d), seed++, 0.5f, 1.5f);
      const float eps = 1e-6f;
      // CPU reference.
      std::vector<float> ref(x.size()), ref_res = r, ref_fused(x.size());
      {
        Tensor xt(x.data(), DType::kF32, {n, d}), wt(w.data(), DType::kF32, {d}), ot(ref.data(), DType::kF32, {n, d});
        cpu().rms_norm(xt, wt, eps, ot);
        Tensor rt(ref_res.data(), DType::kF32, {n, d}), ft(ref_fused.data(), DType::kF32, {n, d});
        cpu().add_rms_norm(rt, xt, wt, eps, ft);
      }
      DeviceMem gx = upload(gpu(), x), gr = upload(gpu(), r), gw = upload(gpu(), w);
      DeviceMem go(gpu(), std::max<size_t>(1, x.size()) * 4), gf(gpu(), std::max<size_t>(1, x.size()) * 4);
      Tensor xt = dev_tensor(gx, DType::kF32, {n, d}), rt = dev_tensor(gr, DType::kF32, {n, d});
      Tensor wt = dev_tensor(gw, DType::kF32, {d});
      Tensor ot = dev_tensor(go, DType::kF32, {n, d}), ft = dev_tensor(gf, DType::kF32, {n, d});
      gpu().rms_norm(xt, wt, eps, ot);
      gpu().add_rms_norm(rt, xt, wt, eps, ft);
      expect_close(download<float>(gpu(), go, x.size()), ref, 1e-12, 1e-5, "rms_norm" + tag);
      expect_close(download<float>(gpu(), gr, x.size()), ref_res, 0.0, 0.0, "add_rms_norm residual" + tag);
      expect_close(download<float>(gpu(), gf, x.size()), ref_fused, 1e-12, 1e-5, "add_rms_norm out" + tag);
      // In place, as head_rms_norm runs it: rows of head_dim = d.
      gpu().head_rms_norm(xt, wt, eps);
      expect_close(download<float>(gpu(), gx, x.size()), ref, 1e-12, 1e-5, "head_rms_norm" + tag);
    }
  }
}

TEST_F(OpsTest, HeadRmsNormMatchesCpu) {
  const int64_t n = 9, heads = 6, hd = 128;
  auto x = random_floats(static_cast<size_t>(n * heads * hd), 7, -2.0f, 2.0f);
  auto w = random_floats(static_cast<size_t>(hd), 8, 0.5f, 1.5f);
  std::vector<float> ref = x;
  Tensor ct(ref.data(), DType::kF32, {n, heads, hd}), cw(w.data(), DType::kF32, {hd});
  cpu().head_rms_norm(ct, cw, 1e-6f);
  DeviceMem gx = upload(gpu(), x), gw = upload(gpu(), w);
  Tensor gt = dev_tensor(gx, DType::kF32, {n, heads, hd}), gwt = dev_tensor(gw, DType::kF32, {hd});
  gpu().head_rms_norm(gt, gwt, 1e-6f);
  expect_close(download<float>(gpu(), gx, x.size()), ref, 1e-12, 1e-5, "head_rms_norm [9, 6, 128]");
}

TEST_F(OpsTest, AddAndSiluMul) {
  uint32_t seed = 200;
  for (int64_t n : {0, 1, 3, 77}) {
    for (int64_t f : {1, 160, 1536}) {
      const std::string tag = " n=" + std::to_string(n) + " f=" + std::to_string(f);
      auto gu = random_floats(static_cast<size_t>(n * 2 * f), seed++, -8.0f, 8.0f);
      std::vector<float> ref(static_cast<size_t>(n * f));
      Tensor cg(gu.data(), DType::kF32, {n, 2 * f}), co(ref.data(), DType::kF32, {n, f});
      cpu().silu_mul(cg, co);
      DeviceMem g = upload(gpu(), gu), o(gpu(), std::max<size_t>(1, ref.size()) * 4);
      Tensor gt = dev_tensor(g, DType::kF32, {n, 2 * f}), ot = dev_tensor(o, DType::kF32, {n, f});
      gpu().silu_mul(gt, ot);
      expect_close(download<float>(gpu(), o, ref.size()), ref, 1e-12, 1e-5, "silu_mul" + tag);

      auto a = random_floats(static_cast<size_t>(n * f), seed++), b = random_floats(static_cast<size_t>(n * f), seed++);
      std::vector<float> sum = a;
      Tensor ca(sum.data(), DType::kF32, {n, f}), cb(b.data(), DType::kF32, {n, f});
      cpu().add(ca, cb);
      DeviceMem ga = upload(gpu(), a), gb = upload(gpu(), b);
      Tensor gat = dev_tensor(ga, DType::kF32, {n, f}), gbt = dev_tensor(gb, DType::kF32, {n, f});
      gpu().add(gat, gbt);
      expect_close(download<float>(gpu(), ga, sum.size()), sum, 0.0, 0.0, "add" + tag);
    }
  }
}

TEST_F(OpsTest, RopeMatchesCpu) {
  uint32_t seed = 300;
  struct Case {
    int n, hq, hk, hd;
    float theta;
    ops::RopeScalingParams scaling;
  };
  ops::RopeScalingParams llama3;
  llama3.type = ops::RopeScalingParams::Type::kLlama3;
  llama3.factor = 8.0f;
  llama3.original_max_position_embeddings = 8192;
  for (const Case& c : {Case{1, 9, 3, 64, 1e4f, {}}, Case{37, 8, 2, 128, 5e5f, llama3}, Case{5, 4, 4, 16, 1e6f, {}},
                        Case{3, 32, 8, 256, 1e4f, {}}, Case{0, 4, 2, 64, 1e4f, {}}}) {
    const std::string tag = " n=" + std::to_string(c.n) + " hq=" + std::to_string(c.hq) + " hd=" + std::to_string(c.hd);
    auto inv = ops::make_rope_inv_freq(c.theta, c.hd, c.scaling);
    auto q = random_floats(static_cast<size_t>(c.n * c.hq * c.hd), seed++);
    auto k = random_floats(static_cast<size_t>(c.n * c.hk * c.hd), seed++);
    std::vector<int32_t> pos(static_cast<size_t>(c.n));
    std::mt19937 rng(seed++);
    for (auto& p : pos) p = static_cast<int32_t>(rng() % 20000);
    if (c.n > 0) pos[0] = 0;
    std::vector<float> rq = q, rk = k;
    ops::RopeTable ct;
    ct.inv_freq = inv.data();
    ct.rotary_dim = c.hd;
    Tensor cq(rq.data(), DType::kF32, {c.n, c.hq, c.hd}), ck(rk.data(), DType::kF32, {c.n, c.hk, c.hd});
    cpu().rope(cq, ck, pos.data(), ct);

    DeviceMem gq = upload(gpu(), q), gk = upload(gpu(), k), gp = upload(gpu(), pos), gf = upload(gpu(), inv);
    Tensor tq = dev_tensor(gq, DType::kF32, {c.n, c.hq, c.hd}), tk = dev_tensor(gk, DType::kF32, {c.n, c.hk, c.hd});
    ops::RopeTable gt = ct;
    gt.inv_freq = gf.as<float>();
    gpu().rope(tq, tk, gp.as<int32_t>(), gt);
    // cos/sin of angles up to ~2e4 rad: a few ulp between libm and CUDA.
    expect_close(download<float>(gpu(), gq, q.size()), rq, 1e-12, 2e-6, "rope q" + tag);
    expect_close(download<float>(gpu(), gk, k.size()), rk, 1e-12, 2e-6, "rope k" + tag);
    // A table in host memory works too.
    if (c.n > 0) {
      DeviceMem hq2 = upload(gpu(), q), hk2 = upload(gpu(), k);
      Tensor tq2 = dev_tensor(hq2, DType::kF32, {c.n, c.hq, c.hd}),
             tk2 = dev_tensor(hk2, DType::kF32, {c.n, c.hk, c.hd});
      gpu().rope(tq2, tk2, gp.as<int32_t>(), ct);
      expect_close(download<float>(gpu(), hq2, q.size()), rq, 1e-12, 2e-6, "rope q, host table" + tag);
    }
  }
}

TEST_F(OpsTest, GatherRows) {
  const int64_t n = 13, d = 77;
  auto x = random_floats(static_cast<size_t>(n * d), 5);
  for (std::vector<int32_t> rows :
       {std::vector<int32_t>{}, std::vector<int32_t>{12}, std::vector<int32_t>{0, 5, 5, 12, 3}}) {
    const int64_t r = static_cast<int64_t>(rows.size());
    std::vector<float> ref(static_cast<size_t>(r * d));
    Tensor cx(x.data(), DType::kF32, {n, d}), co(ref.data(), DType::kF32, {r, d});
    cpu().gather_rows(cx, rows.data(), static_cast<int>(r), co);
    DeviceMem gx = upload(gpu(), x), gr = upload(gpu(), rows), go(gpu(), std::max<size_t>(1, ref.size()) * 4);
    Tensor tx = dev_tensor(gx, DType::kF32, {n, d}), to = dev_tensor(go, DType::kF32, {r, d});
    gpu().gather_rows(tx, gr.as<int32_t>(), static_cast<int>(r), to);
    expect_close(download<float>(gpu(), go, ref.size()), ref, 0.0, 0.0, "gather_rows r=" + std::to_string(r));
  }
  // Rows of an odd byte width (Q8_0 rows are 34 bytes per block).
  const int64_t k = 64;
  auto packed = pack(DType::kQ8_0, random_floats(static_cast<size_t>(n * k), 6), n, k);
  std::vector<int32_t> rows = {4, 0, 9};
  DeviceMem gp = upload(gpu(), packed), gr = upload(gpu(), rows), go(gpu(), 3 * dtype_row_bytes(DType::kQ8_0, k));
  Tensor tp(gp.get(), DType::kQ8_0, {n, k}, Device::kCuda), to(go.get(), DType::kQ8_0, {3, k}, Device::kCuda);
  gpu().gather_rows(tp, gr.as<int32_t>(), 3, to);
  auto out = download<uint8_t>(gpu(), go, static_cast<size_t>(3 * tp.row_bytes()));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(
        0, std::memcmp(out.data() + i * tp.row_bytes(), packed.data() + rows[static_cast<size_t>(i)] * tp.row_bytes(),
                       static_cast<size_t>(tp.row_bytes())))
        << "Q8_0 row " << i;
  }
}

TEST_F(OpsTest, AllocIsZeroedAndCopiesRoundTrip) {
  DeviceMem m(gpu(), 1000);
  auto zeros = download<uint8_t>(gpu(), m, 1000);
  EXPECT_TRUE(std::all_of(zeros.begin(), zeros.end(), [](uint8_t b) { return b == 0; }));
  std::vector<uint8_t> data(1000);
  std::iota(data.begin(), data.end(), 0);
  gpu().copy_to_device(m.get(), data.data(), data.size());
  EXPECT_EQ(download<uint8_t>(gpu(), m, 1000), data);
  gpu().synchronize();
  EXPECT_EQ(gpu().device(), Device::kCuda);
}

}  // namespace
}  // namespace osprey::gpu_test
