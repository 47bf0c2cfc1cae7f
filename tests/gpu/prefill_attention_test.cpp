// Prefill attention on BF16, F16 and F8_E4M3 pages (prefill_wgmma.cu, the Hopper
// wgmma kernel, where the device and shape allow it; prefill_attention_mma.cu:
// every block shape and the automatic choice; the wmma fallback; the
// paged_attention op) against a float64 reference, and the fused QKV norm + RoPE + KV write
// (qkv_rope.cu: the vectorised kernel and the general one) against the CPU
// backend, at prefill sizes.
//
// Not tests: DISABLED_PrefillAttentionBench prints TFLOP/s of one causal
// prompt of 1k / 2k / 4k / 8k tokens and of 4 x 2k (Llama-3-8B heads: 32 q /
// 8 kv x 128) for every block shape and both block orders (bf16), the wgmma
// kernel (sm_90) and the automatic choice in f16 and over F8_E4M3 pages. Run with
//   gpu_tests --gtest_also_run_disabled_tests --gtest_filter='*PrefillAttentionBench*'
// (OSPREY_BENCH_HEADS: the head shape; OSPREY_BENCH_CASES=4096,4x2048: only
// those cases).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention/prefill_attention_mma.h"
#include "backend/cuda/attention/prefill_wgmma.h"
#include "backend/cuda/kernels.h"
#include "bench_heads.h"
#include "gpu_test_util.h"
#include "ops/rope_freq.h"

namespace osprey::gpu_test {
namespace {

struct Heads {
  int hq, hk, hd;
  int window;  // 0: none
};

// Problem::run's variants for the Hopper wgmma kernel: kWgmma - v is its
// variant v + 1 (prefill_wgmma.h), down to kWgmmaLast.
constexpr int kWgmma = -3;
constexpr int kWgmmaLast = kWgmma - (cuda::kNumPrefillWgmmaVariants - 2);

// One sequence of a step: q_len new tokens after `past` tokens already in
// the pages (prefix cache hit or earlier chunks).
struct Seq {
  int q_len, past;
};

// F8_E4M3 pages of a Problem: kNone (16-bit pages), kRandom (codes of
// random values in [-2, 2] under scales 0.01 for K and 0.5 for V: K codes up
// to 200, V codes up to 4), kSubnormal (only the codes of magnitude below
// 2^-6, subnormal or zero, under scale 64 for both: values up to 0.875, so
// a reader that flushes or misreads them fails), kI8 (not F8: INT8 codes
// under a scale per row, ops::kv_row_scale_index, as int8_row_quantize
// writes them: random values in [-2, 2] times a magnitude per row, 10^u
// with u in [-1.5, 0.5] for K and [-2, 1] for V, one row in 23 all zeros).
enum class F8Pages { kNone, kRandom, kSubnormal, kI8 };

// A prefill step over pages of dt (BF16 or F16; q and out too), or of
// one-byte codes (f8, F8Pages; q and out of dt): random q/k/v (values exact
// in dt, or e4m3 codes times the scale, or I8 codes times their row's), each sequence's pages a range of
// its own in shuffled order, positions past + i, slots -1 (this step's K/V
// already in the pages). Owns its device copies.
class Problem {
 public:
  Problem(ops::Backend& gpu, Heads h, const std::vector<Seq>& seqs, int bs, uint32_t seed, float scale = 0.0f,
          DType dt = DType::kBF16, F8Pages f8 = F8Pages::kNone)
      : h_(h),
        bs_(bs),
        scale_(scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(h.hd))),
        dt_(dt),
        kv_dt_(f8 == F8Pages::kI8 ? DType::kI8 : f8 != F8Pages::kNone ? DType::kF8E4M3 : dt),
        k_scale_(f8 == F8Pages::kNone || f8 == F8Pages::kI8 ? 1.0f
                 : f8 == F8Pages::kSubnormal ? 64.0f
                                             : 0.01f),
        v_scale_(f8 == F8Pages::kNone || f8 == F8Pages::kI8 ? 1.0f
                 : f8 == F8Pages::kSubnormal ? 64.0f
                                             : 0.5f) {
    std::mt19937 rng(seed);
    for (const auto& s : seqs) hb_.add_seq_own_pages(s.q_len, s.past + s.q_len, bs, false, &rng);
    pages_ = static_cast<int>(hb_.block_indices.size());
    n_ = hb_.num_tokens();
    const size_t page_elems = static_cast<size_t>(bs) * h.hk * h.hd;
    const size_t kv_elems = static_cast<size_t>(pages_) * page_elems;
    if (f8 == F8Pages::kI8) {
      const int64_t rows = static_cast<int64_t>(pages_) * bs * h.hk;
      auto codes = [&](uint32_t s, float lo, float hi, std::vector<float>& values, std::vector<float>& scales) {
        std::vector<uint8_t> c(kv_elems);
        values.resize(kv_elems);
        scales.assign(static_cast<size_t>(rows), 0.0f);
        i8_quantize_rows(random_floats(kv_elems, s, -2, 2), random_floats(static_cast<size_t>(rows), s + 1, lo, hi),
                         h.hd, h.hk, bs, c.data(), scales.data(), values.data());
        return c;
      };
      std::vector<float> ks, vs;
      gk_.emplace(upload(gpu, codes(seed + 1, -1.5f, 0.5f, k_, ks)));
      gv_.emplace(upload(gpu, codes(seed + 2, -2.0f, 1.0f, v_, vs)));
      gks_.emplace(upload(gpu, ks));
      gvs_.emplace(upload(gpu, vs));
    } else if (f8 != F8Pages::kNone) {
      // Codes of random values in [-2, 2]; k_ / v_ hold what they stand for.
      auto codes = [&](uint32_t s, float kv_scale, std::vector<float>& values) {
        const auto f = random_floats(kv_elems, s, -2, 2);
        std::vector<uint8_t> c(kv_elems);
        values.resize(kv_elems);
        for (size_t i = 0; i < kv_elems; ++i) {
          // kSubnormal: the sign of the random value, a mantissa from its
          // magnitude, exponent field 0.
          c[i] = f8 == F8Pages::kSubnormal
                     ? static_cast<uint8_t>((f[i] < 0 ? 0x80 : 0) | (static_cast<int>(std::fabs(f[i]) * 4.0f) & 7))
                     : f32_to_f8e4m3(f[i] / kv_scale);
          values[i] = f8e4m3_to_f32(c[i]) * kv_scale;
        }
        return c;
      };
      gk_.emplace(upload(gpu, codes(seed + 1, k_scale_, k_)));
      gv_.emplace(upload(gpu, codes(seed + 2, v_scale_, v_)));
    } else {
      k_ = from_el(to_el(random_floats(kv_elems, seed + 1, -2, 2)));
      v_ = from_el(to_el(random_floats(kv_elems, seed + 2, -2, 2)));
      gk_.emplace(upload(gpu, to_el(k_)));
      gv_.emplace(upload(gpu, to_el(v_)));
    }
    q_ = from_el(to_el(random_floats(static_cast<size_t>(n_) * h.hq * h.hd, seed + 3, -2, 2)));
    gq_.emplace(upload(gpu, to_el(q_)));
    go_.emplace(gpu, q_.size() * 2);
    db_.emplace(gpu, hb_);
  }

  cuda::PagedAttentionArgs args() const {
    cuda::PagedAttentionArgs a = paged_attention_args(db_->b);
    a.act = dt_;
    a.q = gq_->get();
    a.k_cache = gk_->get();
    a.v_cache = gv_->get();
    a.kv_dtype = kv_dt_;
    a.k_scale = k_scale_;
    a.v_scale = v_scale_;
    if (gks_) {
      a.k_row_scales = static_cast<const float*>(gks_->get());
      a.v_row_scales = static_cast<const float*>(gvs_->get());
    }
    a.num_blocks = pages_;
    a.block_size = bs_;
    a.hq = h_.hq;
    a.hk = h_.hk;
    a.hd = h_.hd;
    a.scale = scale_;
    a.window = h_.window;
    a.out = go_->get();
    return a;
  }

  // Whether run(variant) applies here: the wgmma kernel (<= kWgmma) only on
  // an sm_90 device (with sm_90a code built) and for the shapes it covers.
  bool runs(int variant) const {
    if (variant <= kWgmma) {
      return cuda::prefill_wgmma_available() && cuda::prefill_wgmma_supports(args(), kWgmma - variant + 1);
    }
    return variant == -2 || kv_dt_ == dt_ || variant >= 0;  // the wmma kernel takes 16-bit pages only
  }

  // variant kWgmma - v: variant v + 1 of the Hopper wgmma kernel; -2:
  // through the paged_attention op (eagerly, or captured into a CUDA graph
  // and replayed after set_graph(true)); -1: the wmma kernel; else that
  // block shape of the mma kernel (0: its automatic choice).
  void run(ops::Backend& gpu, int variant) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (variant == -2) {
      ops::AttentionBatch b = db_->b;
      b.num_leading_decodes = leading_decodes_;
      ops::LayerKv kv{Tensor(gk_->get(), kv_dt_, {pages_, bs_, h_.hk, h_.hd}, Device::kCuda),
                      Tensor(gv_->get(), kv_dt_, {pages_, bs_, h_.hk, h_.hd}, Device::kCuda)};
      kv.k_scale = k_scale_;
      kv.v_scale = v_scale_;
      if (gks_) {
        kv.k_row_scales = Tensor(gks_->get(), DType::kF32, {pages_, h_.hk, bs_}, Device::kCuda);
        kv.v_row_scales = Tensor(gvs_->get(), DType::kF32, {pages_, h_.hk, bs_}, Device::kCuda);
      }
      Tensor q(gq_->get(), dt_, {n_, h_.hq, h_.hd}, Device::kCuda);
      Tensor out(go_->get(), dt_, {n_, h_.hq, h_.hd}, Device::kCuda);
      if (!graph_) {
        gpu.paged_attention(q, kv, b, scale_, h_.window, out);
      } else {  // captured into a CUDA graph, then replayed
        gpu.begin_capture();
        gpu.paged_attention(q, kv, b, scale_, h_.window, out);
        auto graph = gpu.end_capture();
        ASSERT_NE(graph, nullptr);
        graph->launch();
      }
      gpu.synchronize();
    } else if (variant <= kWgmma) {
      cuda::launch_prefill_attention_wgmma(args(), nullptr, kWgmma - variant + 1);
    } else if (variant == -1) {
      cuda::launch_prefill_attention_wmma(args(), nullptr);
    } else {
      cuda::launch_prefill_attention_mma(args(), nullptr, variant);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  // q element i set to v (rounded to dt) here and on the device; the
  // reference is recomputed at the next check.
  void set_q(ops::Backend& gpu, size_t i, float v) {
    q_.at(i) = from_el(to_el({v}))[0];
    gq_.emplace(upload(gpu, to_el(q_)));
    ref_.clear();
  }

  // AttentionBatch::num_leading_decodes for run(-2) (0: not given).
  void set_leading_decodes(int n) { leading_decodes_ = n; }
  void set_graph(bool on) { graph_ = on; }

  // 0xFFFF (a NaN in bf16 and in f16) everywhere, so an unwritten element fails.
  void poison() {
    ASSERT_EQ(cudaMemset(go_->get(), 0xFF, q_.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  // K and V of every slot past a sequence's keys in its last page made NaN
  // (0x7FFF in BF16 and F16, 0x7F in E4M3; I8: code 127 under a NaN row
  // scale): no kernel may let them reach the output (P = 0 times NaN is
  // NaN), as a whole-page copy would.
  void poison_past_end() {
    const size_t esz = kv_dt_ == DType::kF8E4M3 || kv_dt_ == DType::kI8 ? 1 : 2;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const size_t row_bytes = static_cast<size_t>(h_.hk) * h_.hd * esz;
    std::vector<uint8_t> nan_row(row_bytes);
    for (size_t i = 0; i < row_bytes; ++i) nan_row[i] = esz == 1 ? 0x7F : (i % 2 == 0 ? 0xFF : 0x7F);
    for (size_t s = 0; s < hb_.kv_lens.size(); ++s) {
      const auto pages = hb_.pages_of(static_cast<int>(s));
      for (int kp = hb_.kv_lens[s]; kp < static_cast<int>(pages.size()) * bs_; ++kp) {
        const size_t slot = static_cast<size_t>(pages[static_cast<size_t>(kp / bs_)]) * bs_ + kp % bs_;
        for (const auto* m : {&*gk_, &*gv_}) {
          ASSERT_EQ(cudaMemcpy(static_cast<char*>(m->get()) + slot * row_bytes, nan_row.data(), row_bytes,
                               cudaMemcpyHostToDevice),
                    cudaSuccess);
        }
        if (gks_) {
          for (int kvh = 0; kvh < h_.hk; ++kvh) {
            const auto at = ops::kv_row_scale_index(static_cast<int64_t>(slot), kvh, h_.hk, bs_);
            for (const auto* m : {&*gks_, &*gvs_}) {
              ASSERT_EQ(cudaMemcpy(static_cast<float*>(m->get()) + at, &nan, sizeof(float), cudaMemcpyHostToDevice),
                        cudaSuccess);
            }
          }
        }
      }
    }
  }

  std::vector<uint16_t> output(ops::Backend& gpu) const { return download<uint16_t>(gpu, *go_, q_.size()); }

  // float64 attention of token t, all query heads: [hq * hd].
  std::vector<double> reference(int t) const {
    int seq = 0;
    while (hb_.q_indptr[static_cast<size_t>(seq) + 1] <= t) ++seq;
    const int pos = hb_.positions[static_cast<size_t>(t)];
    const int hi = std::min(pos + 1, hb_.kv_lens[static_cast<size_t>(seq)]);
    const int lo = h_.window > 0 ? std::max(0, pos - h_.window + 1) : 0;
    const int group = h_.hq / h_.hk;
    std::vector<double> out(static_cast<size_t>(h_.hq) * h_.hd, 0.0);
    std::vector<double> p(static_cast<size_t>(std::max(hi - lo, 0)));
    auto row = [&](const std::vector<float>& cache, int kp, int kvh) {
      const int page = hb_.pages_of(seq)[static_cast<size_t>(kp / bs_)];
      return cache.data() + ((static_cast<size_t>(page) * bs_ + kp % bs_) * h_.hk + kvh) * h_.hd;
    };
    for (int head = 0; head < h_.hq; ++head) {
      const int kvh = head / group;
      const float* qv = q_.data() + (static_cast<size_t>(t) * h_.hq + head) * h_.hd;
      double mx = -INFINITY;
      for (int kp = lo; kp < hi; ++kp) {
        const float* kr = row(k_, kp, kvh);
        double dot = 0;
        for (int d = 0; d < h_.hd; ++d) dot += double{qv[d]} * kr[d];
        p[static_cast<size_t>(kp - lo)] = dot * scale_;
        mx = std::max(mx, dot * scale_);
      }
      double sum = 0;
      for (auto& x : p) sum += (x = std::exp(x - mx));
      double* o = out.data() + static_cast<size_t>(head) * h_.hd;
      for (int kp = lo; kp < hi; ++kp) {
        const float* vr = row(v_, kp, kvh);
        const double w = p[static_cast<size_t>(kp - lo)] / sum;
        for (int d = 0; d < h_.hd; ++d) o[d] += w * vr[d];
      }
    }
    return out;
  }

  // Every element written and finite; every stride-th token and the last of
  // each sequence within 16-bit rounding of the reference (kept across calls).
  void check(ops::Backend& gpu, int stride, const std::string& what) {
    const auto got = from_el(output(gpu));
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " unwritten or not finite";
    }
    const bool fresh = ref_.empty();
    std::vector<float> g;
    const size_t row = static_cast<size_t>(h_.hq) * h_.hd;
    for (int t = 0; t < n_; ++t) {
      const bool last = std::find(hb_.q_indptr.begin() + 1, hb_.q_indptr.end(), t + 1) != hb_.q_indptr.end();
      if (t % stride != 0 && !last) continue;
      if (fresh) {
        const auto r = reference(t);
        ref_.insert(ref_.end(), r.begin(), r.end());
      }
      g.insert(g.end(), got.begin() + static_cast<std::ptrdiff_t>(t * row),
               got.begin() + static_cast<std::ptrdiff_t>((t + 1) * row));
    }
    // P is rounded to dt before P V, then the output: a few bf16 ulps (f16,
    // 3 more mantissa bits, is held to the same bound).
    expect_close(g, ref_, 3e-4, 3e-2,
                 what + " " + std::string(dtype_name(dt_)) + " pages " + std::string(dtype_name(kv_dt_)));
  }

  double causal_flops() const {
    double pairs = 0;
    for (int t = 0; t < n_; ++t) {
      const int pos = hb_.positions[static_cast<size_t>(t)];
      pairs += pos + 1 - (h_.window > 0 ? std::max(0, pos - h_.window + 1) : 0);
    }
    return 4.0 * pairs * h_.hq * h_.hd;
  }

 private:
  std::vector<uint16_t> to_el(const std::vector<float>& v) const { return dt_ == DType::kF16 ? to_f16(v) : to_bf16(v); }
  std::vector<float> from_el(const std::vector<uint16_t>& v) const {
    return dt_ == DType::kF16 ? from_f16(v) : from_bf16(v);
  }

  Heads h_;
  int bs_;
  float scale_;
  DType dt_;
  DType kv_dt_;              // dt_, F8_E4M3 or I8
  float k_scale_, v_scale_;  // F8_E4M3 pages (1 for the others)
  HostAttentionBatch hb_;    // slots -1
  int pages_ = 0, n_ = 0;    // pages in the pool (all of hb_'s), tokens
  int leading_decodes_ = 0;
  bool graph_ = false;
  std::vector<float> k_, v_, q_;
  std::vector<double> ref_;
  std::optional<DeviceMem> gk_, gv_, gq_, go_;
  std::optional<DeviceMem> gks_, gvs_;  // I8: the row scales, [pages][hk][bs]
  std::optional<DeviceAttentionBatch> db_;
};

std::string tag(Heads h, int bs, int variant) {
  if (variant <= kWgmma) {
    return "hq=" + std::to_string(h.hq) + " hk=" + std::to_string(h.hk) + " hd=" + std::to_string(h.hd) +
           " window=" + std::to_string(h.window) + " bs=" + std::to_string(bs) + " wgmma" +
           std::to_string(kWgmma - variant + 1);
  }
  return "hq=" + std::to_string(h.hq) + " hk=" + std::to_string(h.hk) + " hd=" + std::to_string(h.hd) +
         " window=" + std::to_string(h.window) + " bs=" + std::to_string(bs) + " variant=" + std::to_string(variant);
}

class PrefillAttention : public GpuTest {};

// Every block shape (and the op, and the wmma kernel) on: GQA 1 / 4 / 8,
// head_dim 64 / 128, sliding windows, chunks after earlier pages, a decode
// row in a prefill batch, page sizes 16 / 32 and a non-power-of-two one;
// BF16 here, F16 below.
void every_block_shape_matches_float64(ops::Backend& gpu, DType dt) {
  const std::vector<Seq> mixed = {{700, 0}, {333, 1200}, {1, 900}, {64, 64}, {129, 3}};
  struct Case {
    Heads h;
    std::vector<Seq> seqs;
    int bs;
  };
  const std::vector<Case> cases = {
      {{32, 8, 128, 0}, mixed, 16},        // Llama-3-8B heads
      {{8, 8, 128, 0}, mixed, 16},         // G = 1
      {{16, 2, 64, 0}, mixed, 32},         // G = 8, hd 64
      {{8, 1, 128, 300}, mixed, 16},       // MQA, window
      {{8, 2, 64, 77}, mixed, 24},         // window, page size not a power of two
      {{16, 4, 128, 0}, mixed, 24},        // hd 128, page size not a power of two
      {{32, 8, 128, 0}, {{1536, 0}}, 16},  // one long prompt
  };
  uint32_t seed = 11;
  for (const auto& c : cases) {
    Problem pb(gpu, c.h, c.seqs, c.bs, seed += 7, 0.0f, dt);
    for (int variant = kWgmmaLast; variant < cuda::kNumPrefillMmaVariants; ++variant) {
      if (!pb.runs(variant)) continue;
      pb.poison();
      pb.run(gpu, variant);
      pb.check(gpu, 41, tag(c.h, c.bs, variant));
    }
  }
}

// A mixed step through the op: single-token rows (decodes) first, then
// prompts and chunks. With num_leading_decodes given, the decodes run in the
// decode kernel (on the backend's side stream) and the rest in the prefill
// kernels, concurrently; without, one prefill launch. Both match float64,
// eagerly and from a CUDA graph, and the hint may cover fewer decode rows
// than there are (the rest stay with the prompts).
void mixed_step_matches_float64(ops::Backend& gpu, DType dt) {
  const std::vector<Seq> seqs = {{1, 900}, {1, 2047}, {1, 0},    {1, 130}, {1, 4500},
                                 {700, 0}, {1, 64},   {99, 300}, {1, 17}};
  struct Case {
    Heads h;
    int bs;
  };
  const std::vector<Case> cases = {
      {{32, 8, 128, 0}, 16},   // Llama-3-8B heads
      {{8, 8, 128, 0}, 16},    // G = 1
      {{16, 2, 64, 0}, 32},    // G = 8, hd 64
      {{8, 1, 128, 300}, 16},  // MQA, window
      {{16, 4, 128, 0}, 24},   // page size not a power of two
  };
  uint32_t seed = 501;
  for (const auto& c : cases) {
    Problem pb(gpu, c.h, seqs, c.bs, seed += 7, 0.0f, dt);
    for (int lead : {0, 5, 3, 1}) {
      pb.set_leading_decodes(lead);
      pb.poison();
      pb.run(gpu, -2);
      pb.check(gpu, 37, tag(c.h, c.bs, -2) + " leading decodes " + std::to_string(lead));
      // The same step from a CUDA graph (the decode part's side stream is
      // forked and joined inside the capture).
      if (!gpu.supports_graphs()) continue;
      pb.poison();
      pb.set_graph(true);
      pb.run(gpu, -2);
      pb.set_graph(false);
      pb.check(gpu, 37, tag(c.h, c.bs, -2) + " graph, leading decodes " + std::to_string(lead));
    }
  }
}

TEST_F(PrefillAttention, MixedStepDecodesSplitOffMatchFloat64) {
  mixed_step_matches_float64(gpu(), DType::kBF16);
}

TEST_F(PrefillAttention, MixedStepDecodesSplitOffMatchFloat64F16) {
  mixed_step_matches_float64(gpu(), DType::kF16);
}

TEST_F(PrefillAttention, EveryBlockShapeMatchesFloat64) {
  every_block_shape_matches_float64(gpu(), DType::kBF16);
}

TEST_F(PrefillAttention, EveryBlockShapeMatchesFloat64F16) {
  every_block_shape_matches_float64(gpu(), DType::kF16);
}

// Prompt lengths where the automatic choice takes the wide block shapes:
// long prompts (1000-4096 tokens), a chunk after 2100 earlier tokens, a
// decode-like row after 3000, GQA 1/4/8, head_dim 64/128, windows; through
// the op, the wmma kernel and every block shape.
void long_prompts_and_chunks_match_float64(ops::Backend& gpu, DType dt) {
  const std::vector<Seq> mixed = {{1000, 2100}, {1500, 0}, {1, 3000}, {77, 5}};
  struct Case {
    Heads h;
    std::vector<Seq> seqs;
    int bs;
  };
  const std::vector<Case> cases = {
      {{4, 4, 128, 0}, mixed, 16},         // G = 1
      {{8, 2, 64, 0}, mixed, 16},          // G = 4
      {{8, 1, 128, 0}, mixed, 32},         // G = 8 (MQA)
      {{8, 2, 128, 513}, mixed, 16},       // window
      {{4, 1, 64, 100}, {{4096, 0}}, 16},  // one 4096-token prompt, small window
      {{8, 2, 128, 0}, {{4096, 0}}, 16},   // one 4096-token prompt
      {{32, 8, 128, 0}, {{4096, 0}}, 16},  // one 4096-token prompt, Llama-3-8B heads
  };
  uint32_t seed = 200;
  for (const auto& c : cases) {
    Problem pb(gpu, c.h, c.seqs, c.bs, seed += 3, 0.0f, dt);
    for (int variant = kWgmmaLast; variant < cuda::kNumPrefillMmaVariants; ++variant) {
      if (!pb.runs(variant)) continue;
      pb.poison();
      pb.run(gpu, variant);
      pb.check(gpu, 97, tag(c.h, c.bs, variant));
    }
  }
}

TEST_F(PrefillAttention, LongPromptsAndChunks) {
  long_prompts_and_chunks_match_float64(gpu(), DType::kBF16);
}

TEST_F(PrefillAttention, LongPromptsAndChunksF16) {
  long_prompts_and_chunks_match_float64(gpu(), DType::kF16);
}

// Row and key tiles of 128 (the wgmma kernel's): prompts and chunks ending
// just before, on and after tile boundaries, single rows after 127 and 128
// earlier keys, G = 1 / 3 / 4 / 8, head_dim 128 and 64, sliding windows
// shorter and longer than a tile; the wgmma kernel (where it runs: on an
// sm_90 device, head_dim 64 and windows in variants 2 and 3 only) and the
// op.
TEST_F(PrefillAttention, WgmmaTileBoundaries) {
  const std::vector<Seq> seqs = {{127, 0}, {128, 0},  {129, 0}, {1, 127},   {1, 128}, {31, 97},
                                 {32, 96}, {33, 224}, {255, 1}, {257, 255}, {2, 0}};
  uint32_t seed = 400;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (Heads h : {Heads{8, 8, 128, 0}, Heads{32, 8, 128, 0}, Heads{8, 1, 128, 0}, Heads{32, 8, 64, 0},
                    Heads{9, 3, 64, 0}, Heads{8, 1, 64, 0}, Heads{32, 8, 128, 100}, Heads{8, 8, 128, 128},
                    Heads{9, 3, 64, 129}, Heads{8, 1, 64, 200}}) {
      Problem pb(gpu(), h, seqs, 16, seed += 5, 0.0f, dt);
      pb.poison_past_end();
      if (cuda::prefill_wgmma_available()) {
        const bool ws_only = h.hd == 64 || h.window > 0;
        EXPECT_TRUE(pb.runs(kWgmma - 1) && pb.runs(kWgmma - 2)) << tag(h, 16, kWgmma - 2);
        EXPECT_EQ(pb.runs(kWgmma), !ws_only) << tag(h, 16, kWgmma);
        EXPECT_EQ(pb.runs(kWgmma - 3), !ws_only) << tag(h, 16, kWgmma - 3);
      }
      for (int variant = kWgmmaLast; variant <= -2; ++variant) {
        if (!pb.runs(variant)) continue;
        pb.poison();
        pb.run(gpu(), variant);
        pb.check(gpu(), 7, tag(h, 16, variant));
      }
    }
  }
}

// The warp-specialised variants' K/V copies by the bulk tensor copy engine
// (TMA: 16-bit pages of a power-of-two size >= 8, one box a page or 128
// rows of one; taken by default wherever it can, and with
// OSPREY_PREFILL_TMA=1) against float64 and bit for bit against their
// cp.async copies (OSPREY_PREFILL_TMA=0), at page sizes
// 8 .. 256 (and 4 and 12, which stay on cp.async), with NaN in every slot
// past a sequence's keys: the box holding a range's end must not bring
// them in. Tile and page boundaries, chunks after earlier pages, G 1 / 3 /
// 4, head_dim 64 and 128, a sliding window.
TEST_F(PrefillAttention, WgmmaTmaPageSizes) {
  if (!cuda::prefill_wgmma_available()) GTEST_SKIP() << "needs an sm_90 device and sm_90a code";
  const std::vector<Seq> seqs = {{127, 0}, {129, 0}, {1, 127}, {33, 224}, {257, 255}, {2, 0}, {300, 20}, {8, 8}};
  uint32_t seed = 900;
  for (int bs : {8, 16, 32, 64, 128, 256, 4, 12}) {
    for (Heads h : {Heads{32, 8, 128, 0}, Heads{9, 3, 64, 0}, Heads{8, 1, 128, 200}}) {
      for (DType dt : {DType::kBF16, DType::kF16}) {
        if (dt == DType::kF16 && h.hd != 128) continue;
        Problem pb(gpu(), h, seqs, bs, seed += 3, 0.0f, dt);
        pb.poison_past_end();
        const bool tma = bs >= 8 && (bs & (bs - 1)) == 0;
        for (int variant : {kWgmma - 1, kWgmma - 2}) {  // variants 2 and 3
          const int v = kWgmma - variant + 1;
          const std::string what = tag(h, bs, variant);
          ASSERT_TRUE(pb.runs(variant)) << what;
          EXPECT_EQ(cuda::prefill_wgmma_uses_tma(pb.args(), v), tma) << what;
          ASSERT_EQ(setenv("OSPREY_PREFILL_TMA", "1", 1), 0);
          EXPECT_EQ(cuda::prefill_wgmma_uses_tma(pb.args(), v), tma) << what;
          pb.poison();
          pb.run(gpu(), variant);
          pb.check(gpu(), 5, what);
          const auto with_tma = pb.output(gpu());
          ASSERT_EQ(setenv("OSPREY_PREFILL_TMA", "0", 1), 0);
          EXPECT_FALSE(cuda::prefill_wgmma_uses_tma(pb.args(), v)) << what;
          pb.poison();
          pb.run(gpu(), variant);
          ASSERT_EQ(unsetenv("OSPREY_PREFILL_TMA"), 0);
          if (HasFatalFailure()) return;
          EXPECT_TRUE(pb.output(gpu()) == with_tma) << what << ": TMA and cp.async copies differ";
        }
      }
    }
  }
}

// The warp-specialised variants' q tile by the bulk tensor copy engine
// (where G divides the block's 128 rows; OSPREY_PREFILL_TMA_Q=0 turns it
// off) against float64 and bit for bit against every thread's cp.async of
// it: tile and sequence boundaries (a block's rows past its sequence read
// the next sequence's q, masked; past the step's last token, zeros), G 1 /
// 2 / 4 / 8 and 3 (no TMA), head_dim 64 and 128, BF16 and F16, F8_E4M3
// pages, a window.
TEST_F(PrefillAttention, WgmmaTmaQMatchesCpAsyncQ) {
  if (!cuda::prefill_wgmma_available()) GTEST_SKIP() << "needs an sm_90 device and sm_90a code";
  const std::vector<Seq> seqs = {{127, 0}, {129, 0}, {1, 127}, {33, 224}, {257, 255}, {2, 0}, {300, 20}, {31, 8}};
  struct Case {
    Heads h;
    DType dt;
    F8Pages f8;
  };
  const std::vector<Case> cases = {
      {{32, 8, 128, 0}, DType::kBF16, F8Pages::kNone}, {{8, 8, 128, 0}, DType::kBF16, F8Pages::kNone},
      {{8, 1, 128, 0}, DType::kF16, F8Pages::kNone},   {{16, 8, 64, 0}, DType::kBF16, F8Pages::kNone},
      {{9, 3, 64, 0}, DType::kBF16, F8Pages::kNone},   {{32, 8, 128, 0}, DType::kBF16, F8Pages::kRandom},
      {{32, 8, 64, 0}, DType::kF16, F8Pages::kRandom}, {{8, 2, 128, 200}, DType::kBF16, F8Pages::kNone},
  };
  uint32_t seed = 1300;
  for (const auto& c : cases) {
    Problem pb(gpu(), c.h, seqs, 16, seed += 3, 0.0f, c.dt, c.f8);
    const bool tma_q = 128 % (c.h.hq / c.h.hk) == 0;
    EXPECT_EQ(cuda::prefill_wgmma_q_tma(pb.args()), tma_q) << tag(c.h, 16, 0);
    for (int variant : {kWgmma - 1, kWgmma - 2}) {  // variants 2 and 3
      const std::string what = tag(c.h, 16, variant) + (c.f8 == F8Pages::kRandom ? " F8 pages" : "");
      ASSERT_TRUE(pb.runs(variant)) << what;
      pb.poison();
      pb.run(gpu(), variant);
      pb.check(gpu(), 5, what);
      const auto with = pb.output(gpu());
      ASSERT_EQ(setenv("OSPREY_PREFILL_TMA_Q", "0", 1), 0);
      EXPECT_FALSE(cuda::prefill_wgmma_q_tma(pb.args())) << what;
      pb.poison();
      pb.run(gpu(), variant);
      ASSERT_EQ(unsetenv("OSPREY_PREFILL_TMA_Q"), 0);
      if (HasFatalFailure()) return;
      EXPECT_TRUE(pb.output(gpu()) == with) << what << ": q by TMA and by cp.async differ";
    }
  }
}

// Which wgmma variants take which pages and heads: 16-bit pages in every
// variant at head_dim 128; head_dim 64, sliding windows, F8_E4M3 pages and
// I8 pages (with their row scales) only in the warp-specialised variants 2
// and 3; never other head_dims, or I8 pages without row scales.
// (The I8 variants' numbers are checked through the op by AttentionTest's
// I8PagesPrefillAndMixedSteps, whose prompt-heavy steps take them.)
TEST_F(PrefillAttention, WgmmaVariantsCoverShapes) {
  Problem pb(gpu(), {32, 8, 128, 0}, {{300, 0}}, 16, 3);
  const float scales[1] = {1.0f};
  auto covers = [&](int hd, DType kv, int variant, int window = 0, bool row_scales = true) {
    cuda::PagedAttentionArgs a = pb.args();
    a.hd = hd;
    a.kv_dtype = kv;
    a.window = window;
    if (kv == DType::kI8 && row_scales) a.k_row_scales = a.v_row_scales = scales;
    return cuda::prefill_wgmma_supports(a, variant);
  };
  for (int variant = 1; variant < cuda::kNumPrefillWgmmaVariants; ++variant) {
    const bool ws = variant == 2 || variant == 3;
    const std::string v = "variant " + std::to_string(variant);
    EXPECT_TRUE(covers(128, DType::kBF16, variant)) << v;
    EXPECT_EQ(covers(64, DType::kBF16, variant), ws) << v;
    EXPECT_EQ(covers(128, DType::kF8E4M3, variant), ws) << v;
    EXPECT_EQ(covers(64, DType::kF8E4M3, variant), ws) << v;
    EXPECT_EQ(covers(128, DType::kI8, variant), ws) << v;
    EXPECT_EQ(covers(64, DType::kI8, variant), ws) << v;
    EXPECT_FALSE(covers(128, DType::kI8, variant, 0, false)) << v << ": I8 pages without row scales";
    EXPECT_EQ(covers(128, DType::kBF16, variant, 512), ws) << v << ": window";
    EXPECT_EQ(covers(64, DType::kI8, variant, 4096), ws) << v << ": window";
    EXPECT_FALSE(covers(96, DType::kBF16, variant)) << v << ": head_dim 96";
    EXPECT_FALSE(covers(256, DType::kBF16, variant)) << v << ": head_dim 256";
  }
  EXPECT_EQ(cuda::kPrefillWgmmaDefaultVariant, 3);
}

// One-byte pages (codes: F8Pages::kRandom, with kSubnormal cases, or kI8):
// the wgmma kernel's one-byte variants (2 and 3, where they run: on an
// sm_90 device they must), the op and the mma.sync kernel's automatic
// choice, against float64 over the values the codes stand for; tile
// boundaries, prompts after earlier pages, a decode row in a prefill step,
// G = 1 / 3 / 4 / 8, head_dim 128 and 64, sliding windows, page sizes 16
// and 24, both 16-bit types; NaN (I8: a NaN row scale) in every slot past a
// sequence's keys.
void one_byte_pages_match_float64(ops::Backend& gpu, F8Pages codes, uint32_t seed) {
  const std::vector<Seq> bounds = {{127, 0}, {128, 0},  {129, 0}, {1, 127},   {1, 128}, {31, 97},
                                   {32, 96}, {33, 224}, {255, 1}, {257, 255}, {2, 0}};
  const std::vector<Seq> mixed = {{700, 0}, {333, 1200}, {1, 900}, {64, 64}, {129, 3}};
  const bool f8 = codes != F8Pages::kI8;
  struct Case {
    Heads h;
    const std::vector<Seq>* seqs;
    int bs;
    bool subnormal = false;  // F8: codes below 2^-6 only
  };
  const std::vector<Seq> long_prompt = {{2048, 0}};
  const std::vector<Case> cases = {
      {{32, 8, 128, 0}, &bounds, 16},
      {{8, 8, 128, 0}, &bounds, 16},
      {{8, 1, 128, 0}, &bounds, 16},
      {{32, 8, 128, 0}, &mixed, 16},
      {{16, 4, 128, 0}, &mixed, 24},
      {{32, 8, 128, 0}, &long_prompt, 16},
      {{32, 8, 128, 0}, &mixed, 16, true},
      {{32, 8, 64, 0}, &bounds, 16},  // head_dim 64
      {{9, 3, 64, 0}, &mixed, 24},
      {{32, 8, 64, 0}, &long_prompt, 16},
      {{32, 8, 64, 0}, &mixed, 16, true},
      {{32, 8, 128, 200}, &mixed, 16},  // sliding windows
      {{9, 3, 64, 77}, &bounds, 24},
  };
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (const auto& c : cases) {
      if (c.subnormal && !f8) continue;
      Problem pb(gpu, c.h, *c.seqs, c.bs, seed += 5, 0.0f, dt, c.subnormal ? F8Pages::kSubnormal : codes);
      pb.poison_past_end();
      const std::string pages = f8 ? " F8 pages" : " I8 pages";
      if (cuda::prefill_wgmma_available()) {
        EXPECT_TRUE(pb.runs(kWgmma - 1) && pb.runs(kWgmma - 2)) << tag(c.h, c.bs, kWgmma - 2) << pages;
        EXPECT_FALSE(pb.runs(kWgmma) || pb.runs(kWgmma - 3)) << "one-byte pages in the variants without a staging area";
      }
      for (int variant = kWgmmaLast; variant <= 0; ++variant) {
        if (variant == -1 || !pb.runs(variant)) continue;
        pb.poison();
        pb.run(gpu, variant);
        pb.check(gpu, 7, tag(c.h, c.bs, variant) + pages);
      }
    }
  }
}

TEST_F(PrefillAttention, F8PagesWgmmaMatchFloat64) { one_byte_pages_match_float64(gpu(), F8Pages::kRandom, 900); }

// I8 rows of magnitudes over three (K) and four (V) orders of ten, all-zero
// rows among them (scale 0).
TEST_F(PrefillAttention, I8PagesWgmmaMatchFloat64) { one_byte_pages_match_float64(gpu(), F8Pages::kI8, 1900); }

// BF16 q beyond F16's range over F8_E4M3 pages: the wgmma kernel computes
// in F16 there and rounds q to F16, saturating at +-65504 (an infinite q
// would give NaN scores). The rows with such a q put (nearly) all their
// weight on their keys of the largest product either way, so every
// variant still matches float64 over the unsaturated q; the other rows
// are untouched.
TEST_F(PrefillAttention, F8PagesBf16QBeyondF16Range) {
  const Heads h{32, 8, 128, 0};
  Problem pb(gpu(), h, {{300, 0}, {129, 200}}, 16, 77, 0.0f, DType::kBF16, F8Pages::kRandom);
  auto at = [&](int token, int head, int d) { return (static_cast<size_t>(token) * h.hq + head) * h.hd + d; };
  pb.set_q(gpu(), at(5, 3, 7), 1.0e6f);
  pb.set_q(gpu(), at(250, 0, 100), -3.0e5f);
  pb.set_q(gpu(), at(320, 31, 0), 7.0e4f);
  pb.set_q(gpu(), at(320, 31, 1), -7.0e4f);
  for (int variant = kWgmmaLast; variant <= 0; ++variant) {
    if (variant == -1 || !pb.runs(variant)) continue;
    pb.poison();
    pb.run(gpu(), variant);
    pb.check(gpu(), 1, tag(h, 16, variant));
  }
}

// The same launch twice gives the same bits (a race would show as a moving
// result), for every block shape.
TEST_F(PrefillAttention, RepeatableBitForBit) {
  for (int pages = 0; pages < 3; ++pages) {  // pages 2: F8_E4M3 pages, BF16 q
    const DType dt = pages == 1 ? DType::kF16 : DType::kBF16;
    Problem pb(gpu(), {32, 8, 128, 0}, {{1000, 0}, {300, 700}}, 16, 5, 0.0f, dt,
               pages == 2 ? F8Pages::kRandom : F8Pages::kNone);
    for (int variant = kWgmmaLast; variant < cuda::kNumPrefillMmaVariants; ++variant) {
      if (variant == -2 || variant == -1 || !pb.runs(variant)) continue;
      pb.run(gpu(), variant);
      const auto first = pb.output(gpu());
      pb.poison();
      pb.run(gpu(), variant);
      EXPECT_EQ(pb.output(gpu()), first) << dtype_name(dt) << " variant " << variant;
    }
  }
}

// The mma kernel folds the scale into its exponent and needs it positive;
// the op sends other scales to the wmma kernel, which must still be right.
TEST_F(PrefillAttention, NonPositiveScaleThroughTheOp) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (float scale : {-0.05f, 0.125f}) {
      Problem pb(gpu(), {8, 2, 128, 0}, {{200, 50}, {17, 0}}, 16, 9, scale, dt);
      pb.poison();
      pb.run(gpu(), -2);
      pb.check(gpu(), 13, "scale " + std::to_string(scale));
    }
  }
}

// Fused QKV norm + RoPE + KV write at prefill sizes, both kernels (full
// rotary takes the vectorised one, partial rotary the general one),
// against the CPU backend.
TEST_F(PrefillAttention, QkvRopeKvWriteBothKernelsMatchCpu) {
  struct Case {
    int hq, hk, hd, rotary;
    bool norm;
    DType act, kv;
  };
  const std::vector<Case> cases = {
      {32, 8, 128, 128, false, DType::kBF16, DType::kBF16},  // Llama-3-8B: vectorised
      {16, 2, 64, 64, true, DType::kBF16, DType::kBF16},     // Qwen3-style q/k norm, hd 64
      {8, 2, 256, 256, true, DType::kF32, DType::kF32},      // hd 256: 16 lanes a head
      {4, 4, 128, 128, false, DType::kF32, DType::kBF16},
      {8, 2, 128, 64, false, DType::kBF16, DType::kBF16},  // partial rotary: general kernel
      {8, 2, 64, 32, true, DType::kF32, DType::kF32},
  };
  for (const auto& c : cases) {
    const int n = 300, bs = 16, blocks = 24, slots_total = bs * blocks;
    const int64_t cols = int64_t{c.hq + 2 * c.hk} * c.hd;
    auto qkv = random_floats(static_cast<size_t>(n * cols), 31, -2, 2);
    if (c.act == DType::kBF16) qkv = round_bf16(qkv);
    std::vector<int32_t> pos(static_cast<size_t>(n)), slots(static_cast<size_t>(n));
    std::vector<int32_t> perm(static_cast<size_t>(slots_total));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(32));
    for (int i = 0; i < n; ++i) {
      pos[static_cast<size_t>(i)] = 5 + 13 * i;                                        // up to ~3900
      slots[static_cast<size_t>(i)] = i % 7 == 3 ? -1 : perm[static_cast<size_t>(i)];  // some skipped
    }
    const auto qn = random_floats(static_cast<size_t>(c.hd), 33, 0.5f, 1.5f);
    const auto kn = random_floats(static_cast<size_t>(c.hd), 34, 0.5f, 1.5f);
    auto inv = ops::make_rope_inv_freq(500000.0f, c.rotary, {});
    ops::RopeTable rt;
    rt.inv_freq = inv.data();
    rt.rotary_dim = c.rotary;
    const size_t cache_elems = static_cast<size_t>(slots_total) * c.hk * c.hd;
    const size_t kv_es = c.kv == DType::kF32 ? 4 : 2;
    // CPU (fp32 on the same values).
    std::vector<uint8_t> ck(cache_elems * kv_es, 0), cv(cache_elems * kv_es, 0);
    std::vector<float> cq(static_cast<size_t>(n) * c.hq * c.hd);
    std::vector<float> qkv_c = qkv, qn_c = qn, kn_c = kn;
    ops::LayerKv ckv{Tensor(ck.data(), c.kv, {blocks, bs, c.hk, c.hd}),
                     Tensor(cv.data(), c.kv, {blocks, bs, c.hk, c.hd})};
    ops::AttentionBatch cb;
    cb.num_tokens = n;
    cb.positions = pos.data();
    cb.slot_mapping = slots.data();
    Tensor cq3(cq.data(), DType::kF32, {n, c.hq, c.hd});
    cpu().qkv_rope_kv_write(Tensor(qkv_c.data(), DType::kF32, {n, cols}),
                            c.norm ? Tensor(qn_c.data(), DType::kF32, {c.hd}) : Tensor(),
                            c.norm ? Tensor(kn_c.data(), DType::kF32, {c.hd}) : Tensor(), 1e-6f, rt, cb, ckv, cq3);
    // GPU.
    auto gqkv = c.act == DType::kF32 ? upload(gpu(), qkv) : upload(gpu(), to_bf16(qkv));
    auto gpos = upload(gpu(), pos), gslots = upload(gpu(), slots), ginv = upload(gpu(), inv);
    auto gqn = upload(gpu(), qn), gkn = upload(gpu(), kn);
    DeviceMem gk(gpu(), cache_elems * kv_es), gv(gpu(), cache_elems * kv_es);
    ASSERT_EQ(cudaMemset(gk.get(), 0, cache_elems * kv_es), cudaSuccess);
    ASSERT_EQ(cudaMemset(gv.get(), 0, cache_elems * kv_es), cudaSuccess);
    const size_t aes = c.act == DType::kF32 ? 4 : 2;
    DeviceMem gq(gpu(), cq.size() * aes);
    ASSERT_EQ(cudaMemset(gq.get(), 0xFF, cq.size() * aes), cudaSuccess);  // NaN: unwritten q fails
    ops::LayerKv gkv{Tensor(gk.get(), c.kv, {blocks, bs, c.hk, c.hd}, Device::kCuda),
                     Tensor(gv.get(), c.kv, {blocks, bs, c.hk, c.hd}, Device::kCuda)};
    ops::AttentionBatch gb = cb;
    gb.positions = gpos.as<int32_t>();
    gb.slot_mapping = gslots.as<int32_t>();
    ops::RopeTable grt = rt;
    grt.inv_freq = ginv.as<float>();
    Tensor gq3(gq.get(), c.act, {n, c.hq, c.hd}, Device::kCuda);
    gpu().qkv_rope_kv_write(Tensor(gqkv.get(), c.act, {n, cols}, Device::kCuda),
                            c.norm ? Tensor(gqn.get(), DType::kF32, {c.hd}, Device::kCuda) : Tensor(),
                            c.norm ? Tensor(gkn.get(), DType::kF32, {c.hd}, Device::kCuda) : Tensor(), 1e-6f, grt, gb,
                            gkv, gq3);
    gpu().synchronize();
    const std::string what = "hq=" + std::to_string(c.hq) + " hk=" + std::to_string(c.hk) +
                             " hd=" + std::to_string(c.hd) + " rotary=" + std::to_string(c.rotary) +
                             (c.norm ? " norm" : "") + " act " + std::string(dtype_name(c.act)) + " kv " +
                             std::string(dtype_name(c.kv));
    const std::vector<float> q_got = c.act == DType::kF32 ? download<float>(gpu(), gq, cq.size())
                                                          : from_bf16(download<uint16_t>(gpu(), gq, cq.size()));
    // fp32: only the norm's summation order differs; bf16: one output rounding.
    const double nmse = c.act == DType::kF32 ? 1e-11 : 1e-4;
    const double rel = c.act == DType::kF32 ? 1e-5 : 2e-2;
    expect_close(q_got, cq, nmse, rel, what + " q");
    auto as_float = [&](const std::vector<uint8_t>& b) {
      std::vector<float> f(cache_elems);
      dequantize_row(c.kv, b.data(), f.data(), static_cast<int64_t>(cache_elems));
      return f;
    };
    const double kv_nmse = nmse + (c.kv == DType::kBF16 ? 1e-4 : 0.0);
    const double kv_rel = rel + (c.kv == DType::kBF16 ? 2e-2 : 0.0);
    expect_close(as_float(download<uint8_t>(gpu(), gk, cache_elems * kv_es)), as_float(ck), kv_nmse, kv_rel,
                 what + " k pages");
    expect_close(as_float(download<uint8_t>(gpu(), gv, cache_elems * kv_es)), as_float(cv), kv_nmse, kv_rel,
                 what + " v pages");
  }
}

// Whether a comma-separated list from the environment (nullptr: unset,
// everything) names `name`: one of its items equal to it, or (prefix) a
// beginning of it.
bool env_list_names(const char* list, const std::string& name, bool prefix) {
  if (list == nullptr) return true;
  const std::string items = std::string(list) + ",";
  for (size_t at = 0, comma; (comma = items.find(',', at)) != std::string::npos; at = comma + 1) {
    const std::string item = items.substr(at, comma - at);
    if (!item.empty() && (prefix ? name.rfind(item, 0) == 0 : name == item)) return true;
  }
  return false;
}

// Not a test: TFLOP/s (causal FLOPs: 4 x hq x hd x visible pairs) of one
// prompt of L tokens (and of four 2048-token prompts), Llama-3-8B heads,
// pages of 16 in shuffled order: BF16 for every block shape (0 = the
// automatic choice) in both block orders ("mmaN" longest-first, "mmaN-ph"
// per KV head) and the wmma kernel; F16 for the automatic choice; F8_E4M3
// ("+f8") and I8 ("+i8", row scales) pages under both. Median of
// 15 event-timed launches after 3 warm-ups. OSPREY_BENCH_HEADS=hq,hk[,hd[,window]]
// (bench_heads.h) picks other heads (e.g. 32,8,64: Llama-3.2-1B; 9,3,64: SmolLM2;
// 32,8,128,4096: Mistral-7B v0.1's sliding window).
TEST_F(PrefillAttention, DISABLED_PrefillAttentionBench) {
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  const auto bh = bench_heads_from_env(/*allow_window=*/true);
  ASSERT_TRUE(bh.has_value());
  const Heads heads{bh->hq, bh->hk, bh->hd, bh->window};
  std::printf("prefill attention bench on %s: causal, hq %d, hk %d, hd %d, window %d, pages of 16\n", prop.name,
              heads.hq, heads.hk, heads.hd, heads.window);
  std::printf("%-10s %-7s %-10s %10s %10s\n", "tokens", "dtype", "kernel", "ms", "TFLOP/s");
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  struct Case {
    std::vector<Seq> seqs;
    std::string name;
  };
  const std::vector<Case> cases = {{{{1024, 0}}, "1024"},
                                   {{{2048, 0}}, "2048"},
                                   {{{4096, 0}}, "4096"},
                                   {{{8192, 0}}, "8192"},
                                   {{{2048, 0}, {2048, 0}, {2048, 0}, {2048, 0}}, "4x2048"},
                                   {{{512, 3584}}, "512@3584"}};
  // OSPREY_BENCH_CASES=name[,name...] (e.g. 4096): only those cases (one
  // launch to profile). OSPREY_BENCH_KERNELS=prefix[,prefix...] (e.g.
  // wgmma3): only the kernels whose names start with one of them (shorter
  // A/B runs).
  const char* only = std::getenv("OSPREY_BENCH_CASES");
  const char* kernels = std::getenv("OSPREY_BENCH_KERNELS");
  auto wanted = [&](const std::string& name) { return env_list_names(only, name, false); };
  auto kernel_wanted = [&](const std::string& name) { return env_list_names(kernels, name, true); };
  for (const auto& c : cases) {
    if (!wanted(c.name)) continue;
    for (int pages = 0; pages < 6; ++pages) {  // 2, 3: F8_E4M3 pages, bf16 / f16 q; 4, 5: I8 pages
      const DType dt = pages % 2 == 1 ? DType::kF16 : DType::kBF16;
      const bool f8 = pages >= 2;  // one-byte pages
      const F8Pages codes = pages >= 4 ? F8Pages::kI8 : f8 ? F8Pages::kRandom : F8Pages::kNone;
      Problem pb(gpu(), heads, c.seqs, 16, 3, 0.0f, dt, codes);
      const auto a = pb.args();
      // k <= -2: wgmma variant -1 - k (sm_90 only); -1: wmma; 2 v + o: mma
      // block shape v in order o.
      const int last = dt == DType::kBF16 && !f8 ? 2 * cuda::kNumPrefillMmaVariants : 2;
      for (int k = -cuda::kNumPrefillWgmmaVariants; k < last; ++k) {
        if ((dt == DType::kF16 || f8) && k == -1) continue;
        if (k <= -2 && !pb.runs(kWgmma + 2 + k)) continue;
        const int variant = k / 2;
        const auto order = k % 2 == 0 ? cuda::PrefillOrder::kLongestFirst : cuda::PrefillOrder::kPerHead;
        std::string name = "mma" + std::to_string(variant) + (order == cuda::PrefillOrder::kPerHead ? "-ph" : "");
        if (k < 0) name = k <= -2 ? "wgmma" + std::to_string(-1 - k) : "wmma";
        if (!kernel_wanted(name)) continue;
        auto launch = [&] {
          if (k <= -2) {
            cuda::launch_prefill_attention_wgmma(a, nullptr, -1 - k);
          } else if (k < 0) {
            cuda::launch_prefill_attention_wmma(a, nullptr);
          } else {
            cuda::launch_prefill_attention_mma(a, nullptr, variant, order);
          }
        };
        for (int i = 0; i < 3; ++i) launch();
        std::vector<float> ms;
        for (int i = 0; i < 15; ++i) {
          ASSERT_EQ(cudaEventRecord(e0, nullptr), cudaSuccess);
          launch();
          ASSERT_EQ(cudaEventRecord(e1, nullptr), cudaSuccess);
          ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
          float t = 0;
          ASSERT_EQ(cudaEventElapsedTime(&t, e0, e1), cudaSuccess);
          ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const float med = ms[ms.size() / 2];
        const std::string dts =
            std::string(dt == DType::kF16 ? "f16" : "bf16") + (pages >= 4 ? "+i8" : f8 ? "+f8" : "");
        std::printf("%-10s %-7s %-10s %10.3f %10.1f\n", c.name.c_str(), dts.c_str(), name.c_str(), med,
                    pb.causal_flops() / (med * 1e-3) / 1e12);
      }
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

// Not a test: the host's time to enqueue one launch of the warp-specialised
// wgmma kernel (variant 3), which with TMA copies includes encoding the
// tensor maps of K, V (and I8's row scales) and q, against the same launch
// with OSPREY_PREFILL_TMA=0 and OSPREY_PREFILL_TMA_Q=0 (no tensor maps):
// median and mean over 400 launches of a 64-token prompt (Llama-3-8B
// heads, pages of 16; the stream drained every 50 launches, outside the
// timing), BF16, F8_E4M3 and I8 pages. A Llama-3-8B prompt step makes 32
// such launches. Run with
//   gpu_tests --gtest_also_run_disabled_tests --gtest_filter='*PrefillLaunchHostCost*'
TEST_F(PrefillAttention, DISABLED_PrefillLaunchHostCost) {
  if (!cuda::prefill_wgmma_available()) GTEST_SKIP() << "needs an sm_90 device and sm_90a code";
  std::printf("%-8s %-18s %10s %10s\n", "pages", "copies", "median us", "mean us");
  for (F8Pages codes : {F8Pages::kNone, F8Pages::kRandom, F8Pages::kI8}) {
    Problem pb(gpu(), Heads{32, 8, 128, 0}, {{64, 0}}, 16, 7, 0.0f, DType::kBF16, codes);
    const auto a = pb.args();
    for (int mode = 0; mode < 3; ++mode) {  // 0: TMA K/V and q; 1: TMA K/V only; 2: no TMA
      ASSERT_EQ(setenv("OSPREY_PREFILL_TMA", mode == 2 ? "0" : "1", 1), 0);
      ASSERT_EQ(setenv("OSPREY_PREFILL_TMA_Q", mode == 0 ? "1" : "0", 1), 0);
      std::vector<double> us;
      for (int i = 0; i < 420; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        cuda::launch_prefill_attention_wgmma(a, nullptr, 3);
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= 20) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());  // 20 warm-ups
        if (i % 50 == 49) {
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        }
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::sort(us.begin(), us.end());
      const double mean = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
      const char* what = mode == 0 ? "tma k/v + tma q" : mode == 1 ? "tma k/v" : "cp.async";
      const char* pages = codes == F8Pages::kNone ? "bf16" : codes == F8Pages::kI8 ? "i8" : "f8";
      std::printf("%-8s %-18s %10.2f %10.2f\n", pages, what, us[us.size() / 2], mean);
    }
  }
  ASSERT_EQ(unsetenv("OSPREY_PREFILL_TMA"), 0);
  ASSERT_EQ(unsetenv("OSPREY_PREFILL_TMA_Q"), 0);
}

}  // namespace
}  // namespace osprey::gpu_test
