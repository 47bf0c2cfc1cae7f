// kv_write and paged_attention against a double-precision reference that
// reads K/V from plain per-sequence arrays: several sequences of different
// lengths in one batch, decode and prefill chunks, GQA/MQA, sliding windows,
// block sizes 16 and 1 with shuffled (non-contiguous) page ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

#include "test_util.h"

namespace osprey::test {
namespace {

class AttentionTest : public testing::TestWithParam<BackendVariant> {};

struct SeqSpec {
  int kv_len;  // tokens in KV after this step
  int q_len;   // query tokens this step: positions kv_len - q_len .. kv_len - 1
};

// A paged KV cache plus the batch description for one step.
struct PagedSetup {
  int64_t bs, hk, hd, num_blocks;
  DType page_dtype;
  std::vector<uint8_t> kpages, vpages;
  std::vector<std::vector<float>> klog, vlog;  // per sequence [kv_len, hk, hd], as stored (rounded)
  std::vector<int32_t> q_indptr, kv_lens, block_indptr, block_indices, positions, slot_mapping;
  ops::AttentionBatch batch;

  ops::LayerKv layer() {
    ops::LayerKv kv;
    kv.k = Tensor(kpages.data(), page_dtype, {num_blocks, bs, hk, hd});
    kv.v = Tensor(vpages.data(), page_dtype, {num_blocks, bs, hk, hd});
    return kv;
  }
};

float round_to(DType t, float x) {
  if (t == DType::kF16) return fp16_to_f32(f32_to_fp16(x));
  if (t == DType::kBF16) return bf16_to_f32(f32_to_bf16(x));
  return x;
}

// Builds the page table and fills pages with the logical K/V of each
// sequence (pages not in any table hold large garbage that would show up).
PagedSetup make_setup(const std::vector<SeqSpec>& seqs, int64_t bs, int64_t hk, int64_t hd, DType dt, uint32_t seed) {
  PagedSetup p;
  p.bs = bs;
  p.hk = hk;
  p.hd = hd;
  p.page_dtype = dt;
  int64_t needed = 0;
  for (auto s : seqs) needed += (s.kv_len + bs - 1) / bs;
  p.num_blocks = needed + 3;
  std::vector<int32_t> ids(static_cast<size_t>(p.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  const int64_t row = hk * hd;
  const int64_t esz = dt == DType::kF32 ? 4 : 2;
  auto garbage = random_floats(static_cast<size_t>(p.num_blocks * bs * row), seed + 1, 50.0f, 100.0f);
  p.kpages = pack(dt == DType::kF32 ? DType::kF32 : dt, garbage, p.num_blocks * bs, row);
  p.vpages = p.kpages;
  p.q_indptr = {0};
  p.block_indptr = {0};
  size_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto spec = seqs[s];
    auto k = random_floats(static_cast<size_t>(spec.kv_len * row), seed + 10 + static_cast<uint32_t>(s));
    auto v = random_floats(static_cast<size_t>(spec.kv_len * row), seed + 50 + static_cast<uint32_t>(s));
    for (auto& x : k) x = round_to(dt, x);
    for (auto& x : v) x = round_to(dt, x);
    const int64_t npages = (spec.kv_len + bs - 1) / bs;
    for (int64_t i = 0; i < npages; ++i) p.block_indices.push_back(ids[next++]);
    p.block_indptr.push_back(static_cast<int32_t>(p.block_indices.size()));
    for (int j = 0; j < spec.kv_len; ++j) {
      const int64_t page = p.block_indices[static_cast<size_t>(p.block_indptr[s] + j / bs)];
      const int64_t slot = page * bs + j % bs;
      auto kr = pack(dt, std::vector<float>(k.begin() + j * row, k.begin() + (j + 1) * row), 1, row);
      auto vr = pack(dt, std::vector<float>(v.begin() + j * row, v.begin() + (j + 1) * row), 1, row);
      std::memcpy(p.kpages.data() + slot * row * esz, kr.data(), kr.size());
      std::memcpy(p.vpages.data() + slot * row * esz, vr.data(), vr.size());
    }
    for (int j = spec.kv_len - spec.q_len; j < spec.kv_len; ++j) {
      p.positions.push_back(j);
      const int64_t page = p.block_indices[static_cast<size_t>(p.block_indptr[s] + j / bs)];
      p.slot_mapping.push_back(static_cast<int32_t>(page * bs + j % bs));
    }
    p.q_indptr.push_back(p.q_indptr.back() + spec.q_len);
    p.kv_lens.push_back(spec.kv_len);
    p.klog.push_back(std::move(k));
    p.vlog.push_back(std::move(v));
  }
  auto& b = p.batch;
  b.num_seqs = static_cast<int>(seqs.size());
  b.num_tokens = p.q_indptr.back();
  for (auto s : seqs) {
    b.max_kv_len = std::max(b.max_kv_len, s.kv_len);
    b.max_q_len = std::max(b.max_q_len, s.q_len);
  }
  b.q_indptr = p.q_indptr.data();
  b.kv_lens = p.kv_lens.data();
  b.block_indptr = p.block_indptr.data();
  b.block_indices = p.block_indices.data();
  b.positions = p.positions.data();
  b.slot_mapping = p.slot_mapping.data();
  return p;
}

std::vector<double> ref_attention(const PagedSetup& p, const std::vector<float>& q, int64_t hq, float scale,
                                  int window) {
  const int64_t n = p.batch.num_tokens;
  std::vector<double> out(static_cast<size_t>(n * hq * p.hd));
  const int64_t group = hq / p.hk;
  for (int s = 0; s < p.batch.num_seqs; ++s) {
    for (int t = p.q_indptr[s]; t < p.q_indptr[s + 1]; ++t) {
      const int pos = p.positions[static_cast<size_t>(t)];
      const int lo = window > 0 ? std::max(0, pos - window + 1) : 0;
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t kvh = h / group;
        std::vector<double> sc;
        double mx = -1e300;
        for (int j = lo; j <= pos; ++j) {
          double d = 0.0;
          for (int64_t i = 0; i < p.hd; ++i)
            d += static_cast<double>(q[static_cast<size_t>((t * hq + h) * p.hd + i)]) *
                 p.klog[static_cast<size_t>(s)][static_cast<size_t>((j * p.hk + kvh) * p.hd + i)];
          sc.push_back(d * scale);
          mx = std::max(mx, sc.back());
        }
        double sum = 0.0;
        for (auto& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t i = 0; i < p.hd; ++i) {
          double acc = 0.0;
          for (int j = lo; j <= pos; ++j)
            acc += sc[static_cast<size_t>(j - lo)] *
                   p.vlog[static_cast<size_t>(s)][static_cast<size_t>((j * p.hk + kvh) * p.hd + i)];
          out[static_cast<size_t>((t * hq + h) * p.hd + i)] = acc / sum;
        }
      }
    }
  }
  return out;
}

void run_case(cpu::CpuBackend& be, const std::vector<SeqSpec>& seqs, int64_t bs, int64_t hq, int64_t hk, int64_t hd,
              int window, DType dt, uint32_t seed, double rel) {
  PagedSetup p = make_setup(seqs, bs, hk, hd, dt, seed);
  const int64_t n = p.batch.num_tokens;
  const auto q = random_floats(static_cast<size_t>(n * hq * hd), seed + 99, -2.0f, 2.0f);
  std::vector<float> out(q.size(), -1.0f);
  Tensor qt(const_cast<float*>(q.data()), DType::kF32, {n, hq, hd});
  Tensor ot(out.data(), DType::kF32, {n, hq, hd});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  be.paged_attention(qt, p.layer(), p.batch, scale, window, ot);
  expect_close(out, ref_attention(p, q, hq, scale, window), rel,
               "attention bs=" + std::to_string(bs) + " hq=" + std::to_string(hq) + " hk=" + std::to_string(hk) +
                   " window=" + std::to_string(window) + " " + std::string(dtype_name(dt)));
}

TEST_P(AttentionTest, DecodeAndPrefillMixedBatch) {
  auto be = make_backend(GetParam());
  // decode (q_len 1), a whole prompt, a chunk in the middle, a one-token prompt.
  const std::vector<SeqSpec> seqs = {{40, 1}, {23, 23}, {70, 17}, {1, 1}, {16, 1}, {17, 2}};
  uint32_t seed = 1;
  for (int64_t bs : {16, 1}) {
    for (auto [hq, hk] : {std::pair<int64_t, int64_t>{4, 4}, {9, 3}, {8, 2}, {6, 1}}) {
      for (int window : {0, 5}) run_case(*be, seqs, bs, hq, hk, 64, window, DType::kF32, seed++, 2e-6);
    }
  }
}

TEST_P(AttentionTest, LongContextManyHeads) {
  auto be = make_backend(GetParam());
  run_case(*be, {{700, 1}, {300, 3}}, 16, 9, 3, 64, 0, DType::kF32, 7, 2e-6);
  run_case(*be, {{700, 1}, {300, 3}}, 16, 9, 3, 64, 256, DType::kF32, 8, 2e-6);
  run_case(*be, {{129, 129}}, 16, 4, 2, 32, 0, DType::kF32, 9, 2e-6);
}

TEST_P(AttentionTest, OddHeadDim) {
  auto be = make_backend(GetParam());
  run_case(*be, {{19, 3}, {5, 1}}, 4, 6, 2, 13, 0, DType::kF32, 11, 2e-6);
}

TEST_P(AttentionTest, HalfPrecisionPages) {
  auto be = make_backend(GetParam());
  run_case(*be, {{40, 1}, {23, 23}}, 16, 9, 3, 64, 0, DType::kF16, 21, 2e-6);
  run_case(*be, {{40, 1}, {23, 23}}, 1, 8, 1, 64, 7, DType::kBF16, 22, 2e-6);
}

// F16/BF16 pages are widened (exactly) and then go through the fp32 kernels,
// so attention over them equals, bit for bit, attention over F32 pages that
// hold the same values: prefill and decode, odd head dims, windows, one-slot
// pages.
TEST_P(AttentionTest, HalfPagesBitIdenticalToF32PagesOfSameValues) {
  auto be = make_backend(GetParam());
  uint32_t seed = 31;
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (auto [bs, hq, hk, hd, window] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int>{16, 9, 3, 64, 0},
                                          {1, 8, 2, 64, 5}, {4, 6, 2, 13, 0}, {16, 4, 4, 40, 9}}) {
      PagedSetup p = make_setup({{40, 1}, {23, 23}, {17, 2}}, bs, hk, hd, dt, seed++);
      const int64_t slots = p.num_blocks * bs * hk * hd;
      std::vector<float> k32(static_cast<size_t>(slots)), v32(static_cast<size_t>(slots));
      dequantize_row(dt, p.kpages.data(), k32.data(), slots);
      dequantize_row(dt, p.vpages.data(), v32.data(), slots);
      const int64_t n = p.batch.num_tokens;
      const auto q = random_floats(static_cast<size_t>(n * hq * hd), seed++, -2.0f, 2.0f);
      std::vector<float> out_half(q.size(), -1.0f), out_f32(q.size(), -2.0f);
      Tensor qt(const_cast<float*>(q.data()), DType::kF32, {n, hq, hd});
      Tensor oh(out_half.data(), DType::kF32, {n, hq, hd});
      Tensor of(out_f32.data(), DType::kF32, {n, hq, hd});
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      be->paged_attention(qt, p.layer(), p.batch, scale, window, oh);
      ops::LayerKv kv32;
      kv32.k = Tensor(k32.data(), DType::kF32, {p.num_blocks, bs, hk, hd});
      kv32.v = Tensor(v32.data(), DType::kF32, {p.num_blocks, bs, hk, hd});
      be->paged_attention(qt, kv32, p.batch, scale, window, of);
      EXPECT_EQ(out_half, out_f32) << dtype_name(dt) << " bs=" << bs << " hq=" << hq << " hk=" << hk << " hd=" << hd;
    }
  }
}

// The widening kernels of every instruction set reproduce the core
// conversions bit for bit (all finite and infinite F16 values, every BF16
// pattern), on odd lengths and strides.
TEST(WidenKernels, EveryIsaExact) {
  std::vector<const cpu::CpuKernels*> tables = {&cpu::scalar_kernels()};
  if (cpu::avx2_kernels()) tables.push_back(cpu::avx2_kernels());
  if (cpu::avx512_kernels()) tables.push_back(cpu::avx512_kernels());
  std::mt19937 rng(3);
  for (auto [rows, len, stride] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 7, 9}, {5, 64, 192},
                                   {2, 13, 13}, {4, 17, 40}, {1, 300, 300}}) {
    std::vector<uint16_t> src(static_cast<size_t>(rows * stride));
    for (auto& h : src) {
      h = static_cast<uint16_t>(rng());
      if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0) h &= 0xfc00;  // F16 NaN payloads -> infinities
    }
    for (int which = 0; which < 2; ++which) {
      const DType t = which == 0 ? DType::kF16 : DType::kBF16;
      std::vector<float> want(static_cast<size_t>(rows * len));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < len; ++i) {
          const uint16_t h = src[static_cast<size_t>(r * stride + i)];
          want[static_cast<size_t>(r * len + i)] = t == DType::kF16 ? fp16_to_f32(h) : bf16_to_f32(h);
        }
      for (const cpu::CpuKernels* k : tables) {
        std::vector<float> got(want.size(), -3.0f);
        (t == DType::kF16 ? k->widen_f16 : k->widen_bf16)(src.data(), stride, rows, len, got.data());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
            << k->isa << " " << dtype_name(t) << " rows=" << rows << " len=" << len << " stride=" << stride;
      }
    }
  }
}

TEST_P(AttentionTest, KvWriteScattersAndSkips) {
  auto be = make_backend(GetParam());
  for (DType dt : {DType::kF32, DType::kF16}) {
    const int64_t nb = 5, bs = 4, hk = 3, hd = 8, row = hk * hd;
    std::vector<float> kzero(static_cast<size_t>(nb * bs * row), 0.0f);
    auto kpages = pack(dt, kzero, nb * bs, row);
    auto vpages = kpages;
    ops::LayerKv kv;
    kv.k = Tensor(kpages.data(), dt, {nb, bs, hk, hd});
    kv.v = Tensor(vpages.data(), dt, {nb, bs, hk, hd});
    const std::vector<int32_t> slots = {13, -1, 0, 19, 7};
    const int64_t n = static_cast<int64_t>(slots.size());
    const auto k = random_floats(static_cast<size_t>(n * row), 31);
    const auto v = random_floats(static_cast<size_t>(n * row), 32);
    ops::AttentionBatch batch;
    batch.num_tokens = static_cast<int>(n);
    batch.slot_mapping = slots.data();
    Tensor kt(const_cast<float*>(k.data()), DType::kF32, {n, hk, hd});
    Tensor vt(const_cast<float*>(v.data()), DType::kF32, {n, hk, hd});
    be->kv_write(kt, vt, batch, kv);
    const auto kback = unpack(dt, kpages, nb * bs, row);
    const auto vback = unpack(dt, vpages, nb * bs, row);
    std::vector<double> kexp(kback.size(), 0.0), vexp(vback.size(), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      if (slots[static_cast<size_t>(i)] < 0) continue;
      for (int64_t e = 0; e < row; ++e) {
        kexp[static_cast<size_t>(slots[static_cast<size_t>(i)] * row + e)] =
            round_to(dt, k[static_cast<size_t>(i * row + e)]);
        vexp[static_cast<size_t>(slots[static_cast<size_t>(i)] * row + e)] =
            round_to(dt, v[static_cast<size_t>(i * row + e)]);
      }
    }
    EXPECT_EQ(kback, kexp) << dtype_name(dt);
    EXPECT_EQ(vback, vexp) << dtype_name(dt);
  }
}

// F8_E4M3 pages: each value is read as e4m3(code) * the layer's scale (one
// fp32 product), so attention over them equals, bit for bit, attention over
// F32 pages holding those products: K and V scales differ, prefill and
// decode rows, GQA, windows, one-slot pages, odd head dims. Unused pages
// hold saturated garbage.
TEST_P(AttentionTest, F8PagesBitIdenticalToF32PagesOfTheirValues) {
  auto be = make_backend(GetParam());
  uint32_t seed = 71;
  for (auto [bs, hq, hk, hd, window] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int>{16, 9, 3, 64, 0},
                                        {1, 8, 2, 64, 5},
                                        {4, 6, 2, 13, 0},
                                        {16, 32, 8, 128, 9}}) {
    PagedSetup p = make_setup({{40, 1}, {23, 23}, {17, 2}}, bs, hk, hd, DType::kF32, seed++);
    const int64_t slots = p.num_blocks * bs * hk * hd;
    const float k_scale = 0.002f, v_scale = 0.75f;  // |k| / 0.002 up to 500: some K codes saturate
    std::vector<uint8_t> k8(static_cast<size_t>(slots)), v8(static_cast<size_t>(slots));
    std::vector<float> k32(static_cast<size_t>(slots)), v32(static_cast<size_t>(slots));
    const float* kp = reinterpret_cast<const float*>(p.kpages.data());
    const float* vp = reinterpret_cast<const float*>(p.vpages.data());
    for (int64_t i = 0; i < slots; ++i) {
      k8[static_cast<size_t>(i)] = f32_to_f8e4m3(kp[i] / k_scale);
      v8[static_cast<size_t>(i)] = f32_to_f8e4m3(vp[i] / v_scale);
      k32[static_cast<size_t>(i)] = f8e4m3_to_f32(k8[static_cast<size_t>(i)]) * k_scale;
      v32[static_cast<size_t>(i)] = f8e4m3_to_f32(v8[static_cast<size_t>(i)]) * v_scale;
    }
    const int64_t n = p.batch.num_tokens;
    const auto q = random_floats(static_cast<size_t>(n * hq * hd), seed++, -2.0f, 2.0f);
    std::vector<float> out_f8(q.size(), -1.0f), out_f32(q.size(), -2.0f);
    Tensor qt(const_cast<float*>(q.data()), DType::kF32, {n, hq, hd});
    Tensor o8(out_f8.data(), DType::kF32, {n, hq, hd});
    Tensor of(out_f32.data(), DType::kF32, {n, hq, hd});
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    ops::LayerKv kv8;
    kv8.k = Tensor(k8.data(), DType::kF8E4M3, {p.num_blocks, bs, hk, hd});
    kv8.v = Tensor(v8.data(), DType::kF8E4M3, {p.num_blocks, bs, hk, hd});
    kv8.k_scale = k_scale;
    kv8.v_scale = v_scale;
    be->paged_attention(qt, kv8, p.batch, scale, window, o8);
    ops::LayerKv kv32;
    kv32.k = Tensor(k32.data(), DType::kF32, {p.num_blocks, bs, hk, hd});
    kv32.v = Tensor(v32.data(), DType::kF32, {p.num_blocks, bs, hk, hd});
    be->paged_attention(qt, kv32, p.batch, scale, window, of);
    EXPECT_EQ(out_f8, out_f32) << "bs=" << bs << " hq=" << hq << " hk=" << hk << " hd=" << hd;
    // And the scales matter: the same codes read with K scale 1 give other outputs.
    kv8.k_scale = 1.0f;
    be->paged_attention(qt, kv8, p.batch, scale, window, o8);
    EXPECT_NE(out_f8, out_f32);
  }
}

// kv_write into F8_E4M3 pages stores f32_to_f8e4m3(x / scale) (via the
// inverse scale): rounding to nearest even, saturation at 448, skipped slots.
TEST_P(AttentionTest, KvWriteF8StoresScaledCodes) {
  auto be = make_backend(GetParam());
  const int64_t nb = 3, bs = 4, hk = 2, hd = 16, row = hk * hd;
  std::vector<uint8_t> kpages(static_cast<size_t>(nb * bs * row), 0x11), vpages = kpages;
  ops::LayerKv kv;
  kv.k = Tensor(kpages.data(), DType::kF8E4M3, {nb, bs, hk, hd});
  kv.v = Tensor(vpages.data(), DType::kF8E4M3, {nb, bs, hk, hd});
  kv.k_scale = 0.25f;  // k / 0.25: values up to 4 * 200 = 800 saturate
  kv.v_scale = 2.0f;
  const std::vector<int32_t> slots = {5, -1, 11, 0};
  const int64_t n = static_cast<int64_t>(slots.size());
  auto k = random_floats(static_cast<size_t>(n * row), 41, -200.0f, 200.0f);
  const auto v = random_floats(static_cast<size_t>(n * row), 42, -3.0f, 3.0f);
  k[3] = 0.0f;
  k[4] = -1e-9f;  // below the smallest subnormal: +-0
  ops::AttentionBatch batch;
  batch.num_tokens = static_cast<int>(n);
  batch.slot_mapping = slots.data();
  Tensor kt(k.data(), DType::kF32, {n, hk, hd});
  Tensor vt(const_cast<float*>(v.data()), DType::kF32, {n, hk, hd});
  be->kv_write(kt, vt, batch, kv);
  std::vector<uint8_t> kexp(kpages.size(), 0x11), vexp(vpages.size(), 0x11);
  int saturated = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = slots[static_cast<size_t>(i)];
    if (slot < 0) continue;
    for (int64_t e = 0; e < row; ++e) {
      const float kx = k[static_cast<size_t>(i * row + e)];
      kexp[static_cast<size_t>(slot * row + e)] = f32_to_f8e4m3(kx * 4.0f);
      vexp[static_cast<size_t>(slot * row + e)] = f32_to_f8e4m3(v[static_cast<size_t>(i * row + e)] * 0.5f);
      saturated += std::fabs(kx * 4.0f) > 448.0f;
    }
  }
  EXPECT_GT(saturated, 10);
  EXPECT_EQ(kpages, kexp);
  EXPECT_EQ(vpages, vexp);
  for (int64_t e = 0; e < row; ++e) EXPECT_NE(kpages[static_cast<size_t>(5 * row + e)], 0x11) << e;
}

// I8 pages with the rows quantised by int8_row_quantize: reading gives
// q * the row's scale (one fp32 product), so attention over them equals,
// bit for bit, attention over F32 pages holding those products; prefill
// and decode rows, GQA, windows, one-slot pages, odd head dims. A wrong
// scale (each row read with its neighbour head's) changes the outputs.
TEST_P(AttentionTest, I8PagesBitIdenticalToF32PagesOfTheirValues) {
  auto be = make_backend(GetParam());
  uint32_t seed = 171;
  for (auto [bs, hq, hk, hd, window] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int>{16, 9, 3, 64, 0},
                                        {1, 8, 2, 64, 5},
                                        {4, 6, 2, 13, 0},
                                        {16, 32, 8, 128, 9}}) {
    PagedSetup p = make_setup({{40, 1}, {23, 23}, {17, 2}}, bs, hk, hd, DType::kF32, seed++);
    const int64_t rows = p.num_blocks * bs * hk;
    std::vector<int8_t> k8(static_cast<size_t>(rows * hd)), v8(k8.size());
    std::vector<float> ks(static_cast<size_t>(rows)), vs(ks.size()), k32(k8.size()), v32(k8.size());
    const float* kp = reinterpret_cast<const float*>(p.kpages.data());
    const float* vp = reinterpret_cast<const float*>(p.vpages.data());
    for (int64_t r = 0; r < rows; ++r) {  // row r = slot * hk + head; its scale at kv_row_scale_index
      const size_t si = static_cast<size_t>(ops::kv_row_scale_index(r / hk, r % hk, hk, bs));
      ks[si] = int8_row_quantize(kp + r * hd, hd, k8.data() + r * hd);
      vs[si] = int8_row_quantize(vp + r * hd, hd, v8.data() + r * hd);
      for (int64_t d = 0; d < hd; ++d) {
        const size_t i = static_cast<size_t>(r * hd + d);
        k32[i] = static_cast<float>(k8[i]) * ks[si];
        v32[i] = static_cast<float>(v8[i]) * vs[si];
      }
    }
    const int64_t n = p.batch.num_tokens;
    const auto q = random_floats(static_cast<size_t>(n * hq * hd), seed++, -2.0f, 2.0f);
    std::vector<float> out_i8(q.size(), -1.0f), out_f32(q.size(), -2.0f);
    Tensor qt(const_cast<float*>(q.data()), DType::kF32, {n, hq, hd});
    Tensor o8(out_i8.data(), DType::kF32, {n, hq, hd});
    Tensor of(out_f32.data(), DType::kF32, {n, hq, hd});
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    ops::LayerKv kv8;
    kv8.k = Tensor(k8.data(), DType::kI8, {p.num_blocks, bs, hk, hd});
    kv8.v = Tensor(v8.data(), DType::kI8, {p.num_blocks, bs, hk, hd});
    kv8.k_row_scales = Tensor(ks.data(), DType::kF32, {p.num_blocks, hk, bs});
    kv8.v_row_scales = Tensor(vs.data(), DType::kF32, {p.num_blocks, hk, bs});
    be->paged_attention(qt, kv8, p.batch, scale, window, o8);
    ops::LayerKv kv32;
    kv32.k = Tensor(k32.data(), DType::kF32, {p.num_blocks, bs, hk, hd});
    kv32.v = Tensor(v32.data(), DType::kF32, {p.num_blocks, bs, hk, hd});
    be->paged_attention(qt, kv32, p.batch, scale, window, of);
    EXPECT_EQ(out_i8, out_f32) << "bs=" << bs << " hq=" << hq << " hk=" << hk << " hd=" << hd;
    // And the quantisation is close: within 2% of the float64 reference on the unrounded values.
    expect_close(out_i8, ref_attention(p, q, hq, scale, window), 2e-2, "I8 pages against the float values");
    std::rotate(vs.begin(), vs.begin() + 1, vs.end());
    be->paged_attention(qt, kv8, p.batch, scale, window, o8);
    EXPECT_NE(out_i8, out_f32);
  }
}

// kv_write into I8 pages: each (token, KV head) row of hd values as
// int8_row_quantize gives it (checked against the formula here), its scale
// at slot * hk + head; skipped slots keep their bytes and scales; a zero
// row gets scale 0, a row with a NaN scale NaN.
TEST_P(AttentionTest, KvWriteI8StoresRowsWithTheirScales) {
  auto be = make_backend(GetParam());
  const int64_t nb = 3, bs = 4, hk = 2, hd = 16, row = hk * hd;
  std::vector<int8_t> kpages(static_cast<size_t>(nb * bs * row), 17), vpages = kpages;
  std::vector<float> kscales(static_cast<size_t>(nb * bs * hk), -3.0f), vscales = kscales;
  ops::LayerKv kv;
  kv.k = Tensor(kpages.data(), DType::kI8, {nb, bs, hk, hd});
  kv.v = Tensor(vpages.data(), DType::kI8, {nb, bs, hk, hd});
  kv.k_row_scales = Tensor(kscales.data(), DType::kF32, {nb, hk, bs});
  kv.v_row_scales = Tensor(vscales.data(), DType::kF32, {nb, hk, bs});
  const std::vector<int32_t> slots = {5, -1, 11, 0};
  const int64_t n = static_cast<int64_t>(slots.size());
  auto k = random_floats(static_cast<size_t>(n * row), 41, -200.0f, 200.0f);
  auto v = random_floats(static_cast<size_t>(n * row), 42, -3.0f, 3.0f);
  for (int64_t d = 0; d < hd; ++d) k[static_cast<size_t>(2 * row + hd + d)] = 0.0f;  // token 2, head 1: zeros
  v[static_cast<size_t>(3 * row + 4)] = std::numeric_limits<float>::quiet_NaN();      // token 3, head 0
  ops::AttentionBatch batch;
  batch.num_tokens = static_cast<int>(n);
  batch.slot_mapping = slots.data();
  Tensor kt(k.data(), DType::kF32, {n, hk, hd});
  Tensor vt(v.data(), DType::kF32, {n, hk, hd});
  be->kv_write(kt, vt, batch, kv);
  std::vector<int8_t> kexp(kpages.size(), 17), vexp(kpages.size(), 17);
  std::vector<float> ksexp(kscales.size(), -3.0f), vsexp(kscales.size(), -3.0f);
  auto expect_row = [&](const float* x, int8_t* q, float* s) {
    float amax = 0.0f;
    bool finite = true;
    for (int64_t d = 0; d < hd; ++d) {
      amax = std::max(amax, std::fabs(x[d]));
      finite = finite && std::isfinite(x[d]);
    }
    *s = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    for (int64_t d = 0; d < hd; ++d) q[d] = static_cast<int8_t>(finite && amax > 0 ? std::nearbyint(x[d] / *s) : 0.0f);
  };
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = slots[static_cast<size_t>(i)];
    if (slot < 0) continue;
    for (int64_t h = 0; h < hk; ++h) {
      const int64_t r = slot * hk + h, si = (slot / bs * hk + h) * bs + slot % bs;  // [nb, hk, bs]
      expect_row(k.data() + i * row + h * hd, kexp.data() + r * hd, ksexp.data() + si);
      expect_row(v.data() + i * row + h * hd, vexp.data() + r * hd, vsexp.data() + si);
    }
  }
  EXPECT_EQ(kpages, kexp);
  EXPECT_EQ(vpages, vexp);
  for (size_t r = 0; r < kscales.size(); ++r) {
    if (std::isnan(vsexp[r])) {
      EXPECT_TRUE(std::isnan(vscales[r])) << r;
    } else {
      EXPECT_EQ(vscales[r], vsexp[r]) << r;
    }
    EXPECT_EQ(kscales[r], ksexp[r]) << r;
  }
  EXPECT_EQ(kscales[static_cast<size_t>((2 * hk + 1) * bs + 3)], 0.0f);  // slot 11 (page 2, row 3), head 1
  EXPECT_TRUE(std::isnan(vscales[0]));                                  // slot 0, head 0
  EXPECT_EQ(kscales[1], -3.0f);                                         // slot 1: not written
}

INSTANTIATE_TEST_SUITE_P(Variants, AttentionTest, testing::ValuesIn(all_variants()), variant_name);

}  // namespace
}  // namespace osprey::test
