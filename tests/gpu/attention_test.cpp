// kv_write and paged_attention of the CUDA backend against the CPU backend:
// mixed prefill / chunked-prefill / decode batches, pages out of order, odd
// block sizes, GQA and MQA ratios, head dims 16..256, F32/F16/BF16 pages,
// sliding windows, long contexts (split KV and its merge), empty batches;
// decode steps with 16-bit q and pages (the tensor-core decode kernel): odd
// lengths, page boundaries, every G from 1 to 16 (past 8 in blocks of 8
// query heads), hd 64/128, windows, forced splits,
// one sequence at every count of used splits, and the in-kernel split merge
// repeated and replayed from a CUDA graph (its counters reset every launch);
// F8_E4M3 pages with K and V scales (decode, prefill and mixed steps, every
// kernel family, kv_write bit for bit).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "backend/cuda/attention/prefill_wgmma.h"
#include "gpu_test_util.h"
#include "ops/decode_order.h"

namespace osprey::gpu_test {
namespace {

struct SeqSpec {
  int q_len;
  int kv_len;  // after this step; the queries are the last q_len positions
};

struct Config {
  int hq, hk, hd, block_size;
  DType kv_dtype;
};

std::string tag(const Config& c, int window, const std::vector<SeqSpec>& seqs) {
  std::string s = "hq=" + std::to_string(c.hq) + " hk=" + std::to_string(c.hk) + " hd=" + std::to_string(c.hd) +
                  " bs=" + std::to_string(c.block_size) + " kv=" + std::string(dtype_name(c.kv_dtype)) +
                  " window=" + std::to_string(window) + " seqs=";
  for (const auto& q : seqs) s += "(" + std::to_string(q.q_len) + "/" + std::to_string(q.kv_len) + ")";
  return s;
}

// Random page contents of dtype t: rows of floats stored as t.
std::vector<uint8_t> random_pages(DType t, size_t count, uint32_t seed) {
  const auto f = random_floats(count, seed, -2.0f, 2.0f);
  return pack(t, f, 1, static_cast<int64_t>(count));
}

// One attention step over `seqs` whose pages are drawn in shuffled order from
// a pool of num_blocks (3 of them unused); slots address this step's tokens.
struct Batch : HostAttentionBatch {
  int num_blocks = 0;

  Batch(const std::vector<SeqSpec>& seqs, int block_size, uint32_t seed) {
    for (const auto& s : seqs) num_blocks += (s.kv_len + block_size - 1) / block_size;
    num_blocks += 3;  // unused pages
    std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
    size_t next = 0;
    for (const auto& s : seqs) {
      const size_t pages = static_cast<size_t>((s.kv_len + block_size - 1) / block_size);
      add_seq(s.q_len, s.kv_len, std::span<const int32_t>(perm).subspan(next, pages), block_size, true);
      next += pages;
    }
  }
};

// Runs paged_attention on both backends over random pages and queries.
void check_attention(ops::Backend& gpu, ops::Backend& cpu, const Config& c, const std::vector<SeqSpec>& seqs,
                     int window, uint32_t seed) {
  const std::string what = tag(c, window, seqs);
  Batch h(seqs, c.block_size, seed);
  const int64_t n = h.num_tokens();
  const size_t page_elems = static_cast<size_t>(h.num_blocks) * c.block_size * c.hk * c.hd;
  auto kp = random_pages(c.kv_dtype, page_elems, seed + 1);
  auto vp = random_pages(c.kv_dtype, page_elems, seed + 2);
  auto q = random_floats(static_cast<size_t>(n * c.hq * c.hd), seed + 3, -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));

  std::vector<float> ref(q.size());
  {
    ops::LayerKv kv;
    kv.k = Tensor(kp.data(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd});
    kv.v = Tensor(vp.data(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd});
    Tensor qt(q.data(), DType::kF32, {n, c.hq, c.hd}), ot(ref.data(), DType::kF32, {n, c.hq, c.hd});
    const ops::AttentionBatch b = h.host();
    cpu.paged_attention(qt, kv, b, scale, window, ot);
  }
  DeviceAttentionBatch db(gpu, h);
  DeviceMem gk = upload(gpu, kp), gv = upload(gpu, vp), gq = upload(gpu, q);
  DeviceMem go(gpu, std::max<size_t>(1, q.size()) * 4);
  ops::LayerKv kv;
  kv.k = Tensor(gk.get(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda);
  kv.v = Tensor(gv.get(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda);
  Tensor qt = dev_tensor(gq, DType::kF32, {n, c.hq, c.hd}), ot = dev_tensor(go, DType::kF32, {n, c.hq, c.hd});
  gpu.paged_attention(qt, kv, db.b, scale, window, ot);
  expect_close(download<float>(gpu, go, q.size()), ref, 1e-10, 1e-5, what);
}

const std::vector<SeqSpec> kMixed = {{37, 37}, {1, 100}, {20, 70}, {1, 1}, {0, 5}, {16, 32}, {3, 17}};

class AttentionTest : public GpuTest {};

TEST_F(AttentionTest, MixedBatchesAcrossHeadShapes) {
  uint32_t seed = 1;
  for (Config c :
       {Config{4, 4, 64, 16, DType::kF32}, Config{8, 2, 128, 16, DType::kF32}, Config{9, 3, 64, 7, DType::kF32},
        Config{8, 1, 128, 16, DType::kF32}, Config{4, 2, 16, 16, DType::kF32}, Config{6, 2, 96, 5, DType::kF32},
        Config{4, 4, 256, 16, DType::kF32}, Config{2, 1, 80, 1, DType::kF32}, Config{32, 8, 128, 16, DType::kF32},
        Config{16, 1, 64, 32, DType::kF32}}) {
    check_attention(gpu(), cpu(), c, kMixed, 0, seed += 7);
  }
}

TEST_F(AttentionTest, HalfPrecisionPages) {
  uint32_t seed = 100;
  for (DType t : {DType::kF16, DType::kBF16}) {
    for (Config c : {Config{8, 2, 128, 16, t}, Config{9, 3, 64, 7, t}, Config{4, 4, 256, 16, t}}) {
      c.kv_dtype = t;
      check_attention(gpu(), cpu(), c, kMixed, 0, seed += 7);
    }
  }
}

TEST_F(AttentionTest, SlidingWindow) {
  uint32_t seed = 200;
  for (int window : {1, 5, 16, 64}) {
    check_attention(gpu(), cpu(), Config{8, 2, 64, 16, DType::kF32}, kMixed, window, seed += 7);
    check_attention(gpu(), cpu(), Config{4, 4, 128, 7, DType::kF32}, {{1, 500}, {40, 90}}, window, seed += 7);
  }
}

TEST_F(AttentionTest, SingleTokenAndSingleSequence) {
  uint32_t seed = 300;
  check_attention(gpu(), cpu(), Config{4, 2, 64, 16, DType::kF32}, {{1, 1}}, 0, seed += 7);
  check_attention(gpu(), cpu(), Config{4, 2, 64, 16, DType::kF32}, {{1, 16}}, 0, seed += 7);
  check_attention(gpu(), cpu(), Config{4, 2, 64, 16, DType::kF32}, {{1, 17}}, 0, seed += 7);
  check_attention(gpu(), cpu(), Config{4, 2, 128, 16, DType::kF32}, {{200, 200}}, 0, seed += 7);
}

// Few work tiles and long KV: the planner splits the KV range.
TEST_F(AttentionTest, LongContextDecodeSplits) {
  uint32_t seed = 400;
  check_attention(gpu(), cpu(), Config{32, 8, 128, 16, DType::kF32}, {{1, 3000}, {1, 1234}, {1, 17}}, 0, seed += 7);
  check_attention(gpu(), cpu(), Config{8, 1, 64, 16, DType::kBF16}, {{1, 5000}}, 0, seed += 7);
  check_attention(gpu(), cpu(), Config{4, 4, 128, 16, DType::kF32}, {{1, 4097}, {3, 2000}}, 64, seed += 7);
}

TEST_F(AttentionTest, ManyDecodeSequences) {
  std::vector<SeqSpec> seqs;
  std::mt19937 rng(5);
  for (int i = 0; i < 64; ++i) seqs.push_back({1, 1 + static_cast<int>(rng() % 300)});
  check_attention(gpu(), cpu(), Config{32, 8, 128, 16, DType::kF16}, seqs, 0, 500);
}

TEST_F(AttentionTest, EmptyBatchLeavesOutputAlone) {
  const Config c{4, 2, 64, 16, DType::kF32};
  Batch h({}, c.block_size, 1);
  DeviceAttentionBatch db(gpu(), h);
  DeviceMem gk(gpu(), 3 * 16 * 2 * 64 * 4), gv(gpu(), 3 * 16 * 2 * 64 * 4), gq(gpu(), 4), go(gpu(), 16);
  std::vector<float> sentinel(4, 9.0f);
  gpu().copy_to_device(go.get(), sentinel.data(), 16);
  ops::LayerKv kv;
  kv.k = Tensor(gk.get(), DType::kF32, {3, 16, 2, 64}, Device::kCuda);
  kv.v = Tensor(gv.get(), DType::kF32, {3, 16, 2, 64}, Device::kCuda);
  Tensor qt(gq.get(), DType::kF32, {0, 4, 64}, Device::kCuda), ot(go.get(), DType::kF32, {0, 4, 64}, Device::kCuda);
  gpu().paged_attention(qt, kv, db.b, 0.125f, 0, ot);
  Tensor k0(gq.get(), DType::kF32, {0, 2, 64}, Device::kCuda);
  gpu().kv_write(k0, k0, db.b, kv);
  EXPECT_EQ(download<float>(gpu(), go, 4), sentinel);
}

// ---- decode steps with 16-bit q / out and pages of the same dtype ----------------
// (the tensor-core decode kernel; F32 q above runs the SIMT one)

// One step over host pages kp / vp (dtype c.kv_dtype; F8 pages under
// k_scale / v_scale) with q stored as qb (dtype act) and qr its values: the
// CPU's output from fp32 q, and the GPU's output bytes (act) from qb, its
// buffer filled with 0xff bytes first (NaN in every float dtype: every
// element must be written).
struct BothOutputs {
  std::vector<float> ref;
  std::vector<uint8_t> gpu;
};
// I8 pages: krs / vrs their row scales [num_blocks * block_size * hk]
// (vrs_ref: other V row scales for the CPU only).
BothOutputs run_on_both(ops::Backend& gpu, ops::Backend& cpu, const Config& c, const Batch& h, std::vector<uint8_t>& kp,
                        std::vector<uint8_t>& vp, DType act, const std::vector<uint8_t>& qb, std::vector<float>& qr,
                        int window, float k_scale = 1.0f, float v_scale = 1.0f, std::vector<float>* krs = nullptr,
                        std::vector<float>* vrs = nullptr, std::vector<float>* vrs_ref = nullptr) {
  const int64_t n = h.num_tokens();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  BothOutputs r;
  r.ref.resize(qr.size());
  const bool i8 = c.kv_dtype == DType::kI8;
  {
    ops::LayerKv kv{Tensor(kp.data(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd}),
                    Tensor(vp.data(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd}), k_scale, v_scale};
    if (i8) {
      kv.k_row_scales = Tensor(krs->data(), DType::kF32, {h.num_blocks, c.hk, c.block_size});
      kv.v_row_scales =
          Tensor((vrs_ref != nullptr ? vrs_ref : vrs)->data(), DType::kF32, {h.num_blocks, c.hk, c.block_size});
    }
    Tensor qt(qr.data(), DType::kF32, {n, c.hq, c.hd}), ot(r.ref.data(), DType::kF32, {n, c.hq, c.hd});
    const ops::AttentionBatch b = h.host();
    cpu.paged_attention(qt, kv, b, scale, window, ot);
  }
  DeviceAttentionBatch db(gpu, h);
  DeviceMem gk = upload(gpu, kp), gv = upload(gpu, vp), gq = upload(gpu, qb);
  const std::vector<uint8_t> poison(qb.size(), 0xff);
  DeviceMem go = upload(gpu, poison);
  ops::LayerKv kv{Tensor(gk.get(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda),
                  Tensor(gv.get(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda), k_scale,
                  v_scale};
  std::optional<DeviceMem> gks, gvs;
  if (i8) {
    gks.emplace(upload(gpu, *krs));
    gvs.emplace(upload(gpu, *vrs));
    kv.k_row_scales = Tensor(gks->get(), DType::kF32, {h.num_blocks, c.hk, c.block_size}, Device::kCuda);
    kv.v_row_scales = Tensor(gvs->get(), DType::kF32, {h.num_blocks, c.hk, c.block_size}, Device::kCuda);
  }
  Tensor qt = dev_tensor(gq, act, {n, c.hq, c.hd}), ot = dev_tensor(go, act, {n, c.hq, c.hd});
  gpu.paged_attention(qt, kv, db.b, scale, window, ot);
  r.gpu = download<uint8_t>(gpu, go, qb.size());
  return r;
}

// count random queries in [-range, range] stored as act (bytes) and the
// values those bytes hold (the CPU reference's fp32 q).
struct RoundedQ {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
RoundedQ rounded_q(DType act, size_t count, uint32_t seed, float range = 2.0f) {
  const auto f = random_floats(count, seed, -range, range);
  RoundedQ q;
  q.bytes = pack(act, f, 1, static_cast<int64_t>(count));
  const auto v = unpack(act, q.bytes, 1, static_cast<int64_t>(count));
  q.values.assign(v.begin(), v.end());
  return q;
}

// The GPU's output (bytes of act) against the CPU's from the same pages and
// q: the bounds of a one-byte page step (the GPU's q and P in half, the
// output rounded to act; F32 act: the SIMT and generic kernels, fp32).
void expect_one_byte_step_close(const BothOutputs& o, DType act, const std::string& what) {
  const auto got = unpack(act, o.gpu, 1, static_cast<int64_t>(o.ref.size()));
  if (act == DType::kF32) {
    expect_close(got, o.ref, 1e-10, 1e-5, what);
  } else if (act == DType::kBF16) {
    expect_close(got, o.ref, 5e-5, 2e-2, what);
  } else {
    expect_close(got, o.ref, 3e-6, 4e-3, what);
  }
}

// One decode step (one query token per sequence, kv lengths `lens`) with q,
// out and pages of dtype t, against the CPU on the same rounded q. With
// zero_k every score is 0, so the output is the exact mean of V over each
// query's key range: one key too many or too few moves it far beyond the
// output's rounding, which random K hides at long lengths.
// Returns the output bytes.
std::vector<uint8_t> check_decode16(ops::Backend& gpu, ops::Backend& cpu, DType t, const Config& c,
                                    const std::vector<int>& lens, int window, uint32_t seed, bool zero_k = false,
                                    float q_range = 2.0f) {
  std::vector<SeqSpec> seqs;
  for (int len : lens) seqs.push_back({1, len});
  const std::string what = std::string(dtype_name(t)) + " decode " + (zero_k ? "K=0 " : "") + tag(c, window, seqs);
  Batch h(seqs, c.block_size, seed);
  const int64_t n = h.num_tokens();
  const size_t page_elems = static_cast<size_t>(h.num_blocks) * c.block_size * c.hk * c.hd;
  auto kp = zero_k ? pack(t, std::vector<float>(page_elems, 0.0f), 1, static_cast<int64_t>(page_elems))
                   : random_pages(t, page_elems, seed + 1);
  auto vp = random_pages(t, page_elems, seed + 2);
  RoundedQ q = rounded_q(t, static_cast<size_t>(n * c.hq * c.hd), seed + 3, q_range);
  Config ct = c;
  ct.kv_dtype = t;
  const BothOutputs o = run_on_both(gpu, cpu, ct, h, kp, vp, t, q.bytes, q.values, window);
  const std::vector<float>& ref = o.ref;
  const std::vector<uint8_t>& bytes = o.gpu;
  const auto got = unpack(t, bytes, 1, static_cast<int64_t>(q.values.size()));
  // Rounding: q and P to t, the output to t (2^-9 relative for BF16, 2^-12 for F16).
  const bool bf16 = t == DType::kBF16;
  if (zero_k) {
    expect_close(got, ref, bf16 ? 2e-5 : 2e-7, bf16 ? 8e-3 : 1.5e-3, what);
  } else {
    expect_close(got, ref, bf16 ? 5e-5 : 3e-6, bf16 ? 2e-2 : 4e-3, what);
  }
  return bytes;
}

const std::vector<int> kDecodeLens = {1, 2, 15, 16, 17, 31, 33, 64, 65, 100, 257, 1000, 4097};

TEST_F(AttentionTest, Decode16AcrossGroupsHeadDimsAndBlockSizes) {
  uint32_t seed = 800;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (Config c : {Config{8, 8, 128, 16, t}, Config{8, 4, 128, 16, t}, Config{32, 8, 128, 16, t},
                     Config{16, 2, 128, 16, t}, Config{4, 4, 64, 16, t}, Config{8, 4, 64, 7, t},
                     Config{16, 4, 64, 32, t}, Config{16, 2, 64, 1, t}, Config{32, 8, 128, 5, t}}) {
      c.kv_dtype = t;
      check_decode16(gpu(), cpu(), t, c, kDecodeLens, 0, seed += 7);
      check_decode16(gpu(), cpu(), t, c, kDecodeLens, 0, seed += 7, /*zero_k=*/true);
    }
  }
}

// G other than 1, 2, 4 and 8 on the tensor-core kernel: SmolLM2 (9 / 3),
// Llama-3.2-3B (24 / 8), Qwen2.5-7B (28 / 4), Qwen2.5-1.5B (12 / 2),
// Qwen2.5-14B (40 / 8), and past 8 (two blocks a KV head): 12 / 1 (8 + 4),
// 16 / 1, and Llama-3.1-405B's 16 per KV head, with windows, many sequences
// and one long sequence (the in-kernel merge over a block's part of the heads).
TEST_F(AttentionTest, Decode16EveryGroupSize) {
  uint32_t seed = 850;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (Config c : {Config{9, 3, 64, 16, t}, Config{24, 8, 128, 16, t}, Config{28, 4, 128, 16, t},
                     Config{12, 2, 128, 7, t}, Config{40, 8, 128, 16, t}, Config{3, 1, 64, 16, t},
                     Config{12, 1, 128, 16, t}, Config{16, 1, 64, 32, t}, Config{32, 2, 128, 16, t}}) {
      check_decode16(gpu(), cpu(), t, c, kDecodeLens, 0, seed += 7);
      check_decode16(gpu(), cpu(), t, c, kDecodeLens, 0, seed += 7, /*zero_k=*/true);
      check_decode16(gpu(), cpu(), t, c, kDecodeLens, 100, seed += 7);
      check_decode16(gpu(), cpu(), t, c, {20000}, 0, seed += 7, true);  // one sequence: many splits
    }
  }
}

// The decode kernel the backend picks: the tensor-core one for every G with
// 16-bit q and 16-bit, F8 or I8 pages; the SIMT one (F32 q) only for G = 1,
// 2, 4 and 8 (other G run on the generic kernel); and the block count its
// split plan and in-kernel merge count on.
TEST(DecodeKernelChoice, TensorCoreKernelTakesEveryGroupSize) {
  alignas(16) static unsigned char pages[64];
  alignas(16) static float row_scales[4];
  for (int g = 1; g <= 24; ++g) {
    cuda::PagedAttentionArgs a;
    a.hk = 4;
    a.hq = 4 * g;
    a.hd = 128;
    a.num_seqs = 10;
    a.k_cache = pages;
    a.v_cache = pages;
    a.k_row_scales = row_scales;
    a.v_row_scales = row_scales;
    for (DType act : {DType::kBF16, DType::kF16}) {
      for (DType kv : {act, DType::kF8E4M3, DType::kI8}) {
        a.act = act;
        a.kv_dtype = kv;
        EXPECT_TRUE(cuda::decode_attention_supported(a)) << "G=" << g << " kv " << dtype_name(kv);
        EXPECT_EQ(cuda::decode_blocks_per_split(a), 10 * 4 * ((g + 7) / 8)) << "G=" << g;
      }
    }
    a.act = DType::kF32;
    a.kv_dtype = DType::kF32;
    EXPECT_EQ(cuda::decode_attention_supported(a), g == 1 || g == 2 || g == 4 || g == 8) << "G=" << g;
    a.act = DType::kBF16;  // F32 pages under 16-bit q: the SIMT kernel
    EXPECT_EQ(cuda::decode_attention_supported(a), g == 1 || g == 2 || g == 4 || g == 8) << "G=" << g;
    EXPECT_EQ(cuda::decode_blocks_per_split(a), 40) << "G=" << g;
  }
}

TEST_F(AttentionTest, Decode16PeakyScoresWindowsAndSingleToken) {
  uint32_t seed = 900;
  for (DType t : {DType::kBF16, DType::kF16}) {
    const Config c{32, 8, 128, 16, t};
    // Large q: a few keys carry almost all the weight.
    check_decode16(gpu(), cpu(), t, c, kDecodeLens, 0, seed += 7, false, 8.0f);
    for (int window : {1, 5, 16, 17, 100, 1024}) {
      check_decode16(gpu(), cpu(), t, c, kDecodeLens, window, seed += 7);
      check_decode16(gpu(), cpu(), t, Config{8, 2, 64, 7, t}, kDecodeLens, window, seed += 7, true);
    }
    check_decode16(gpu(), cpu(), t, c, {1}, 0, seed += 7);
    check_decode16(gpu(), cpu(), t, c, {16}, 0, seed += 7, true);
    check_decode16(gpu(), cpu(), t, c, {20000}, 0, seed += 7, true);  // one sequence: many splits
  }
}

TEST_F(AttentionTest, Decode16ManySequences) {
  std::vector<int> lens;
  std::mt19937 rng(9);
  for (int i = 0; i < 130; ++i) lens.push_back(1 + static_cast<int>(rng() % 1500));
  check_decode16(gpu(), cpu(), DType::kBF16, Config{32, 8, 128, 16, DType::kBF16}, lens, 0, 950);
  check_decode16(gpu(), cpu(), DType::kF16, Config{32, 8, 128, 16, DType::kF16}, lens, 0, 951, true);
}

// One sequence (the batch-1 plan: the most splits) at lengths around every
// count of used splits: a split takes >= 64 keys (OSPREY_DECODE_MIN_KEYS
// may raise it), so a short context leaves the later splits' blocks empty
// (they exit, the merge skips them); long ones use all of them.
TEST_F(AttentionTest, Decode16OneSequenceEveryUsedSplitCount) {
  uint32_t seed = 1000;
  for (int len : {1, 15, 255, 256, 257, 511, 512, 513, 1000, 2047, 2048, 2049, 3000, 4352, 4353, 6000, 8192, 9000}) {
    check_decode16(gpu(), cpu(), DType::kBF16, Config{32, 8, 128, 16, DType::kBF16}, {len}, 0, seed += 7, true);
    check_decode16(gpu(), cpu(), DType::kF16, Config{8, 2, 64, 7, DType::kF16}, {len}, 0, seed += 7);
  }
  check_decode16(gpu(), cpu(), DType::kBF16, Config{32, 8, 128, 16, DType::kBF16}, {3000}, 700, seed += 7, true);
}

// A 16-bit attention step on the device: Batch(seqs, block size, seed)'s
// pages, random K/V pages and queries of c.kv_dtype from seed + 1, + 2,
// + 3, and the output filled with 0xff bytes (`poison`) until a run writes it.
struct DeviceStep {
  Config c;
  Batch h;
  int64_t n;
  size_t page_elems;
  DeviceAttentionBatch db;
  DeviceMem gk, gv, gq;
  std::vector<uint8_t> poison;
  DeviceMem go;
  ops::LayerKv kv;
  Tensor qt, ot;

  DeviceStep(ops::Backend& be, const Config& cfg, const std::vector<SeqSpec>& seqs, uint32_t seed)
      : c(cfg),
        h(seqs, c.block_size, seed),
        n(h.num_tokens()),
        page_elems(static_cast<size_t>(h.num_blocks) * c.block_size * c.hk * c.hd),
        db(be, h),
        gk(upload(be, random_pages(c.kv_dtype, page_elems, seed + 1))),
        gv(upload(be, random_pages(c.kv_dtype, page_elems, seed + 2))),
        gq(upload(be, random_pages(c.kv_dtype, static_cast<size_t>(n * c.hq * c.hd), seed + 3))),
        poison(static_cast<size_t>(n * c.hq * c.hd * 2), 0xff),
        go(upload(be, poison)) {
    kv.k = Tensor(gk.get(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda);
    kv.v = Tensor(gv.get(), c.kv_dtype, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda);
    qt = dev_tensor(gq, c.kv_dtype, {n, c.hq, c.hd});
    ot = dev_tensor(go, c.kv_dtype, {n, c.hq, c.hd});
  }
  void run(ops::Backend& be, const ops::AttentionBatch& b) { be.paged_attention(qt, kv, b, 0.088f, 0, ot); }
  void fill_poison(ops::Backend& be) { be.copy_to_device(go.get(), poison.data(), poison.size()); }
  std::vector<uint8_t> output(ops::Backend& be) { return download<uint8_t>(be, go, poison.size()); }
};

// A decode step with splits (one and three sequences: the in-kernel merge,
// whose per-(sequence, KV head) counters must be back at zero after every
// launch) run five times eagerly and five times from a CUDA graph, the
// output poisoned before each run: every run gives the first one's bytes.
TEST_F(AttentionTest, Decode16SplitMergeRepeatsAndGraphReplays) {
  // G = 8, 7, and 12 (two blocks a KV head, each with its own counter).
  for (const auto& [c, lens] : std::vector<std::pair<Config, std::vector<int>>>{
           {Config{32, 8, 128, 16, DType::kBF16}, {3000}},
           {Config{32, 8, 128, 16, DType::kBF16}, {700, 5000, 33}},
           {Config{28, 4, 128, 16, DType::kBF16}, {700, 5000, 33}},
           {Config{24, 2, 64, 16, DType::kBF16}, {4000, 9, 1500}}}) {
    std::vector<SeqSpec> seqs;
    for (int len : lens) seqs.push_back({1, len});
    DeviceStep st(gpu(), c, seqs, 77);
    auto run = [&] { st.run(gpu(), st.db.b); };
    run();
    const auto want = st.output(gpu());
    ASSERT_NE(want, st.poison);
    for (int rep = 0; rep < 5; ++rep) {
      st.fill_poison(gpu());
      run();
      EXPECT_EQ(st.output(gpu()), want) << "eager run " << rep << " hq=" << c.hq << " lens[0]=" << lens[0];
    }
    if (!gpu().supports_graphs()) continue;
    gpu().begin_capture();
    run();
    auto graph = gpu().end_capture();
    ASSERT_NE(graph, nullptr);
    for (int rep = 0; rep < 5; ++rep) {
      st.fill_poison(gpu());
      graph->launch();
      EXPECT_EQ(st.output(gpu()), want) << "graph replay " << rep << " hq=" << c.hq << " lens[0]=" << lens[0];
    }
  }
}

// AttentionBatch::decode_order (longest first) only changes which block
// takes which (sequence, KV head, split): the output must be the bytes of
// the step without it, with many sequences of varied lengths (one split
// each), with splits (a few long ones) and with padded sequences (kv_len 0),
// eagerly and from a graph replayed after the order changed; and a mixed
// step's decode part takes an order of its leading decodes.
TEST_F(AttentionTest, Decode16LongestFirstOrderIsBitIdentical) {
  const Config c{32, 8, 128, 16, DType::kBF16};
  std::mt19937 rng(31);
  std::vector<int> many;
  for (int i = 0; i < 150; ++i) many.push_back(1 + static_cast<int>(rng() % 900));
  const Config c12{24, 2, 64, 16, DType::kBF16};  // G = 12: two blocks a KV head
  for (const auto& [cs, lens] : std::vector<std::pair<Config, std::vector<int>>>{
           {c, many}, {c, {700, 5000, 33}}, {c, {64, 0, 2000, 0, 1}}, {c12, many}, {c12, {64, 0, 2000, 0, 1}}}) {
    std::vector<SeqSpec> seqs;
    for (int len : lens) seqs.push_back({1, len});
    DeviceStep st(gpu(), cs, seqs, 91);
    const std::string what =
        "hq=" + std::to_string(cs.hq) + " seqs=" + std::to_string(lens.size()) + " lens[0]=" + std::to_string(lens[0]);
    st.run(gpu(), st.db.b);
    const auto want = st.output(gpu());
    ASSERT_NE(want, st.poison) << what;

    std::vector<int32_t> order(lens.size());
    ops::longest_first_order(st.h.kv_lens.data(), static_cast<int>(lens.size()), order.data());
    DeviceMem gorder = upload(gpu(), order);
    ops::AttentionBatch ob = st.db.b;
    ob.decode_order = gorder.as<int32_t>();
    auto run = [&] { st.run(gpu(), ob); };
    st.fill_poison(gpu());
    run();
    EXPECT_EQ(st.output(gpu()), want) << what << ": longest first";
    if (!gpu().supports_graphs()) continue;
    gpu().begin_capture();
    run();
    auto graph = gpu().end_capture();
    ASSERT_NE(graph, nullptr);
    std::reverse(order.begin(), order.end());  // another order, same graph: shortest first
    gpu().copy_to_device(gorder.get(), order.data(), order.size() * 4);
    for (int rep = 0; rep < 3; ++rep) {
      st.fill_poison(gpu());
      graph->launch();
      EXPECT_EQ(st.output(gpu()), want) << what << ": graph replay " << rep;
    }
  }
  // Mixed: three decodes ahead of a 40-token prompt chunk; the order covers the decodes.
  DeviceStep st(gpu(), c, {{1, 300}, {1, 1200}, {1, 50}, {40, 90}}, 95);
  st.db.b.num_leading_decodes = 3;
  st.run(gpu(), st.db.b);
  const auto want = st.output(gpu());
  ASSERT_NE(want, st.poison) << "mixed step";
  DeviceMem gorder = upload(gpu(), std::vector<int32_t>{1, 0, 2});
  ops::AttentionBatch ob = st.db.b;
  ob.decode_order = gorder.as<int32_t>();
  st.fill_poison(gpu());
  st.run(gpu(), ob);
  EXPECT_EQ(st.output(gpu()), want) << "mixed step, decodes longest first";
}

class AttentionSplitTest : public GpuTest {
 protected:
  cuda::CudaBackendOptions gpu_options() const override {
    cuda::CudaBackendOptions o;
    o.attention_splits = splits_;
    return o;
  }
  int splits_ = 1;
};

// Forced splits on short and mixed batches: every row goes through the merge,
// including splits whose key range is empty for some rows.
TEST_F(AttentionSplitTest, ForcedSplitsMatch) {
  uint32_t seed = 600;
  for (int splits : {2, 3, 7, 40}) {
    splits_ = splits;
    gpu_ = cuda::make_cuda_backend(gpu_options());
    ASSERT_NE(gpu_, nullptr);
    check_attention(gpu(), cpu(), Config{8, 2, 64, 16, DType::kF32}, kMixed, 0, seed += 7);
    check_attention(gpu(), cpu(), Config{9, 3, 128, 7, DType::kBF16}, kMixed, 5, seed += 7);
    check_attention(gpu(), cpu(), Config{4, 4, 64, 16, DType::kF32}, {{1, 1000}}, 0, seed += 7);
    // The tensor-core decode kernel, every split through the merge.
    for (DType t : {DType::kBF16, DType::kF16}) {
      check_decode16(gpu(), cpu(), t, Config{32, 8, 128, 16, t}, kDecodeLens, 0, seed += 7);
      check_decode16(gpu(), cpu(), t, Config{8, 4, 64, 7, t}, kDecodeLens, 0, seed += 7, true);
      check_decode16(gpu(), cpu(), t, Config{16, 2, 128, 16, t}, kDecodeLens, 33, seed += 7, true);
      check_decode16(gpu(), cpu(), t, Config{12, 2, 128, 16, t}, kDecodeLens, 0, seed += 7, true);
      check_decode16(gpu(), cpu(), t, Config{24, 2, 64, 7, t}, kDecodeLens, 0, seed += 7);
    }
  }
}

// ---- F8_E4M3 pages -------------------------------------------------------------------
// Scales of the F8 tests (ignored for the other page dtypes): K codes up to
// 2 / 0.01 = 200, V codes up to 2 / 0.5 = 4, as in real layers where K
// needs a smaller scale than V.
constexpr float kF8KScale = 0.01f, kF8VScale = 0.5f;

// count E4M3 codes of random values in [-2, 2] divided by scale (seed s).
std::vector<uint8_t> f8_codes(size_t count, float scale, uint32_t s) {
  const auto f = random_floats(count, s, -2.0f, 2.0f);
  std::vector<uint8_t> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = f32_to_f8e4m3(f[i] / scale);
  return out;
}

// One step with F8_E4M3 pages (codes of random values in [-2, 2] under
// kF8KScale / kF8VScale) and q / out of dtype act, against the CPU backend
// on the same pages and the same (rounded) q. 16-bit act: the tensor-core
// decode kernel and the mma.sync prefill kernel's F8 variant (their q and P
// in half, the output rounded to act); F32 act: the SIMT decode kernel and
// the generic prefill kernel.
void check_f8(ops::Backend& gpu, ops::Backend& cpu, DType act, Config c, const std::vector<SeqSpec>& seqs, int window,
              uint32_t seed) {
  c.kv_dtype = DType::kF8E4M3;
  const std::string what = std::string(dtype_name(act)) + " q, " + tag(c, window, seqs);
  Batch h(seqs, c.block_size, seed);
  const int64_t n = h.num_tokens();
  const size_t page_elems = static_cast<size_t>(h.num_blocks) * c.block_size * c.hk * c.hd;
  auto kp = f8_codes(page_elems, kF8KScale, seed + 1), vp = f8_codes(page_elems, kF8VScale, seed + 2);
  RoundedQ q = rounded_q(act, static_cast<size_t>(n * c.hq * c.hd), seed + 3);
  // The CPU reads the same values (e4m3 * scale, fp32).
  expect_one_byte_step_close(
      run_on_both(gpu, cpu, c, h, kp, vp, act, q.bytes, q.values, window, kF8KScale, kF8VScale), act, what);
}

// The decode sweep of a one-byte page dtype's `check` (check_f8 or
// check_i8): G 1-12 including 3 and 7, hd 64/128, block sizes 1/5/7/16,
// without and with a window, and one sequence over many splits.
using PageCheck = void (*)(ops::Backend&, ops::Backend&, DType, Config, const std::vector<SeqSpec>&, int, uint32_t);
void one_byte_decode_sweep(ops::Backend& gpu, ops::Backend& cpu, PageCheck check, std::initializer_list<DType> acts,
                           uint32_t seed) {
  for (DType act : acts) {
    for (Config c :
         {Config{8, 8, 128, 16, act}, Config{32, 8, 128, 16, act}, Config{16, 2, 128, 16, act},
          Config{4, 4, 64, 16, act}, Config{8, 4, 64, 7, act}, Config{16, 2, 64, 1, act}, Config{32, 8, 128, 5, act},
          Config{9, 3, 64, 16, act}, Config{28, 4, 128, 16, act}, Config{24, 2, 128, 16, act}}) {
      std::vector<SeqSpec> seqs;
      for (int len : kDecodeLens) seqs.push_back({1, len});
      check(gpu, cpu, act, c, seqs, 0, seed += 7);
      check(gpu, cpu, act, c, seqs, 100, seed += 7);
    }
    check(gpu, cpu, act, Config{32, 8, 128, 16, act}, {{1, 20000}}, 0, seed += 7);  // many splits
  }
}

// Prompts, chunked prefill over earlier pages, and mixed steps (decode rows
// first, as the engine orders them), with and without sliding windows, with
// 16-bit q: every mma.sync prefill
// block shape the default choice reaches (short, few-wave and many-wave
// prompts) and, on Hopper, the wgmma kernel (its warp-specialised default,
// which takes F8_E4M3 and I8 pages at head_dim 64 and 128) for the
// prompt-heavy steps, next to the decode kernel.
void one_byte_prefill_sweep(ops::Backend& gpu, ops::Backend& cpu, PageCheck check, uint32_t seed) {
  for (DType act : {DType::kBF16, DType::kF16}) {
    for (Config c : {Config{32, 8, 128, 16, act}, Config{8, 2, 64, 16, act}, Config{9, 3, 128, 7, act}}) {
      check(gpu, cpu, act, c, kMixed, 0, seed += 7);
      check(gpu, cpu, act, c, kMixed, 9, seed += 7);
      check(gpu, cpu, act, c, {{1, 300}, {1, 47}, {64, 1000}, {200, 200}}, 0, seed += 7);
      check(gpu, cpu, act, c, {{700, 700}}, 0, seed += 7);
      check(gpu, cpu, act, c, {{700, 700}}, 300, seed += 7);                // a window, prompt-heavy
      check(gpu, cpu, act, c, {{300, 1024}, {200, 300}}, 100, seed += 7);  // chunks after earlier pages
      check(gpu, cpu, act, c, {{2048, 2048}}, 0, seed += 7);
      check(gpu, cpu, act, c, {{512, 512}, {512, 1024}, {300, 512}, {512, 600}, {1, 5}}, 0, seed += 7);
    }
  }
}

TEST_F(AttentionTest, F8PagesDecodeAcrossGroupsHeadDimsAndBlockSizes) {
  one_byte_decode_sweep(gpu(), cpu(), check_f8, {DType::kBF16, DType::kF16, DType::kF32}, 1300);
}

// The F8 variants of the prefill kernels (wgmma's included), and F32 q on
// the generic kernel.
TEST_F(AttentionTest, F8PagesPrefillAndMixedSteps) {
  one_byte_prefill_sweep(gpu(), cpu(), check_f8, 1500);
  uint32_t seed = 1700;
  check_f8(gpu(), cpu(), DType::kF32, Config{8, 2, 64, 16, DType::kF32}, kMixed, 0, seed += 7);
  check_f8(gpu(), cpu(), DType::kF32, Config{9, 3, 96, 7, DType::kF32}, kMixed, 5, seed += 7);
}

TEST_F(AttentionTest, KvWriteMatchesCpu) {
  uint32_t seed = 700;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3}) {
    for (Config c : {Config{4, 2, 64, 16, t}, Config{9, 3, 80, 7, t}}) {
      Batch h(kMixed, c.block_size, seed++);
      // Skip some tokens (slot -1), as the engine does for padding.
      h.slots[1] = -1;
      const int64_t n = h.num_tokens();
      const size_t page_elems = static_cast<size_t>(h.num_blocks) * c.block_size * c.hk * c.hd;
      auto kp = random_pages(t, page_elems, seed++), vp = random_pages(t, page_elems, seed++);
      auto k = random_floats(static_cast<size_t>(n * c.hk * c.hd), seed++, -3.0f, 3.0f);
      auto v = random_floats(static_cast<size_t>(n * c.hk * c.hd), seed++, -3.0f, 3.0f);
      std::vector<uint8_t> rk = kp, rv = vp;
      {
        ops::LayerKv kv;
        kv.k = Tensor(rk.data(), t, {h.num_blocks, c.block_size, c.hk, c.hd});
        kv.v = Tensor(rv.data(), t, {h.num_blocks, c.block_size, c.hk, c.hd});
        kv.k_scale = kF8KScale;
        kv.v_scale = kF8VScale;
        Tensor kt(k.data(), DType::kF32, {n, c.hk, c.hd}), vt(v.data(), DType::kF32, {n, c.hk, c.hd});
        const ops::AttentionBatch b = h.host();
        cpu().kv_write(kt, vt, b, kv);
      }
      DeviceAttentionBatch db(gpu(), h);
      DeviceMem gkp = upload(gpu(), kp), gvp = upload(gpu(), vp), gk = upload(gpu(), k), gv = upload(gpu(), v);
      ops::LayerKv kv;
      kv.k = Tensor(gkp.get(), t, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda);
      kv.v = Tensor(gvp.get(), t, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda);
      kv.k_scale = kF8KScale;
      kv.v_scale = kF8VScale;
      Tensor kt = dev_tensor(gk, DType::kF32, {n, c.hk, c.hd}), vt = dev_tensor(gv, DType::kF32, {n, c.hk, c.hd});
      gpu().kv_write(kt, vt, db.b, kv);
      EXPECT_EQ(download<uint8_t>(gpu(), gkp, kp.size()), rk) << "K pages " << tag(c, 0, kMixed);
      EXPECT_EQ(download<uint8_t>(gpu(), gvp, vp.size()), rv) << "V pages " << tag(c, 0, kMixed);
    }
  }
}

// ---- I8 pages (a scale a row) ---------------------------------------------------------
// Pages of int8_row_quantize'd rows whose magnitudes differ by row (K rows
// 0.03 .. 2, V rows 1e-5 .. 30, some rows all zero), so each row's own
// scale matters, and the V scales span the range where P times a scale
// would leave half's normal range (the decode kernel's m'). (K rows up to
// 30 make scores of hundreds, where the prefill kernel's K in bf16 -- as
// with BF16 pages -- moves the softmax beyond this test's bounds.)
struct I8Pages {
  std::vector<uint8_t> k, v;
  std::vector<float> ks, vs;
};
I8Pages i8_pages(const Config& c, int64_t num_blocks, uint32_t seed) {
  const int64_t rows = num_blocks * c.block_size * c.hk;
  I8Pages p;
  p.k.resize(static_cast<size_t>(rows * c.hd));
  p.v.resize(p.k.size());
  p.ks.resize(static_cast<size_t>(rows));
  p.vs.resize(p.ks.size());
  const auto kmag = random_floats(static_cast<size_t>(rows), seed, -1.5f, 0.3f);
  const auto vmag = random_floats(static_cast<size_t>(rows), seed + 1, -5.0f, 1.5f);
  const auto kf = random_floats(p.k.size(), seed + 2, -1.0f, 1.0f);
  const auto vf = random_floats(p.v.size(), seed + 3, -1.0f, 1.0f);
  i8_quantize_rows(kf, kmag, c.hd, c.hk, c.block_size, p.k.data(), p.ks.data());
  i8_quantize_rows(vf, vmag, c.hd, c.hk, c.block_size, p.v.data(), p.vs.data());
  return p;
}

// One step over such pages with q / out of dtype act (BF16 or F16: the
// tensor-core decode kernel and the prefill kernels' I8 variants),
// against the CPU backend on the same pages and the same (rounded) q. The
// CPU reads q * s in fp32; the GPU's decode kernel takes the int8 values
// exactly (in half) with the scales in fp32 and P' in half, its mma.sync
// prefill kernel q * s rounded to act, its wgmma prefill kernel (Hopper)
// q * s in F16 (s rounded to F16) and q rounded to F16.
void check_i8(ops::Backend& gpu, ops::Backend& cpu, DType act, Config c, const std::vector<SeqSpec>& seqs, int window,
              uint32_t seed) {
  c.kv_dtype = DType::kI8;
  const std::string what = std::string(dtype_name(act)) + " q, I8 pages, " + tag(c, window, seqs);
  Batch h(seqs, c.block_size, seed);
  const int64_t n = h.num_tokens();
  I8Pages p = i8_pages(c, h.num_blocks, seed + 1);
  RoundedQ q = rounded_q(act, static_cast<size_t>(n * c.hq * c.hd), seed + 3);
  expect_one_byte_step_close(
      run_on_both(gpu, cpu, c, h, p.k, p.v, act, q.bytes, q.values, window, 1.0f, 1.0f, &p.ks, &p.vs), act, what);
}

TEST_F(AttentionTest, I8PagesDecodeAcrossGroupsHeadDimsAndBlockSizes) {
  one_byte_decode_sweep(gpu(), cpu(), check_i8, {DType::kBF16, DType::kF16}, 2300);
}

// The prefill kernels' I8 variants (the mma.sync kernel's, and on Hopper
// the wgmma kernel's for prompt-heavy steps).
TEST_F(AttentionTest, I8PagesPrefillAndMixedSteps) { one_byte_prefill_sweep(gpu(), cpu(), check_i8, 2500); }

// The wgmma prefill kernel widens I8 codes to F16 with the row scale
// rounded to F16 and clamped to 515 (127 x 515 < 65504): V rows beyond
// F16's range (here every 13th row, scales 600 .. 1,600: values up to
// ~2e5) saturate instead of becoming infinite, i.e. the output is the
// CPU's over those scales clamped. Prompt-only steps (the wgmma kernel's).
TEST_F(AttentionTest, I8PagesPrefillVBeyondHalfSaturates) {
  if (!cuda::prefill_wgmma_available()) GTEST_SKIP() << "the wgmma prefill kernel needs an sm_90 device";
  uint32_t seed = 2900;
  for (DType act : {DType::kBF16, DType::kF16}) {
    for (Config c : {Config{32, 8, 128, 16, act}, Config{8, 2, 64, 16, act}}) {
      c.kv_dtype = DType::kI8;
      const std::vector<SeqSpec> seqs = {{700, 700}, {300, 400}};
      const std::string what = std::string(dtype_name(act)) + " q, I8 V beyond half, " + tag(c, 0, seqs);
      Batch h(seqs, c.block_size, seed += 7);
      I8Pages p = i8_pages(c, h.num_blocks, seed + 1);
      std::vector<float> clamped = p.vs;
      int big = 0;
      for (size_t r = 0; r < p.vs.size(); ++r) {
        if (r % 13 == 4) {
          p.vs[r] = 600.0f + static_cast<float>(r % 11) * 100.0f;
          ++big;
        }
        clamped[r] = std::min(p.vs[r], 515.0f);
      }
      ASSERT_GT(big, 0) << what;
      RoundedQ q = rounded_q(act, static_cast<size_t>(h.num_tokens() * c.hq * c.hd), seed + 3);
      const BothOutputs o =
          run_on_both(gpu(), cpu(), c, h, p.k, p.v, act, q.bytes, q.values, 0, 1.0f, 1.0f, &p.ks, &p.vs, &clamped);
      const auto got = unpack(act, o.gpu, 1, static_cast<int64_t>(o.ref.size()));
      int finite = 0;
      for (double x : got) finite += std::isfinite(x) ? 1 : 0;
      EXPECT_EQ(finite, static_cast<int>(got.size())) << what;
      expect_one_byte_step_close(o, act, what);
    }
  }
}

// BF16 q with components beyond half's range (up to 1e6) over one-byte
// pages in decode steps. The decode kernel rounds q to half for its f16
// products and must saturate such components at +-65504: an infinity
// would give NaN scores, any other value other scores. The K values are
// small (F8: 1e-5 a code unit; I8: row scales times 1e-3), so a saturated
// component gives scores of a few units and the softmax stays far from
// one-hot. The CPU reads q with those components clamped to +-65504.
TEST_F(AttentionTest, OneBytePagesDecodeSaturateBf16QBeyondHalf) {
  uint32_t seed = 2900;
  for (DType kv : {DType::kF8E4M3, DType::kI8}) {
    for (Config c : {Config{32, 8, 128, 16, DType::kBF16}, Config{8, 2, 64, 7, DType::kBF16}}) {
      c.kv_dtype = kv;
      std::vector<SeqSpec> seqs;
      for (int len : kDecodeLens) seqs.push_back({1, len});
      Batch h(seqs, c.block_size, seed += 7);
      const std::string what = std::string(dtype_name(kv)) + " pages, BF16 q beyond half, " + tag(c, 0, seqs);
      const int64_t n = h.num_tokens();
      const size_t q_elems = static_cast<size_t>(n * c.hq * c.hd);
      auto f = random_floats(q_elems, seed + 3, -2.0f, 2.0f);
      const float big[] = {1.0e6f, -3.0e5f, 7.0e4f, -65536.0f};
      for (int64_t t = 0; t < n; ++t) {
        for (int j = 0; j < 4; ++j) {
          const int64_t head = (t * 5 + j * 3) % c.hq, d = (t * 37 + j * 11) % c.hd;
          f[static_cast<size_t>((t * c.hq + head) * c.hd + d)] = big[j];
        }
      }
      const auto qb = pack(DType::kBF16, f, 1, static_cast<int64_t>(q_elems));
      const auto qv = unpack(DType::kBF16, qb, 1, static_cast<int64_t>(q_elems));
      std::vector<float> qr(qv.begin(), qv.end());
      int beyond = 0;
      for (float& x : qr) {
        beyond += std::fabs(x) > 65504.0f;
        x = std::clamp(x, -65504.0f, 65504.0f);
      }
      ASSERT_EQ(beyond, 4 * n) << what;
      const size_t page_elems = static_cast<size_t>(h.num_blocks) * c.block_size * c.hk * c.hd;
      if (kv == DType::kF8E4M3) {
        auto kp = f8_codes(page_elems, kF8KScale, seed + 1), vp = f8_codes(page_elems, kF8VScale, seed + 2);
        expect_one_byte_step_close(run_on_both(gpu(), cpu(), c, h, kp, vp, DType::kBF16, qb, qr, 0, 1.0e-5f, kF8VScale),
                                   DType::kBF16, what);
      } else {
        I8Pages p = i8_pages(c, h.num_blocks, seed + 1);
        for (float& s : p.ks) s *= 1.0e-3f;
        expect_one_byte_step_close(
            run_on_both(gpu(), cpu(), c, h, p.k, p.v, DType::kBF16, qb, qr, 0, 1.0f, 1.0f, &p.ks, &p.vs), DType::kBF16,
            what);
      }
    }
  }
}

// kv_write into I8 pages: codes and row scales bit for bit the CPU's
// (int8_row_quantize), rows of very different magnitudes, a zero row, a
// row with a NaN (scale NaN, codes 0), skipped slots untouched.
TEST_F(AttentionTest, KvWriteI8MatchesCpu) {
  uint32_t seed = 900;
  for (DType act : {DType::kF32, DType::kBF16}) {
    for (Config c : {Config{4, 2, 64, 16, act}, Config{9, 3, 80, 7, act}, Config{32, 8, 128, 16, act}}) {
      Batch h(kMixed, c.block_size, seed++);
      h.slots[1] = -1;
      const int64_t n = h.num_tokens();
      const int64_t rows = h.num_blocks * c.block_size * c.hk;
      std::vector<uint8_t> kp(static_cast<size_t>(rows * c.hd), 0x5a), vp = kp;
      std::vector<float> ksc(static_cast<size_t>(rows), -7.0f), vsc = ksc;
      auto k = random_floats(static_cast<size_t>(n * c.hk * c.hd), seed++, -3.0f, 3.0f);
      auto v = random_floats(static_cast<size_t>(n * c.hk * c.hd), seed++, -3.0f, 3.0f);
      for (int64_t r = 0; r < n * c.hk; ++r) {  // row magnitudes 1e-4 .. 1e2
        const float m = std::pow(10.0f, static_cast<float>(r % 7) - 4.0f);
        for (int d = 0; d < c.hd; ++d) k[static_cast<size_t>(r * c.hd + d)] *= m;
      }
      for (int d = 0; d < c.hd; ++d) v[static_cast<size_t>(d)] = 0.0f;  // token 0, head 0: a zero row
      v[static_cast<size_t>(2 * c.hk * c.hd + 3)] = std::numeric_limits<float>::quiet_NaN();  // token 2, head 0
      // Values as the activation dtype holds them (the GPU reads act; the CPU reference reads these floats).
      auto as_act = [&](std::vector<float>& x) {
        const auto r = unpack(act, pack(act, x, 1, static_cast<int64_t>(x.size())), 1, static_cast<int64_t>(x.size()));
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(r[i]);
      };
      as_act(k);
      as_act(v);
      std::vector<uint8_t> rk = kp, rv = vp;
      std::vector<float> rks = ksc, rvs = vsc;
      {
        ops::LayerKv kv;
        kv.k = Tensor(rk.data(), DType::kI8, {h.num_blocks, c.block_size, c.hk, c.hd});
        kv.v = Tensor(rv.data(), DType::kI8, {h.num_blocks, c.block_size, c.hk, c.hd});
        kv.k_row_scales = Tensor(rks.data(), DType::kF32, {h.num_blocks, c.hk, c.block_size});
        kv.v_row_scales = Tensor(rvs.data(), DType::kF32, {h.num_blocks, c.hk, c.block_size});
        Tensor kt(k.data(), DType::kF32, {n, c.hk, c.hd}), vt(v.data(), DType::kF32, {n, c.hk, c.hd});
        const ops::AttentionBatch b = h.host();
        cpu().kv_write(kt, vt, b, kv);
      }
      DeviceAttentionBatch db(gpu(), h);
      const auto kb = pack(act, k, 1, static_cast<int64_t>(k.size())), vb = pack(act, v, 1, static_cast<int64_t>(v.size()));
      DeviceMem gkp = upload(gpu(), kp), gvp = upload(gpu(), vp), gk = upload(gpu(), kb), gv = upload(gpu(), vb);
      DeviceMem gks = upload(gpu(), ksc), gvs = upload(gpu(), vsc);
      ops::LayerKv kv;
      kv.k = Tensor(gkp.get(), DType::kI8, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda);
      kv.v = Tensor(gvp.get(), DType::kI8, {h.num_blocks, c.block_size, c.hk, c.hd}, Device::kCuda);
      kv.k_row_scales = Tensor(gks.get(), DType::kF32, {h.num_blocks, c.hk, c.block_size}, Device::kCuda);
      kv.v_row_scales = Tensor(gvs.get(), DType::kF32, {h.num_blocks, c.hk, c.block_size}, Device::kCuda);
      Tensor kt = dev_tensor(gk, act, {n, c.hk, c.hd}), vt = dev_tensor(gv, act, {n, c.hk, c.hd});
      gpu().kv_write(kt, vt, db.b, kv);
      const std::string what = std::string(dtype_name(act)) + " " + tag(c, 0, kMixed);
      EXPECT_EQ(download<uint8_t>(gpu(), gkp, kp.size()), rk) << "K pages " << what;
      EXPECT_EQ(download<uint8_t>(gpu(), gvp, vp.size()), rv) << "V pages " << what;
      const auto gotk = download<float>(gpu(), gks, ksc.size()), gotv = download<float>(gpu(), gvs, vsc.size());
      int nans = 0;
      for (size_t r = 0; r < ksc.size(); ++r) {
        EXPECT_EQ(gotk[r], rks[r]) << "K scale " << r << " " << what;
        if (std::isnan(rvs[r])) {
          ++nans;
          EXPECT_TRUE(std::isnan(gotv[r])) << "V scale " << r << " " << what;
        } else {
          EXPECT_EQ(gotv[r], rvs[r]) << "V scale " << r << " " << what;
        }
      }
      EXPECT_EQ(nans, 1) << what;
    }
  }
}

}  // namespace
}  // namespace osprey::gpu_test
