// The 8-bit activation path (cpu_q8.h): the quantiser (round trip, layout,
// padding, every ISA bit-identical), every GEMM kernel against a
// double-precision evaluation of the same quantised arithmetic (the integer
// block sums are exact, so the only error is fp32 scaling and summation), and
// CpuBackend::matmul in that mode: batch invariance (a row's output alone ==
// its output in any batch, any thread count) and unchanged fp32 weights.
#include <gtest/gtest.h>

#include <cstdlib>
#include <tuple>

#include "backend/cpu/cpu_q8.h"
#include "test_util.h"

namespace osprey::test {
namespace {

using cpu::Q8Kernels;
using cpu::WeightFormat;

// 32-byte aligned, zero-initialised bytes.
struct AlignedBytes {
  explicit AlignedBytes(int64_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>((n + 63) / 64 * 64 + 64)))) {
    std::memset(p, 0, static_cast<size_t>((n + 63) / 64 * 64 + 64));
  }
  ~AlignedBytes() { std::free(p); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  uint8_t* p;
};

std::vector<const Q8Kernels*> all_q8_tables() {
  std::vector<const Q8Kernels*> v = {&cpu::q8_scalar_kernels()};
  if (cpu::q8_avx2_kernels()) v.push_back(cpu::q8_avx2_kernels());
  if (cpu::q8_avx512_kernels()) v.push_back(cpu::q8_avx512_kernels());
  return v;
}

// Quantised row views: element e of block b, and per-lane arrays at lane l.
int qx_at(const uint8_t* row, int64_t k, int64_t b, int e) {
  return reinterpret_cast<const int8_t*>(row)[cpu::q8_elem_offset(k, b, e)];
}
float d_lane(const uint8_t* row, int64_t k, int64_t l) {
  return reinterpret_cast<const float*>(row + cpu::q8_act_d_offset(k))[l];
}
float s_lane(const uint8_t* row, int64_t k, int64_t l) {
  return reinterpret_cast<const float*>(row + cpu::q8_act_s_offset(k))[l];
}
int32_t bias_lane(const uint8_t* row, int64_t k, int64_t l) {
  return reinterpret_cast<const int32_t*>(row + cpu::q8_act_bias_offset(k))[l];
}
float dx_at(const uint8_t* row, int64_t k, int64_t b) {
  return d_lane(row, k, cpu::q8_first_lane(k, b));
}
float sx_at(const uint8_t* row, int64_t k, int64_t b) {
  return s_lane(row, k, cpu::q8_first_lane(k, b));
}

// Activation rows with some blocks all zero and some with one large outlier.
std::vector<float> activations(int64_t n, int64_t k, uint32_t seed) {
  auto x = random_floats(static_cast<size_t>(n * k), seed, -2.0f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    if (k >= 64 && i % 3 == 1) std::fill_n(x.begin() + i * k + 32, 32, 0.0f);
    x[static_cast<size_t>(i * k + (i * 37) % k)] = 25.0f;
  }
  return x;
}

TEST(Q8Quantize, LayoutOfShortLastGroup) {
  EXPECT_EQ(cpu::q8_tail_vectors(576), 2);   // 18 blocks: 8 + 8 + 2
  EXPECT_EQ(cpu::q8_tail_vectors(96), 4);    // 3 blocks, stored as 4
  EXPECT_EQ(cpu::q8_tail_vectors(1536), 8);  // 48 blocks
  EXPECT_EQ(cpu::q8_tail_vectors(32), 1);
  // 576: blocks 16 and 17 share the last group, 4 lanes each.
  EXPECT_EQ(cpu::q8_elem_offset(576, 16, 0), 512);
  EXPECT_EQ(cpu::q8_elem_offset(576, 16, 4), 512 + 4);
  EXPECT_EQ(cpu::q8_elem_offset(576, 16, 16), 512 + 32);
  EXPECT_EQ(cpu::q8_elem_offset(576, 17, 0), 512 + 16);
  EXPECT_EQ(cpu::q8_first_lane(576, 17), 20);
  // A full group: lane = block.
  EXPECT_EQ(cpu::q8_elem_offset(576, 9, 5), 256 + 32 + 4 + 1);
  EXPECT_EQ(cpu::q8_first_lane(576, 9), 9);
}

TEST(Q8Quantize, RoundTripLayoutAndPadding) {
  for (int64_t k : {32, 64, 96, 160, 256, 288, 576, 1536}) {
    const int64_t n = 5, nb = k / 32, ng = cpu::q8_num_groups(k), rb = cpu::q8_act_row_bytes(k);
    const auto x = activations(n, k, static_cast<uint32_t>(k));
    AlignedBytes q(n * rb);
    std::memset(q.p, 0x5a, static_cast<size_t>(n * rb));  // padding must be overwritten
    const Q8Kernels& s = cpu::q8_scalar_kernels();
    for (int64_t i = 0; i < n; ++i) s.quantize(x.data() + i * k, k, 8, q.p + i * rb);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* row = q.p + i * rb;
      std::vector<bool> used_byte(static_cast<size_t>(ng * 256)), used_lane(static_cast<size_t>(ng * 8));
      for (int64_t b = 0; b < nb; ++b) {
        const float d = dx_at(row, k, b);
        int32_t isum = 0;
        float amax = 0.0f;
        for (int e = 0; e < 32; ++e) {
          const int qv = qx_at(row, k, b, e);
          isum += qv;
          ASSERT_LE(std::abs(qv), 127);
          const auto off = static_cast<size_t>(cpu::q8_elem_offset(k, b, e));
          ASSERT_FALSE(used_byte[off]) << "two elements at byte " << off;
          used_byte[off] = true;
          const float xv = x[static_cast<size_t>(i * k + b * 32 + e)];
          amax = std::max(amax, std::fabs(xv));
          // Round trip: |x - d q| <= d / 2 (plus the rounding of x * 127 / amax).
          EXPECT_LE(std::fabs(static_cast<double>(xv) - static_cast<double>(d) * qv), 0.5001 * d + 1e-30)
              << "k " << k << " row " << i << " block " << b << " elem " << e;
        }
        EXPECT_EQ(d, amax / 127.0f);
        const int64_t lane0 = cpu::q8_first_lane(k, b);
        for (int l = 0; l < cpu::q8_lanes_per_block(k, b); ++l) {
          used_lane[static_cast<size_t>(lane0 + l)] = true;
          EXPECT_EQ(d_lane(row, k, lane0 + l), d);
          EXPECT_EQ(s_lane(row, k, lane0 + l), d * static_cast<float>(isum));
          EXPECT_EQ(bias_lane(row, k, lane0 + l), l == 0 ? -8 * isum : 0) << "bias in the first lane only";
        }
        if (amax > 0.0f) {
          int qmax = 0;
          for (int e = 0; e < 32; ++e) qmax = std::max(qmax, std::abs(qx_at(row, k, b, e)));
          EXPECT_EQ(qmax, 127) << "the largest element maps to +-127";
        }
      }
      // Padding (bytes and lanes of no block) is zero.
      for (int64_t o = 0; o < ng * 256; ++o) {
        if (!used_byte[static_cast<size_t>(o)]) {
          ASSERT_EQ(row[o], 0) << "k " << k << " padding byte " << o;
        }
      }
      for (int64_t l = 0; l < ng * 8; ++l) {
        if (used_lane[static_cast<size_t>(l)]) continue;
        EXPECT_EQ(d_lane(row, k, l), 0.0f);
        EXPECT_EQ(s_lane(row, k, l), 0.0f);
        EXPECT_EQ(bias_lane(row, k, l), 0);
      }
    }
    // Every ISA's quantiser writes the same bytes.
    for (const Q8Kernels* t : all_q8_tables()) {
      AlignedBytes q2(n * rb);
      std::memset(q2.p, 0xa5, static_cast<size_t>(n * rb));
      for (int64_t i = 0; i < n; ++i) t->quantize(x.data() + i * k, k, 8, q2.p + i * rb);
      EXPECT_EQ(std::memcmp(q.p, q2.p, static_cast<size_t>(n * rb)), 0) << t->isa << " k " << k;
    }
  }
}

// Signed integer values, scale and minimum of weight block b (exact).
void weight_block(DType t, const uint8_t* row, int64_t b, int* q, double* dw, double* mw) {
  *mw = 0.0;
  if (t == DType::kQ8_0) {
    const auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
    for (int e = 0; e < 32; ++e) q[e] = blk.qs[e];
    *dw = fp16_to_f32(blk.d);
  } else if (t == DType::kQ4_0) {
    const auto& blk = reinterpret_cast<const BlockQ4_0*>(row)[b];
    for (int e = 0; e < 16; ++e) {
      q[e] = (blk.qs[e] & 15) - 8;
      q[e + 16] = (blk.qs[e] >> 4) - 8;
    }
    *dw = fp16_to_f32(blk.d);
  } else {
    const auto& blk = reinterpret_cast<const BlockQ4_1*>(row)[b];
    for (int e = 0; e < 16; ++e) {
      q[e] = blk.qs[e] & 15;
      q[e + 16] = blk.qs[e] >> 4;
    }
    *dw = fp16_to_f32(blk.d);
    *mw = fp16_to_f32(blk.m);
  }
}

// out[i, r] = sum_b dw dx isum + (Q4_1) mw sx, in double, from the quantised
// activation rows (the scalar quantiser's, bit-identical to every table's).
std::vector<double> q8_reference(DType t, const std::vector<uint8_t>& w, int64_t m, int64_t k, const uint8_t* xq,
                                 int64_t n) {
  const int64_t wrb = dtype_row_bytes(t, k), xrb = cpu::q8_act_row_bytes(k);
  std::vector<double> ref(static_cast<size_t>(n * m));
  int q[32];
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* xr = xq + i * xrb;
    for (int64_t r = 0; r < m; ++r) {
      double acc = 0.0;
      for (int64_t b = 0; b < k / 32; ++b) {
        double dw, mw;
        weight_block(t, w.data() + r * wrb, b, q, &dw, &mw);
        int64_t isum = 0;
        for (int e = 0; e < 32; ++e) isum += q[e] * qx_at(xr, k, b, e);
        acc += dw * dx_at(xr, k, b) * static_cast<double>(isum) + mw * sx_at(xr, k, b);
      }
      ref[static_cast<size_t>(i * m + r)] = acc;
    }
  }
  return ref;
}

constexpr DType kQ8Types[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1};

WeightFormat format_of(DType t) {
  WeightFormat f;
  EXPECT_TRUE(cpu::weight_format_of(t, &f));
  return f;
}

// Runs table.gemm over rows [r0, r1) of an (n x m) output and compares with
// the reference; rows outside [r0, r1) must stay untouched.
void check_gemm(const Q8Kernels& table, DType t, int64_t n, int64_t m, int64_t k, int64_t r0, int64_t r1,
                uint32_t seed) {
  const auto xs = activations(n, k, seed);
  const auto ws = random_floats(static_cast<size_t>(m * k), seed + 1, -1.0f, 1.0f);
  const auto packed = pack(t, ws, m, k);
  const WeightFormat f = format_of(t);
  const int64_t xrb = cpu::q8_act_row_bytes(k);
  AlignedBytes ref_q(n * xrb), q(n * xrb), scratch(cpu::q8_gemm_scratch_bytes(k));
  for (int64_t i = 0; i < n; ++i) {
    cpu::q8_scalar_kernels().quantize(xs.data() + i * k, k, 0, ref_q.p + i * xrb);
    table.quantize(xs.data() + i * k, k, table.act_bias[static_cast<int>(f)], q.p + i * xrb);
  }
  const auto ref = q8_reference(t, packed, m, k, ref_q.p, n);
  std::vector<float> out(static_cast<size_t>(n * m), -7.0f);
  table.gemm(packed.data(), dtype_row_bytes(t, k), f, k, q.p, xrb, static_cast<int>(n), out.data(), m, r0, r1,
             scratch.p);
  std::vector<float> got;
  std::vector<double> want;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      const size_t idx = static_cast<size_t>(i * m + r);
      if (r >= r0 && r < r1) {
        got.push_back(out[idx]);
        want.push_back(ref[idx]);
      } else {
        ASSERT_EQ(out[idx], -7.0f) << "row " << r << " outside [" << r0 << ", " << r1 << ") written";
      }
    }
  }
  // fp32 scaling and summation of <= 48 exact block sums: a few ulps of the
  // largest output.
  expect_close(got, want, 1e-5,
               std::string(table.isa) + " " + std::string(dtype_name(t)) + " n=" + std::to_string(n) + " m=" + std::to_string(m) +
                   " k=" + std::to_string(k) + " rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ")");
}

TEST(Q8Gemm, EveryKernelEveryFormatAgainstReference) {
  uint32_t seed = 1000;
  for (const Q8Kernels* table : all_q8_tables()) {
    for (DType t : kQ8Types) {
      for (int64_t n = 1; n <= 40; ++n) check_gemm(*table, t, n, 11, 96, 0, 11, seed++);
      // Last groups of 1, 2, 4 (3 blocks), 8 (5 blocks) and full groups.
      for (auto [n, m, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 32}, {3, 17, 288}, {4, 8, 256},
                             {7, 23, 576}, {32, 20, 1536}, {2, 9, 2080}, {5, 10, 352}, {6, 12, 416},
                             {3, 9, 64}, {9, 13, 160}}) {
        check_gemm(*table, t, n, m, k, 0, m, seed++);
      }
      // Sub-ranges of rows that start and end inside a panel.
      check_gemm(*table, t, 5, 40, 160, 3, 29, seed++);
      check_gemm(*table, t, 6, 40, 160, 17, 18, seed++);
    }
  }
}

// Different ISAs agree closely (same exact integer sums, different fp32 order).
TEST(Q8Gemm, IsasAgree) {
  const auto tables = all_q8_tables();
  if (tables.size() < 2) GTEST_SKIP() << "only the scalar kernels on this CPU";
  const int64_t n = 9, m = 33, k = 576;
  const auto xs = activations(n, k, 77);
  const auto ws = random_floats(static_cast<size_t>(m * k), 78);
  for (DType t : kQ8Types) {
    const auto packed = pack(t, ws, m, k);
    const WeightFormat f = format_of(t);
    const int64_t xrb = cpu::q8_act_row_bytes(k);
    std::vector<std::vector<float>> outs;
    for (const Q8Kernels* table : tables) {
      AlignedBytes q(n * xrb), scratch(cpu::q8_gemm_scratch_bytes(k));
      for (int64_t i = 0; i < n; ++i)
        table->quantize(xs.data() + i * k, k, table->act_bias[static_cast<int>(f)], q.p + i * xrb);
      outs.emplace_back(static_cast<size_t>(n * m));
      table->gemm(packed.data(), dtype_row_bytes(t, k), f, k, q.p, xrb, static_cast<int>(n), outs.back().data(), m,
                  0, m, scratch.p);
    }
    const std::vector<double> base(outs[0].begin(), outs[0].end());
    for (size_t j = 1; j < outs.size(); ++j)
      expect_close(outs[j], base, 1e-5, std::string(tables[j]->isa) + " vs scalar " + std::string(dtype_name(t)));
  }
}

// The AVX2 and AVX-512 kernels compute the same exact integer block sums and
// the same fp32 operations per lane in the same order (cpu_q8.h), so for the
// 4-bit formats their outputs are bit-identical, whatever the tiling: odd row
// counts and ranges that split panels and row pairs, every activation-tile
// remainder. (Q8_0 outputs differ in the last bits between the two tables,
// as they did before the 512-bit kernel; they are checked closely here and
// against the reference above.)
TEST(Q8Gemm, Avx2AndAvx512BitIdentical) {
  const Q8Kernels* a2 = cpu::q8_avx2_kernels();
  const Q8Kernels* a5 = cpu::q8_avx512_kernels();
  if (a2 == nullptr || a5 == nullptr) GTEST_SKIP() << "needs AVX2 and AVX-512 VNNI";
  uint32_t seed = 4000;
  for (DType t : kQ8Types) {
    const WeightFormat f = format_of(t);
    for (auto [n, m, k, r0, r1] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{32, 24, 576, 0, 24}, {33, 21, 576, 0, 21},
          {7, 13, 1536, 0, 13}, {5, 19, 96, 3, 18}, {1, 9, 32, 0, 9}, {6, 11, 2080, 1, 10}, {4, 8, 256, 5, 8},
          {37, 17, 160, 0, 17}, {2, 3, 416, 0, 3}}) {
      const auto xs = activations(n, k, seed);
      const auto ws = random_floats(static_cast<size_t>(m * k), seed + 1, -1.0f, 1.0f);
      seed += 2;
      const auto packed = pack(t, ws, m, k);
      const int64_t xrb = cpu::q8_act_row_bytes(k);
      std::vector<std::vector<float>> outs;
      for (const Q8Kernels* table : {a2, a5}) {
        AlignedBytes q(n * xrb), scratch(cpu::q8_gemm_scratch_bytes(k));
        for (int64_t i = 0; i < n; ++i)
          table->quantize(xs.data() + i * k, k, table->act_bias[static_cast<int>(f)], q.p + i * xrb);
        outs.emplace_back(static_cast<size_t>(n * m), -7.0f);
        table->gemm(packed.data(), dtype_row_bytes(t, k), f, k, q.p, xrb, static_cast<int>(n), outs.back().data(), m,
                    r0, r1, scratch.p);
      }
      const std::string what = std::string(dtype_name(t)) + " n=" + std::to_string(n) + " m=" + std::to_string(m) +
                               " k=" + std::to_string(k) + " rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ")";
      if (t == DType::kQ8_0) {
        const std::vector<double> base(outs[0].begin(), outs[0].end());
        expect_close(outs[1], base, 1e-5, what);
        continue;
      }
      for (size_t i = 0; i < outs[0].size(); ++i) ASSERT_EQ(outs[0][i], outs[1][i]) << what << " element " << i;
    }
  }
}

// ---- through CpuBackend::matmul ----------------------------------------------

class MatmulQ8Test : public testing::TestWithParam<BackendVariant> {};

std::unique_ptr<cpu::CpuBackend> make_q8_backend(const BackendVariant& v) {
  cpu::CpuBackendOptions o;
  o.num_threads = v.threads;
  o.isa = v.isa;
  o.quantize_activations = true;
  auto b = cpu::make_cpu_backend(o);
  EXPECT_NE(b->q8_isa_name(), nullptr);
  return b;
}

std::vector<float> run_matmul(cpu::CpuBackend& be, DType t, const std::vector<uint8_t>& w, const float* x, int64_t n,
                              int64_t m, int64_t k, const float* bias) {
  std::vector<float> out(static_cast<size_t>(n * m), -7.0f);
  Tensor xt(const_cast<float*>(x), DType::kF32, {n, k});
  Tensor wt(const_cast<uint8_t*>(w.data()), t, {m, k});
  Tensor bt = bias ? Tensor(const_cast<float*>(bias), DType::kF32, {m}) : Tensor();
  Tensor ot(out.data(), DType::kF32, {n, m});
  be.matmul(xt, wt, bt, ot);
  return out;
}

// Each row of a 37-row batch equals (bit for bit) the same row run alone and
// the same batch on one thread, and is close to the q8 reference (+ bias).
TEST_P(MatmulQ8Test, BatchInvariantAndAccurate) {
  auto be = make_q8_backend(GetParam());
  auto one = make_q8_backend({GetParam().isa, 1});
  const int64_t n = 37, m = 70, k = 576;
  const auto xs = activations(n, k, 5);
  const auto ws = random_floats(static_cast<size_t>(m * k), 6);
  const auto bs = random_floats(static_cast<size_t>(m), 7);
  for (DType t : kQ8Types) {
    const auto packed = pack(t, ws, m, k);
    const auto batch = run_matmul(*be, t, packed, xs.data(), n, m, k, bs.data());
    EXPECT_EQ(run_matmul(*one, t, packed, xs.data(), n, m, k, bs.data()), batch) << dtype_name(t) << " 1 vs 2 threads";
    for (int64_t i : {int64_t{0}, int64_t{3}, int64_t{36}}) {
      const auto alone = run_matmul(*be, t, packed, xs.data() + i * k, 1, m, k, bs.data());
      const std::vector<float> row(batch.begin() + i * m, batch.begin() + (i + 1) * m);
      EXPECT_EQ(alone, row) << dtype_name(t) << " row " << i;
    }
    for (int64_t sub : {int64_t{2}, int64_t{5}}) {  // rows 10.. as a smaller batch
      const auto part = run_matmul(*be, t, packed, xs.data() + 10 * k, sub, m, k, bs.data());
      EXPECT_EQ(part, std::vector<float>(batch.begin() + 10 * m, batch.begin() + (10 + sub) * m))
          << dtype_name(t) << " sub-batch " << sub;
    }
    AlignedBytes q(n * cpu::q8_act_row_bytes(k));
    for (int64_t i = 0; i < n; ++i)
      cpu::q8_scalar_kernels().quantize(xs.data() + i * k, k, 0, q.p + i * cpu::q8_act_row_bytes(k));
    auto ref = q8_reference(t, packed, m, k, q.p, n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < m; ++r) ref[static_cast<size_t>(i * m + r)] += bs[static_cast<size_t>(r)];
    expect_close(batch, ref, 1e-5, std::string("backend q8 ") + std::string(dtype_name(t)));
  }
}

// Quantisation error against the fp32 product stays at the int8 level.
TEST_P(MatmulQ8Test, CloseToFp32Product) {
  auto be = make_q8_backend(GetParam());
  const int64_t n = 6, m = 40, k = 1536;
  const auto xs = random_floats(static_cast<size_t>(n * k), 11);
  const auto ws = random_floats(static_cast<size_t>(m * k), 12);
  for (DType t : kQ8Types) {
    const auto packed = pack(t, ws, m, k);
    const auto wd = unpack(t, packed, m, k);
    std::vector<double> ref(static_cast<size_t>(n * m));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < m; ++r) {
        double acc = 0.0;
        for (int64_t c = 0; c < k; ++c) acc += xs[static_cast<size_t>(i * k + c)] * wd[static_cast<size_t>(r * k + c)];
        ref[static_cast<size_t>(i * m + r)] = acc;
      }
    expect_close(run_matmul(*be, t, packed, xs.data(), n, m, k, nullptr), ref, 1e-2,
                 std::string("q8 vs fp32 ") + std::string(dtype_name(t)));
  }
}

// Float weights (and everything that is not a matmul) keep the fp32 path:
// bit-identical to a backend without the option.
TEST_P(MatmulQ8Test, FloatWeightsUnchanged) {
  auto be = make_q8_backend(GetParam());
  auto plain = make_backend(GetParam());
  const int64_t n = 9, m = 21, k = 96;
  const auto xs = random_floats(static_cast<size_t>(n * k), 21);
  const auto ws = random_floats(static_cast<size_t>(m * k), 22);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const auto packed = pack(t, ws, m, k);
    EXPECT_EQ(run_matmul(*be, t, packed, xs.data(), n, m, k, nullptr),
              run_matmul(*plain, t, packed, xs.data(), n, m, k, nullptr))
        << dtype_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, MatmulQ8Test, testing::ValuesIn(all_variants()), variant_name);

TEST(MatmulQ8, OffByDefault) {
  cpu::CpuBackendOptions o;
  o.num_threads = 1;
  EXPECT_EQ(cpu::make_cpu_backend(o)->q8_isa_name(), nullptr);
}

}  // namespace
}  // namespace osprey::test
