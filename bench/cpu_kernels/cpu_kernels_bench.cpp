// Timing binary for the CPU backend's hot kernels on the default model's
// shapes (SmolLM2-135M: hidden 576, ffn 1536, kv 192, vocab 49152).
//
//   cpu_kernels_bench [--threads N] [--isa auto|scalar|avx2] [--reps R]
//                     [--batch N [--q8] [--cold]] [--attention CTX [--batch N] [--kv f32|f16|bf16|all]]
//
// Prints, per (weight dtype, m x k, n): microseconds per call, GFLOP/s and the
// weight bytes streamed per second. "hot" reuses one weight matrix (it sits in
// cache); "cold" cycles through copies totalling more than the L3 so weights
// come from DRAM, as in decode. Also: read bandwidth, pool dispatch latency,
// and a whole-model decode step's matmuls (30 layers + lm_head).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cblas.h>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace {

using osprey::DType;
using osprey::Tensor;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Random packed weights: fill with random bytes, then set block scales to
// sane fp16 values so the arithmetic sees ordinary numbers.
std::vector<uint8_t> random_weights(DType t, int64_t m, int64_t k, uint32_t seed) {
  std::vector<uint8_t> w(static_cast<size_t>(osprey::dtype_row_bytes(t, k) * m));
  std::mt19937 rng(seed);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const uint16_t scale = osprey::f32_to_fp16(0.01f);
  const int64_t nb = m * k / 32;
  if (t == DType::kQ4_1) {
    auto* b = reinterpret_cast<osprey::BlockQ4_1*>(w.data());
    for (int64_t i = 0; i < nb; ++i) b[i].d = b[i].m = scale;
  } else if (t == DType::kQ4_0) {
    auto* b = reinterpret_cast<osprey::BlockQ4_0*>(w.data());
    for (int64_t i = 0; i < nb; ++i) b[i].d = scale;
  } else if (t == DType::kQ8_0) {
    auto* b = reinterpret_cast<osprey::BlockQ8_0*>(w.data());
    for (int64_t i = 0; i < nb; ++i) b[i].d = scale;
  } else if (t == DType::kF16 || t == DType::kBF16) {
    auto* p = reinterpret_cast<uint16_t*>(w.data());
    for (int64_t i = 0; i < m * k; ++i)
      p[i] = t == DType::kF16 ? osprey::f32_to_fp16(0.01f * static_cast<float>(i % 7)) : osprey::f32_to_bf16(0.01f);
  } else if (t == DType::kF32) {
    auto* p = reinterpret_cast<float*>(w.data());
    for (int64_t i = 0; i < m * k; ++i) p[i] = 0.001f * static_cast<float>(i % 13);
  }
  return w;
}

struct Args {
  int threads = 0;
  osprey::cpu::Isa isa = osprey::cpu::Isa::kAuto;
  int reps = 0;  // 0: auto
  int batch = 0;  // > 0: only the batched-decode shapes at n = batch
  bool q8 = false;  // --q8: CpuBackendOptions::quantize_activations
  bool cold = false;  // --cold: --batch shapes cycle through weight copies (from DRAM, as in decode)
  int attention_ctx = 0;  // > 0: time one decode step's paged attention at this context length
  std::string kv = "all";  // --kv f32|f16|bf16|all: KV page dtypes for --attention
};

void bench_matmul(osprey::cpu::CpuBackend& be, DType t, int64_t m, int64_t k, int64_t n, bool cold, int reps) {
  const int64_t bytes = osprey::dtype_row_bytes(t, k) * m;
  const int copies = cold ? static_cast<int>(std::max<int64_t>(1, (256ll << 20) / bytes)) : 1;
  std::vector<std::vector<uint8_t>> ws;
  for (int c = 0; c < copies; ++c) ws.push_back(random_weights(t, m, k, 1234u + static_cast<uint32_t>(c)));
  std::vector<float> x(static_cast<size_t>(n * k), 0.5f), out(static_cast<size_t>(n * m));
  Tensor xt(x.data(), DType::kF32, {n, k});
  Tensor ot(out.data(), DType::kF32, {n, m});
  const double flops = 2.0 * static_cast<double>(n * m * k);
  if (reps <= 0) reps = static_cast<int>(std::clamp(2e9 / std::max(flops, 1e6), 3.0, 2000.0));
  reps = std::max(reps, copies);
  for (int r = 0; r < std::min(reps, 3); ++r) {  // warm-up
    Tensor wt(ws[static_cast<size_t>(r % copies)].data(), t, {m, k});
    be.matmul(xt, wt, Tensor(), ot);
  }
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    Tensor wt(ws[static_cast<size_t>(r % copies)].data(), t, {m, k});
    const auto t0 = Clock::now();
    be.matmul(xt, wt, Tensor(), ot);
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  // Best-of is the figure least disturbed by other processes; median shown too.
  const double best = times[0];
  const double med = times[times.size() / 2];
  std::printf("%-5s %6lld x %-5lld n=%-4lld %-4s best %9.1f us %8.2f GFLOP/s %7.2f GB/s | median %9.1f us\n",
              std::string(osprey::dtype_name(t)).c_str(), static_cast<long long>(m), static_cast<long long>(k),
              static_cast<long long>(n), cold ? "cold" : "hot", best * 1e6, flops / best * 1e-9,
              static_cast<double>(bytes) / best * 1e-9, med * 1e6);
}

// One decode step's matmuls of SmolLM2-135M (Q4_1 layers, Q8_0 tied lm_head),
// each layer with its own weights (~96 MB in all, more than the L3).
void bench_decode_step(osprey::cpu::CpuBackend& be, int reps) {
  const int64_t h = 576, kv = 192, f = 1536, vocab = 49152;
  struct W {
    std::vector<uint8_t> q, k, v, o, gate, up, down;
  };
  std::vector<W> layers(30);
  uint32_t seed = 1;
  double bytes = 0;
  for (auto& l : layers) {
    l.q = random_weights(DType::kQ4_1, h, h, seed++);
    l.k = random_weights(DType::kQ4_1, kv, h, seed++);
    l.v = random_weights(DType::kQ4_1, kv, h, seed++);
    l.o = random_weights(DType::kQ4_1, h, h, seed++);
    l.gate = random_weights(DType::kQ4_1, f, h, seed++);
    l.up = random_weights(DType::kQ4_1, f, h, seed++);
    l.down = random_weights(DType::kQ4_1, h, f, seed++);
    bytes += static_cast<double>(l.q.size() + l.k.size() + l.v.size() + l.o.size() + l.gate.size() + l.up.size() +
                                 l.down.size());
  }
  auto lm = random_weights(DType::kQ8_0, vocab, h, 99);
  bytes += static_cast<double>(lm.size());
  std::vector<float> xh(h, 0.1f), xf(f, 0.1f), out(static_cast<size_t>(vocab));
  auto mm = [&](std::vector<uint8_t>& w, DType t, int64_t m, int64_t k) {
    Tensor xt(k == h ? xh.data() : xf.data(), DType::kF32, {1, k});
    Tensor wt(w.data(), t, {m, k});
    Tensor ot(out.data(), DType::kF32, {1, m});
    be.matmul(xt, wt, Tensor(), ot);
  };
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    const auto t0 = Clock::now();
    for (auto& l : layers) {
      mm(l.q, DType::kQ4_1, h, h);
      mm(l.k, DType::kQ4_1, kv, h);
      mm(l.v, DType::kQ4_1, kv, h);
      mm(l.o, DType::kQ4_1, h, h);
      mm(l.gate, DType::kQ4_1, f, h);
      mm(l.up, DType::kQ4_1, f, h);
      mm(l.down, DType::kQ4_1, h, f);
    }
    mm(lm, DType::kQ8_0, vocab, h);
    if (r >= 2) times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  std::printf(
      "decode step matmuls (30 layers Q4_1 + lm_head Q8_0, %.1f MB): %.2f ms median, %.2f ms best, "
      "%.2f GB/s, %.1f tok/s bound\n",
      bytes / 1e6, med * 1e3, times[0] * 1e3, bytes / med * 1e-9, 1.0 / med);
}

void bench_read_bandwidth(osprey::ThreadPool& pool) {
  const size_t n = (512u << 20) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  double best = 1e30;
  float sink = 0;
  for (int r = 0; r < 5; ++r) {
    std::vector<float> partial(64, 0.0f);
    const auto t0 = Clock::now();
    pool.parallel_for(static_cast<int64_t>(n / 4096), [&](int64_t b, int64_t e) {
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
      for (size_t i = static_cast<size_t>(b) * 4096; i < static_cast<size_t>(e) * 4096; i += 8) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
        s4 += buf[i + 4];
        s5 += buf[i + 5];
        s6 += buf[i + 6];
        s7 += buf[i + 7];
      }
      partial[static_cast<size_t>(osprey::ThreadPool::thread_index())] += s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    });
    best = std::min(best, seconds_since(t0));
    for (float p : partial) sink += p;
  }
  std::printf("read bandwidth (512 MB, %d threads): %.2f GB/s (sink %g)\n", pool.num_threads(),
              static_cast<double>(n * sizeof(float)) / best * 1e-9, static_cast<double>(sink));
}

void bench_dispatch(osprey::ThreadPool& pool) {
  const int reps = 100000;
  std::vector<int64_t> sink(64, 0);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    pool.parallel_for(static_cast<int64_t>(pool.num_threads()), [&](int64_t b, int64_t e) {
      sink[static_cast<size_t>(osprey::ThreadPool::thread_index())] += e - b;
    });
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  std::printf("thread pool dispatch (%d threads): median %.2f us, p10 %.2f us, p90 %.2f us per parallel_for\n",
              pool.num_threads(), times[reps / 2] * 1e6, times[reps / 10] * 1e6, times[reps * 9 / 10] * 1e6);
}

// OpenBLAS sgemm (one thread) on fp32 weights, for comparison with the
// panel kernels' F32 figure at the same shape.
void bench_openblas(int reps) {
  openblas_set_num_threads(1);
  for (auto [m, k] : {std::pair<int64_t, int64_t>{1536, 576}, {576, 1536}}) {
    const int64_t n = 128;
    std::vector<float> x(static_cast<size_t>(n * k), 0.5f), w(static_cast<size_t>(m * k), 0.25f),
        out(static_cast<size_t>(n * m));
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(m),
                  static_cast<int>(k), 1.0f, x.data(), static_cast<int>(k), w.data(), static_cast<int>(k), 0.0f,
                  out.data(), static_cast<int>(m));
      best = std::min(best, seconds_since(t0));
    }
    std::printf("OpenBLAS sgemm 1 thread F32 %lld x %lld n=%lld: best %.1f us, %.2f GFLOP/s\n",
                static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n), best * 1e6,
                2.0 * n * m * k / best * 1e-9);
  }
}

// GEMV kernels vs dequantised panels for small n: where to switch.
void bench_crossover(osprey::cpu::CpuBackend& be, int reps) {
  const int64_t m = 1536, k = 576;
  auto w = random_weights(DType::kQ4_1, m, k, 5);
  Tensor wt(w.data(), DType::kQ4_1, {m, k});
  for (int64_t n : {1, 2, 3, 4, 6, 8, 12, 16, 32}) {
    std::vector<float> x(static_cast<size_t>(n * k), 0.5f), out(static_cast<size_t>(n * m));
    Tensor xt(x.data(), DType::kF32, {n, k});
    Tensor ot(out.data(), DType::kF32, {n, m});
    double best[2] = {1e30, 1e30};
    for (int path = 0; path < 2; ++path) {
      be.set_gemv_max_rows(path == 0 ? 1 << 20 : 0);
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        be.matmul(xt, wt, Tensor(), ot);
        best[path] = std::min(best[path], seconds_since(t0));
      }
    }
    std::printf("Q4_1 1536x576 n=%-3lld gemv %8.1f us  panels %8.1f us\n", static_cast<long long>(n), best[0] * 1e6,
                best[1] * 1e6);
  }
  be.set_gemv_max_rows(3);
}

// One decode step's paged attention of SmolLM2-135M (30 layers, 9 query
// heads over 3 KV heads of 64, pages of 16 tokens): `batch` sequences of
// `ctx` tokens each, every layer with its own KV pool from the backend's
// allocator, so that the K/V rows come from DRAM as in the engine (ctx * 46 KB
// per sequence and step in F32).
void bench_attention(osprey::cpu::CpuBackend& be, int batch, int ctx, DType page_dtype, int reps) {
  const int64_t layers = 30, hq = 9, hk = 3, hd = 64, bs = 16;
  const int64_t pages_per_seq = (ctx + bs - 1) / bs;
  const int64_t num_blocks = pages_per_seq * batch;
  const int64_t es = page_dtype == DType::kF32 ? 4 : 2;
  const size_t page_bytes = static_cast<size_t>(num_blocks * bs * hk * hd * es);
  // Pages from the backend's allocator, as the engine's KV pool.
  std::vector<uint8_t*> kp(static_cast<size_t>(layers)), vp(static_cast<size_t>(layers));
  std::mt19937 rng(7);
  for (int64_t l = 0; l < layers; ++l) {
    kp[static_cast<size_t>(l)] = static_cast<uint8_t*>(be.alloc(page_bytes));
    vp[static_cast<size_t>(l)] = static_cast<uint8_t*>(be.alloc(page_bytes));
    for (uint8_t* buf : {kp[static_cast<size_t>(l)], vp[static_cast<size_t>(l)]}) {
      for (size_t i = 0; i < page_bytes / static_cast<size_t>(es); ++i) {
        const float v = 0.01f * static_cast<float>(static_cast<int>(rng() % 200) - 100);
        if (page_dtype == DType::kF32) {
          std::memcpy(buf + i * 4, &v, 4);
        } else {
          const uint16_t h = page_dtype == DType::kF16 ? osprey::f32_to_fp16(v) : osprey::f32_to_bf16(v);
          std::memcpy(buf + i * 2, &h, 2);
        }
      }
    }
  }
  // Page p of sequence s: by default p * batch + s, the order in which a
  // fresh pool hands pages to sequences that grow in lockstep; with
  // OSP_BENCH_SHUFFLE_PAGES set, a random permutation (a pool after churn).
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t p = 0; p < pages_per_seq; ++p)
      perm[static_cast<size_t>(s * pages_per_seq + p)] = static_cast<int32_t>(p * batch + s);
  if (std::getenv("OSP_BENCH_SHUFFLE_PAGES") != nullptr) std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> q_indptr, kv_lens, block_indptr{0}, positions, slots(static_cast<size_t>(batch), -1);
  for (int s = 0; s <= batch; ++s) q_indptr.push_back(s);
  for (int s = 0; s < batch; ++s) {
    kv_lens.push_back(ctx);
    positions.push_back(ctx - 1);
    block_indptr.push_back(static_cast<int32_t>((s + 1) * pages_per_seq));
  }
  osprey::ops::AttentionBatch ab;
  ab.num_seqs = batch;
  ab.num_tokens = batch;
  ab.max_kv_len = ctx;
  ab.max_q_len = 1;
  ab.q_indptr = q_indptr.data();
  ab.kv_lens = kv_lens.data();
  ab.block_indptr = block_indptr.data();
  ab.block_indices = perm.data();
  ab.positions = positions.data();
  ab.slot_mapping = slots.data();
  std::vector<float> q(static_cast<size_t>(batch * hq * hd), 0.05f), o(q.size());
  Tensor qt(q.data(), DType::kF32, {batch, hq, hd});
  Tensor ot(o.data(), DType::kF32, {batch, hq, hd});
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    const auto t0 = Clock::now();
    for (int64_t l = 0; l < layers; ++l) {
      osprey::ops::LayerKv kv;
      kv.k = Tensor(kp[static_cast<size_t>(l)], page_dtype, {num_blocks, bs, hk, hd});
      kv.v = Tensor(vp[static_cast<size_t>(l)], page_dtype, {num_blocks, bs, hk, hd});
      be.paged_attention(qt, kv, ab, 0.125f, 0, ot);
    }
    if (r >= 2) times.push_back(seconds_since(t0));
  }
  for (int64_t l = 0; l < layers; ++l) {
    be.free(kp[static_cast<size_t>(l)]);
    be.free(vp[static_cast<size_t>(l)]);
  }
  std::sort(times.begin(), times.end());
  const double kv_bytes = static_cast<double>(layers * batch) * ctx * hk * hd * es * 2;
  std::printf("attention %s, %d seqs x %d ctx, 30 layers (%.1f MB of K/V): best %.2f ms, median %.2f ms, %.1f GB/s\n",
              std::string(osprey::dtype_name(page_dtype)).c_str(), batch, ctx, kv_bytes / 1e6, times[0] * 1e3,
              times[times.size() / 2] * 1e3, kv_bytes / times[0] * 1e-9);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--threads" && i + 1 < argc) {
      a.threads = std::atoi(argv[++i]);
    } else if (s == "--reps" && i + 1 < argc) {
      a.reps = std::atoi(argv[++i]);
    } else if (s == "--batch" && i + 1 < argc) {
      a.batch = std::atoi(argv[++i]);
    } else if (s == "--attention" && i + 1 < argc) {
      a.attention_ctx = std::atoi(argv[++i]);
    } else if (s == "--kv" && i + 1 < argc) {
      a.kv = argv[++i];
    } else if (s == "--cold") {
      a.cold = true;
    } else if (s == "--q8") {
      a.q8 = true;
    } else if (s == "--isa" && i + 1 < argc) {
      const std::string v = argv[++i];
      a.isa = v == "scalar" ? osprey::cpu::Isa::kScalar
              : v == "avx2" ? osprey::cpu::Isa::kAvx2
                            : osprey::cpu::Isa::kAuto;
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--isa auto|scalar|avx2] [--reps R] [--batch N] [--q8] [--cold] [--attention CTX [--kv f32|f16|bf16|all]]\n",
                   argv[0]);
      return 2;
    }
  }
  osprey::cpu::CpuBackendOptions o;
  o.num_threads = a.threads;
  o.isa = a.isa;
  o.quantize_activations = a.q8;
  auto be = osprey::cpu::make_cpu_backend(o);
  std::printf("backend %s, %d threads, 8-bit activations: %s\n", be->name(), be->num_threads(),
              be->q8_isa_name() ? be->q8_isa_name() : "off");
  if (a.attention_ctx > 0) {  // one decode step's attention, --batch sequences (default 32)
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      const std::string name = t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : "bf16";
      if (a.kv != "all" && a.kv != name) continue;
      bench_attention(*be, a.batch > 0 ? a.batch : 32, a.attention_ctx, t, a.reps > 0 ? a.reps : 20);
    }
    return 0;
  }
  if (a.batch > 0) {  // batched decode: every layer shape and the lm_head at n = batch
    const std::pair<int64_t, int64_t> mk[] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}};
    for (auto [m, k] : mk) bench_matmul(*be, DType::kQ4_1, m, k, a.batch, a.cold, a.reps);
    bench_matmul(*be, DType::kQ8_0, 49152, 576, a.batch, a.cold, a.reps);
    bench_matmul(*be, DType::kQ8_0, 1536, 576, a.batch, /*cold=*/false, a.reps);
    bench_matmul(*be, DType::kQ4_1, 49152, 576, a.batch, /*cold=*/false, a.reps);
    bench_matmul(*be, DType::kQ8_0, 6144, 576, a.batch, /*cold=*/false, a.reps);
    bench_crossover(*be, a.reps > 0 ? a.reps : 20);
    return 0;
  }
  {
    osprey::ThreadPool pool(be->num_threads());
    bench_dispatch(pool);
    bench_read_bandwidth(pool);
  }
  struct Shape {
    DType t;
    int64_t m, k;
  };
  const Shape shapes[] = {{DType::kQ4_1, 576, 576},  {DType::kQ4_1, 192, 576},   {DType::kQ4_1, 1536, 576},
                          {DType::kQ4_1, 576, 1536}, {DType::kQ8_0, 49152, 576}, {DType::kQ4_0, 1536, 576},
                          {DType::kF16, 1536, 576},  {DType::kBF16, 1536, 576},  {DType::kF32, 1536, 576}};
  for (int64_t n : {1, 128}) {
    for (const auto& s : shapes) {
      bench_matmul(*be, s.t, s.m, s.k, n, /*cold=*/false, a.reps);
      if (n == 1) bench_matmul(*be, s.t, s.m, s.k, n, /*cold=*/true, a.reps);
    }
  }
  bench_openblas(a.reps > 0 ? a.reps : 20);
  bench_crossover(*be, a.reps > 0 ? a.reps : 20);
  bench_decode_step(*be, a.reps > 0 ? a.reps : 20);
  return 0;
}
