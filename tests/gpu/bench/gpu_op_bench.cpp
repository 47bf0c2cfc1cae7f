// Timings of the CUDA backend's main op paths at Llama-3-8B shapes, against
// the card's measured copy bandwidth. A benchmark, not a test: it prints
// figures and asserts nothing. Built as gpu_op_bench next to gpu_tests.
//
// Columns: op, shape, microseconds per call (median of reps after warm-up),
// and the achieved rate (GB/s of bytes that must move, or TFLOP/s).
//
// `gpu_op_bench decode-attention` runs only the copy ceiling and the decode
// attention sweep (BF16 q and pages, Llama-3-8B heads, batch x context; the
// kernel is the one CudaBackend picks, OSPREY_DECODE_ATTENTION=simt forces
// the SIMT one for an A/B, or the generic one where G is not 1, 2, 4 or 8).
// OSPREY_BENCH_KV picks the page dtype, OSPREY_BENCH_HEADS the head shape,
// OSPREY_BENCH_PLAN_ONLY=1 skips the forced split counts,
// OSPREY_BENCH_SHAPE=BxC runs that one batch x context only.
//
// `gpu_op_bench gemm-small-quant` runs the same sweep on Q8_0 / Q4_0 / Q4_1
// weights (values arbitrary: the blocks' bytes filled as F16 numbers) for n
// = 1..64, through the backend's path (the quantised GEMV up to
// OSPREY_QGEMV_MAX_ROWS, 4 by default; dequantised panels + cuBLASLt
// above); GB/s counts the packed weight bytes.
//
// `gpu_op_bench gemm-mid` runs the BF16 sweep at the row counts of mixed
// steps (n = 96..612: ~100 decodes plus a prompt chunk) for qkv, o, gate_up
// and down.
//
// `gpu_op_bench gemm-fp8` times E4M3 GEMMs through cuBLASLt (fp8_gemm.cu;
// the backend has no FP8 path) at the four layer shapes for n = 1..8192
// against the backend's BF16 path in the same run: one scalar scale per
// matrix, per-row weight and per-token activation scales (OUTER_VEC_32F),
// and the latter with fast accumulation; plus the per-token quantisation
// of the BF16 activation that an FP8 GEMM needs first. It first checks that
// cuBLASLt applies both kinds of scale as documented.
//
// `gpu_op_bench gemm-small-add` times the o and down shapes at n = 56..256
// twice: as matmul (beta 0) and as matmul_add (the residual in place, beta
// 1, as the engine runs them), to see what the residual add costs.
//
// `gpu_op_bench sampler` times the device sampler (Backend::sample) on
// Llama-3's vocabulary (128,256) for 1 / 32 / 100 / 256 rows: greedy,
// temperature only, top-p, top-k, top-k + top-p and min-p, over two kinds of
// logits: "flat" (uniform in [-4, 4], as a dummy-weight model gives) and
// "peaked" (normal, sd 2.5, with 20 tokens 6-12 higher) and "sharp" (normal,
// sd 1.5, with 20 tokens 10-16 higher: a few tokens hold most of the mass,
// as a trained model's rows mostly do); also greedy with 5 and 20 top
// logprobs. Microseconds per call (10 calls back to back, median of 5).
//
// `gpu_op_bench gemm-small` runs the copy ceiling and the 16-bit GEMM sweep
// at decode batch sizes: BF16 x [n, k] @ w [m, k]^T at Llama-3-8B's weight
// shapes for n = 1..256 (the backend's path: the own GEMV up to its row
// limit, OSPREY_GEMV_MAX_ROWS; cuBLASLt above, autotuned as
// OSPREY_LT_AUTOTUNE says; `=pow2` for the earlier power-of-two buckets),
// then a few F16 points.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <functional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../attention_batch.h"
#include "../bench_heads.h"
#include "fp8_gemm.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/backend.h"
#include "sampling/device_sampling.h"

namespace {

using namespace osprey;

double median_us(ops::Backend& be, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  be.synchronize();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    be.synchronize();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void row(const std::string& op, const std::string& shape, double us, double rate, const char* unit) {
  std::printf("%-34s %-30s %10.1f %9.1f %s\n", op.c_str(), shape.c_str(), us, rate, unit);
}

struct Buf {
  ops::Backend& be;
  void* p;
  Buf(ops::Backend& b, size_t bytes) : be(b), p(b.alloc(bytes)) {}
  ~Buf() { be.free(p); }
};

int32_t* upload_ints(ops::Backend& be, const std::vector<int32_t>& v) {
  void* p = be.alloc(std::max<size_t>(1, v.size()) * 4);
  be.copy_to_device(p, v.data(), v.size() * 4);
  return static_cast<int32_t*>(p);
}

// Decode attention, BF16 q / out / pages, hq 32, hk 8, hd 128 (or
// OSPREY_BENCH_HEADS, below), pages of 16:
// `sets` page tables over disjoint pages of one pool (pages shuffled, as in
// a pool that has served many requests; the pool spans >= 1 GiB so that
// repeated calls read device memory, not L2). Timed as graph replays of
// back-to-back calls cycling over the sets (the engine replays decode steps
// as graphs), so launch gaps are not counted; the time includes the split
// merge kernel when the plan splits. Returns microseconds per call and sets
// kv_bytes (K + V bytes one call must read).
// OSPREY_BENCH_KV=fp8: F8_E4M3 pages, =int8: I8 pages (else BF16; the
// table's header names the dtype).
bool bench_kv_is(const char* what) {
  const char* v = std::getenv("OSPREY_BENCH_KV");
  return v != nullptr && std::strcmp(v, what) == 0;
}
bool bench_kv_fp8() { return bench_kv_is("fp8"); }

// OSPREY_BENCH_HEADS=hq,hk[,hd]: the decode attention's head shape (default
// 32,8,128: Llama-3-8B; e.g. 28,4 for Qwen2.5-7B, 9,3,64 for SmolLM2).
gpu_test::BenchHeads bench_heads() {
  static const gpu_test::BenchHeads shape = [] {
    const auto h = gpu_test::bench_heads_from_env(/*allow_window=*/false);
    if (!h) std::exit(2);
    return *h;
  }();
  return shape;
}

double time_decode_attention(ops::Backend& be, int batch, int ctx, size_t& kv_bytes, int& sets) {
  const int hq = bench_heads().hq, hk = bench_heads().hk, hd = bench_heads().hd, bs = 16;
  const int pages_per_seq = (ctx + bs - 1) / bs;
  const bool f8 = bench_kv_fp8(), i8 = bench_kv_is("int8");
  const DType kv_dtype = f8 ? DType::kF8E4M3 : i8 ? DType::kI8 : DType::kBF16;
  const size_t page_bytes = size_t{bs} * hk * hd * (f8 || i8 ? 1 : 2);  // one page of K (or V)
  const size_t scale_bytes = i8 ? size_t{bs} * hk * sizeof(float) : 0;  // I8: a page's row scales
  kv_bytes = 2 * (page_bytes + scale_bytes) * static_cast<size_t>(pages_per_seq) * static_cast<size_t>(batch);
  sets = static_cast<int>(std::clamp<size_t>(((size_t{1} << 30) + kv_bytes - 1) / kv_bytes, 1, 64));
  const int64_t num_blocks = int64_t{sets} * batch * pages_per_seq;
  Buf kc(be, static_cast<size_t>(num_blocks) * page_bytes), vc(be, static_cast<size_t>(num_blocks) * page_bytes);
  Buf q(be, size_t{2} * batch * hq * hd), out(be, size_t{2} * batch * hq * hd);
  ops::LayerKv kv;
  kv.k = Tensor(kc.p, kv_dtype, {num_blocks, bs, hk, hd}, Device::kCuda);
  kv.v = Tensor(vc.p, kv_dtype, {num_blocks, bs, hk, hd}, Device::kCuda);
  Buf ks(be, std::max<size_t>(1, static_cast<size_t>(num_blocks) * scale_bytes)),
      vs(be, std::max<size_t>(1, static_cast<size_t>(num_blocks) * scale_bytes));
  if (i8) {
    kv.k_row_scales = Tensor(ks.p, DType::kF32, {num_blocks, hk, bs}, Device::kCuda);
    kv.v_row_scales = Tensor(vs.p, DType::kF32, {num_blocks, hk, bs}, Device::kCuda);
  }
  Tensor qt(q.p, DType::kBF16, {batch, hq, hd}, Device::kCuda);
  Tensor ot(out.p, DType::kBF16, {batch, hq, hd}, Device::kCuda);
  if (f8) {  // codes 0x3a / 0xb5 (1.25, -0.8125) under scales 0.5, 2
    cudaMemset(kc.p, 0x3a, static_cast<size_t>(num_blocks) * page_bytes);
    cudaMemset(vc.p, 0xb5, static_cast<size_t>(num_blocks) * page_bytes);
    kv.k_scale = 0.5f;
    kv.v_scale = 2.0f;
  } else if (i8) {  // codes 0x3a / 0xb5 (58, -75) under row scales in [0.01, 0.02]
    cudaMemset(kc.p, 0x3a, static_cast<size_t>(num_blocks) * page_bytes);
    cudaMemset(vc.p, 0xb5, static_cast<size_t>(num_blocks) * page_bytes);
    be.fill_uniform(kv.k_row_scales, 4, 0.01f, 0.02f);
    be.fill_uniform(kv.v_row_scales, 5, 0.01f, 0.02f);
  } else {
    be.fill_uniform(kv.k, 1, -2.0f, 2.0f);
    be.fill_uniform(kv.v, 2, -2.0f, 2.0f);
  }
  be.fill_uniform(qt, 3, -2.0f, 2.0f);

  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  // Set i, sequence s: the pages_per_seq entries of perm from index
  // (i * batch + s) * pages_per_seq. Every set's arrays but block_indices are
  // equal, so the sets share one device copy of those (no slot mapping: the
  // op writes no KV).
  int32_t *d_qptr = nullptr, *d_kvl = nullptr, *d_bptr = nullptr, *d_pos = nullptr;
  std::vector<int32_t*> d_bidx;
  std::vector<ops::AttentionBatch> batches;
  const size_t per_seq = static_cast<size_t>(pages_per_seq);
  for (size_t set = 0; set < static_cast<size_t>(sets); ++set) {
    gpu_test::HostAttentionBatch h;
    for (size_t s = 0; s < static_cast<size_t>(batch); ++s) {
      const size_t first = (set * static_cast<size_t>(batch) + s) * per_seq;
      h.add_seq(1, ctx, std::span<const int32_t>(perm).subspan(first, per_seq), bs, false);
    }
    if (set == 0) {
      d_qptr = upload_ints(be, h.q_indptr);
      d_kvl = upload_ints(be, h.kv_lens);
      d_bptr = upload_ints(be, h.block_indptr);
      d_pos = upload_ints(be, h.positions);
    }
    d_bidx.push_back(upload_ints(be, h.block_indices));
    ops::AttentionBatch b = h.sizes();
    b.q_indptr = d_qptr;
    b.kv_lens = d_kvl;
    b.block_indptr = d_bptr;
    b.block_indices = d_bidx.back();
    b.positions = d_pos;
    batches.push_back(b);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const auto& b : batches) be.paged_attention(qt, kv, b, scale, 0, ot);  // eager: reserves buffers
  be.synchronize();
  const int per_graph = sets * std::max(1, (16 + sets - 1) / sets);
  double us = 0;
  std::unique_ptr<ops::Backend::Graph> graph;
  if (be.supports_graphs()) {
    be.begin_capture();
    for (int i = 0; i < per_graph; ++i) be.paged_attention(qt, kv, batches[static_cast<size_t>(i % sets)], scale, 0, ot);
    graph = be.end_capture();
  }
  if (graph) {
    graph->launch();
    be.synchronize();
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) {
      const uint64_t a = be.timer_mark();
      graph->launch();
      const uint64_t b = be.timer_mark();
      t.push_back(be.timer_elapsed_ms(a, b) * 1e3 / per_graph);
    }
    std::sort(t.begin(), t.end());
    us = t[t.size() / 2];
  } else {
    size_t i = 0;
    us = median_us(be, 20, [&] { be.paged_attention(qt, kv, batches[i++ % batches.size()], scale, 0, ot); });
  }
  graph.reset();
  for (int32_t* p : d_bidx) be.free(p);
  for (int32_t* p : {d_qptr, d_kvl, d_bptr, d_pos}) be.free(p);
  return us;
}

// The sweep of the issue (batch x context), then forced split counts at a
// few shapes (the evidence for the split plan). Rate: K + V bytes read per
// call / time, and its share of the copy ceiling (read + write bytes / time
// of a device copy: docs/PERF.md's convention).
void decode_attention_sweep(ops::Backend& be, double copy_gbs) {
  const char* env = std::getenv("OSPREY_DECODE_ATTENTION");
  const int group = bench_heads().hq / bench_heads().hk;
  const bool simt_built = group == 1 || group == 2 || group == 4 || group == 8;
  const std::string kernel =
      env != nullptr && std::strcmp(env, "simt") == 0 ? (simt_built ? "simt" : "generic") : "default";
  const char* min_keys = std::getenv("OSPREY_DECODE_MIN_KEYS");
  std::printf(
      "decode attention, BF16 q, %s pages, hq %d hk %d hd %d, block_size 16, kernel %s, "
      "OSPREY_DECODE_MIN_KEYS=%s\n",
      bench_kv_fp8() ? "F8_E4M3" : bench_kv_is("int8") ? "I8" : "BF16", bench_heads().hq, bench_heads().hk,
      bench_heads().hd, kernel.c_str(), min_keys != nullptr ? min_keys : "(unset)");
  std::printf("%-8s %-6s %6s %6s %10s %10s %8s\n", "batch", "ctx", "splits", "sets", "us", "GB/s KV", "% copy");
  std::vector<std::pair<int, int>> shapes;
  for (int batch : {1, 8, 32, 64, 128})
    for (int ctx : {512, 1024, 4096, 16384}) shapes.emplace_back(batch, ctx);
  shapes.emplace_back(56, 544);  // the offline-bench profile point (docs/PERF.md)
  for (int batch : {68, 91, 96, 120, 200}) shapes.emplace_back(batch, 320);  // serving's decode steps
  shapes.emplace_back(120, 2112);  // offline 2048/128's decode steps
  shapes.emplace_back(200, 1500);  // offline 1000/1000's, mid-run
  auto report = [&](ops::Backend& b, int batch, int ctx, const char* splits) {
    size_t kv_bytes = 0;
    int sets = 0;
    const double us = time_decode_attention(b, batch, ctx, kv_bytes, sets);
    const double gbs = static_cast<double>(kv_bytes) / us / 1e3;
    std::printf("%-8d %-6d %6s %6d %10.1f %10.1f %7.1f%%\n", batch, ctx, splits, sets, us, gbs, 100.0 * gbs / copy_gbs);
  };
  // OSPREY_BENCH_SHAPE=BxC: that one shape, with the plan's splits only
  // (e.g. one kernel launch to profile under ncu).
  if (const char* one = std::getenv("OSPREY_BENCH_SHAPE")) {
    int batch = 0, ctx = 0;
    if (std::sscanf(one, "%dx%d", &batch, &ctx) != 2 || batch < 1 || ctx < 1) {
      std::fprintf(stderr, "OSPREY_BENCH_SHAPE=%s: want BATCHxCONTEXT\n", one);
      std::exit(2);
    }
    report(be, batch, ctx, "plan");
    return;
  }
  for (auto [batch, ctx] : shapes) report(be, batch, ctx, "plan");
  if (kernel != "default" || std::getenv("OSPREY_BENCH_PLAN_ONLY") != nullptr) return;
  for (int splits : {1, 2, 3, 4, 8, 16, 32, 64}) {
    cuda::CudaBackendOptions o;
    o.attention_splits = splits;
    auto forced = cuda::make_cuda_backend(o);
    if (!forced) return;
    const std::string label = std::to_string(splits);
    for (auto [batch, ctx] : {std::pair{1, 16384}, std::pair{8, 4096}, std::pair{32, 512}, std::pair{56, 544},
                              std::pair{64, 1024}, std::pair{96, 320}, std::pair{200, 320}}) {
      report(*forced, batch, ctx, label.c_str());
    }
  }
}

double copy_ceiling(ops::Backend& be) {
  // Copy bandwidth: device-to-device, 1 GiB (read + write counted).
  const size_t bytes = size_t{1} << 30;
  Buf a(be, bytes), b(be, bytes);
  const double us = median_us(be, 10, [&] {
    cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, nullptr);
    cudaDeviceSynchronize();
  });
  const double gbs = 2.0 * bytes / us / 1e3;
  row("copy d2d", "1 GiB", us, gbs, "GB/s (ceiling)");
  return gbs;
}

// Microseconds per call of `enqueue(i)` for i < calls, captured as one CUDA
// graph through the backend and replayed (median of 7 replays after one
// eager call and one warm-up replay).
double backend_graph_us(ops::Backend& be, int calls, const std::function<void(int)>& enqueue) {
  enqueue(0);  // eager first: plans, autotuning and workspaces settle outside capture
  be.synchronize();
  be.begin_capture();
  for (int i = 0; i < calls; ++i) enqueue(i);
  auto graph = be.end_capture();
  if (!graph) return -1;
  graph->launch();
  be.synchronize();
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    const uint64_t a = be.timer_mark();
    graph->launch();
    const uint64_t b = be.timer_mark();
    t.push_back(be.timer_elapsed_ms(a, b) * 1e3 / calls);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Enough copies of a [m, k] weight of dtype t (>= 256 MiB together, at most
// 16) that back-to-back calls read device memory, not L2. Random values
// (zeros run faster than real data): float weights uniform in +-0.05 from
// seed + copy; quantised ones get their packed bytes filled as F16 numbers
// (finite scales, arbitrary quants).
struct WeightCopies {
  size_t bytes = 0;  // of one copy
  std::vector<std::unique_ptr<Buf>> bufs;
  std::vector<Tensor> w;
};
WeightCopies weight_copies(ops::Backend& be, DType t, int64_t m, int64_t k, uint64_t seed) {
  WeightCopies wc;
  wc.bytes = static_cast<size_t>(dtype_row_bytes(t, k) * m);
  const int copies = static_cast<int>(std::clamp<size_t>(((size_t{256} << 20) + wc.bytes - 1) / wc.bytes, 1, 16));
  for (int c = 0; c < copies; ++c) {
    wc.bufs.push_back(std::make_unique<Buf>(be, wc.bytes));
    wc.w.push_back(Tensor(wc.bufs.back()->p, t, {m, k}, Device::kCuda));
    Tensor fill = dtype_is_quantized(t)
                      ? Tensor(wc.bufs.back()->p, DType::kF16, {static_cast<int64_t>(wc.bytes / 2)}, Device::kCuda)
                      : wc.w.back();
    be.fill_uniform(fill, seed + static_cast<uint64_t>(c), -0.05f, 0.05f);
  }
  return wc;
}

// Microseconds per matmul(x, w) in graph replay, the calls cycling over the
// copies (at least 8 calls, whole rounds of copies); add: matmul_add into
// out instead (the residual, updated in place).
double matmul_over_copies_us(ops::Backend& be, const Tensor& x, const WeightCopies& wc, Tensor& out, bool add = false) {
  const size_t copies = wc.w.size();
  const int calls = static_cast<int>(copies) * std::max(1, static_cast<int>((8 + copies - 1) / copies));
  Tensor scratch;  // matmul_add's: the CUDA backend adds in place and leaves it unused
  return backend_graph_us(be, calls, [&](int i) {
    const Tensor& w = wc.w[static_cast<size_t>(i) % copies];
    if (add) {
      be.matmul_add(x, w, out, scratch);
    } else {
      be.matmul(x, w, Tensor(), out);
    }
  });
}

// A weight matrix [m, k] of Llama-3-8B by name.
struct WeightShape {
  const char* name;
  int64_t m, k;
};

// One table of 16-bit GEMM timings: x [n, k] @ w [m, k]^T for each shape
// at each n of `rows` that keep(n) accepts, over weight copies
// (weight_copies). GB/s counts the bytes one call must move (weights + x +
// out); % copy is against the copy ceiling (read + write).
template <class Keep>
void gemm_rows_table(ops::Backend& be, double copy_gbs, DType t, std::span<const WeightShape> shapes,
                     std::span<const int64_t> rows, Keep keep) {
  const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
  std::printf("%-8s %5s %9s %8s %7s %8s\n", "shape", "n", "us", "GB/s", "% copy", "TFLOP/s");
  for (const WeightShape& sh : shapes) {
    const WeightCopies wc = weight_copies(be, t, sh.m, sh.k, 100);
    Buf x(be, static_cast<size_t>(max_rows * sh.k) * 2), o(be, static_cast<size_t>(max_rows * sh.m) * 2);
    for (int64_t n : rows) {
      if (!keep(n)) continue;
      Tensor xt(x.p, t, {n, sh.k}, Device::kCuda), ot(o.p, t, {n, sh.m}, Device::kCuda);
      be.fill_uniform(xt, 7, -2.0f, 2.0f);
      be.synchronize();
      const double us = matmul_over_copies_us(be, xt, wc, ot);
      const double bytes = static_cast<double>(wc.bytes) + 2.0 * n * sh.k + 2.0 * n * sh.m;
      const double gbs = bytes / us / 1e3;
      std::printf("%-8s %5lld %9.1f %8.1f %6.1f%% %8.1f\n", sh.name, static_cast<long long>(n), us, gbs,
                  100.0 * gbs / copy_gbs, 2.0 * n * sh.m * sh.k / us / 1e6);
      std::fflush(stdout);
    }
  }
}

// Llama-3-8B's weight shapes; the layers' four first, lm_head last.
constexpr WeightShape kLlama3Shapes[] = {
    {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}, {"lm_head", 128256, 4096}};

// Small-n GEMM sweep (see the file comment): BF16 at every n, F16 at three.
void gemm_small_sweep(ops::Backend& be, double copy_gbs) {
  const std::span<const WeightShape> shapes(kLlama3Shapes);
  const int64_t rows[] = {1, 2, 3, 4, 6, 8, 9, 16, 24, 32, 48, 56, 64, 96, 100, 127, 128, 160, 192, 256};
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::printf("GEMM %s at small n (x [n, k] @ w [m, k]^T, out %s)\n", std::string(dtype_name(t)).c_str(),
                std::string(dtype_name(t)).c_str());
    gemm_rows_table(be, copy_gbs, t, shapes, rows,
                    [&](int64_t n) { return t != DType::kF16 || n == 16 || n == 64 || n == 128; });
  }
}

// gemm-mid (file comment): BF16 GEMMs at the row counts of mixed steps
// (a decode batch plus a prompt chunk), timed like gemm-small.
void gemm_mid_sweep(ops::Backend& be, double copy_gbs) {
  const auto shapes = std::span<const WeightShape>(kLlama3Shapes).first(4);  // not lm_head
  const int64_t rows[] = {96, 128, 160, 192, 228, 256, 292, 320, 356, 384, 420, 484, 512, 612};
  std::printf("GEMM BF16 at mixed-step n (x [n, k] @ w [m, k]^T)\n");
  gemm_rows_table(be, copy_gbs, DType::kBF16, shapes, rows, [](int64_t) { return true; });
}

// gemm-fp8 (file comment). % copy counts the E4M3 weight bytes against the
// copy ceiling; "x" is BF16 time / (FP8 rowwise + quantisation).
void gemm_fp8_sweep(ops::Backend& be, double copy_gbs) {
  bench::Fp8GemmBench f8;
  const std::string bad = f8.check_scales();
  std::printf("FP8 scale check: %s\n", bad.empty() ? "ok (scalar and OUTER_VEC_32F)" : bad.c_str());
  const auto shapes = std::span<const WeightShape>(kLlama3Shapes).first(4);  // not lm_head
  const int64_t rows[] = {1, 8, 32, 64, 100, 128, 228, 292, 356, 512, 2048, 8192};
  const int64_t max_rows = 8192;
  std::printf("%-8s %5s %9s %9s %9s %9s %8s %7s %8s %6s\n", "shape", "n", "bf16 us", "f8 us", "f8row us",
              "f8row+fa", "quant us", "% copy", "TFLOP/s", "x");
  for (const WeightShape& sh : shapes) {
    const WeightCopies wc = weight_copies(be, DType::kBF16, sh.m, sh.k, 100);
    Buf x(be, static_cast<size_t>(max_rows * sh.k) * 2), o(be, static_cast<size_t>(max_rows * sh.m) * 2);
    f8.set_shape(sh.m, sh.k, max_rows);
    for (int64_t n : rows) {
      Tensor xt(x.p, DType::kBF16, {n, sh.k}, Device::kCuda), ot(o.p, DType::kBF16, {n, sh.m}, Device::kCuda);
      be.fill_uniform(xt, 7, -2.0f, 2.0f);
      be.synchronize();
      const double bf16 = matmul_over_copies_us(be, xt, wc, ot);
      int a0 = 0, a1 = 0, a2 = 0;
      std::string w0, w1, w2;
      const double scalar = f8.gemm_us(n, false, false, &a0, &w0);
      const double rowwise = f8.gemm_us(n, true, false, &a1, &w1);
      const double fast = f8.gemm_us(n, true, true, &a2, &w2);
      const double quant = f8.quantize_us(n);
      const double best = rowwise > 0 ? rowwise : scalar;
      const double gbs = static_cast<double>(f8.weight_bytes()) / best / 1e3;
      std::printf("%-8s %5lld %9.1f %9.1f %9.1f %9.1f %8.1f %6.1f%% %8.1f %6.2f  (candidates %d/%d/%d)\n", sh.name,
                  static_cast<long long>(n), bf16, scalar, rowwise, fast, quant, 100.0 * gbs / copy_gbs,
                  2.0 * n * sh.m * sh.k / best / 1e6, bf16 / (best + quant), a0, a1, a2);
      for (const std::string* w : {&w0, &w1, &w2}) {
        if (!w->empty() && n == rows[0]) std::printf("  (no time: %s)\n", w->c_str());
      }
      std::fflush(stdout);
    }
  }
}

// gemm-small-add (file comment): the projections that add into the
// residual (o and down) at serving's decode batch sizes, each n timed as
// matmul (out written, beta 0) and as matmul_add (the residual updated in
// place, beta 1), same weights, same x.
void gemm_small_add_sweep(ops::Backend& be, double copy_gbs) {
  const WeightShape shapes[] = {{"o", 4096, 4096}, {"down", 4096, 14336}};
  const int64_t rows[] = {56, 64, 88, 96, 100, 104, 112, 120, 128, 160, 200, 256};
  std::printf("GEMM BF16, out = x @ w^T (beta 0) against residual += x @ w^T (matmul_add, beta 1)\n");
  std::printf("%-8s %5s %10s %10s %8s %8s\n", "shape", "n", "beta0 us", "beta1 us", "b0 %copy", "b1 %copy");
  for (const WeightShape& sh : shapes) {
    const WeightCopies wc = weight_copies(be, DType::kBF16, sh.m, sh.k, 500);
    Buf x(be, static_cast<size_t>(256 * sh.k) * 2), o(be, static_cast<size_t>(256 * sh.m) * 2);
    for (int64_t n : rows) {
      Tensor xt(x.p, DType::kBF16, {n, sh.k}, Device::kCuda), ot(o.p, DType::kBF16, {n, sh.m}, Device::kCuda);
      be.fill_uniform(xt, 7, -2.0f, 2.0f);
      be.fill_uniform(ot, 8, -2.0f, 2.0f);
      be.synchronize();
      const double us0 = matmul_over_copies_us(be, xt, wc, ot);
      const double us1 = matmul_over_copies_us(be, xt, wc, ot, /*add=*/true);
      const double bytes = static_cast<double>(wc.bytes) + 2.0 * n * sh.k + 2.0 * n * sh.m;
      std::printf("%-8s %5lld %10.1f %10.1f %7.1f%% %7.1f%%\n", sh.name, static_cast<long long>(n), us0, us1,
                  100.0 * bytes / us0 / 1e3 / copy_gbs, 100.0 * (bytes + 2.0 * n * sh.m) / us1 / 1e3 / copy_gbs);
      std::fflush(stdout);
    }
  }
}

// gemm-small-quant (file comment): BF16 activations on quantised weights.
void gemm_small_quant_sweep(ops::Backend& be, double copy_gbs) {
  const auto shapes = std::span<const WeightShape>(kLlama3Shapes).first(4);  // not lm_head
  const int64_t rows[] = {1, 2, 4, 8, 9, 16, 24, 32, 33, 48, 64};
  const char* env = std::getenv("OSPREY_QGEMV_MAX_ROWS");
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    std::printf("GEMM %s weights, BF16 x [n, k], OSPREY_QGEMV_MAX_ROWS=%s\n", std::string(dtype_name(t)).c_str(),
                env != nullptr ? env : "(unset)");
    std::printf("%-8s %5s %9s %8s %7s\n", "shape", "n", "us", "GB/s", "% copy");
    for (const WeightShape& sh : shapes) {
      const WeightCopies wc = weight_copies(be, t, sh.m, sh.k, 300);
      Buf x(be, static_cast<size_t>(64 * sh.k) * 2), o(be, static_cast<size_t>(64 * sh.m) * 2);
      for (int64_t n : rows) {
        Tensor xt(x.p, DType::kBF16, {n, sh.k}, Device::kCuda), ot(o.p, DType::kBF16, {n, sh.m}, Device::kCuda);
        be.fill_uniform(xt, 7, -2.0f, 2.0f);
        be.synchronize();
        const double us = matmul_over_copies_us(be, xt, wc, ot);
        const double gbs = static_cast<double>(wc.bytes) / us / 1e3;
        std::printf("%-8s %5lld %9.1f %8.1f %6.1f%%\n", sh.name, static_cast<long long>(n), us, gbs,
                    100.0 * gbs / copy_gbs);
        std::fflush(stdout);
      }
    }
  }
}

void sampler_sweep(ops::Backend& be, double) {
  const int64_t vocab = 128256;
  const int max_rows = 256;
  const size_t cells = static_cast<size_t>(max_rows) * vocab;
  Buf logits(be, cells * 4), scratch(be, static_cast<size_t>(vocab) * 4);
  Buf rows_d(be, max_rows * sizeof(DeviceSampleRow)), edits(be, 64);
  Buf tok(be, max_rows * 4), lp(be, max_rows * 4), rank(be, max_rows * 4);
  Buf top_ids(be, size_t{max_rows} * kMaxDeviceTopLogprobs * 4),
      top_lp(be, size_t{max_rows} * kMaxDeviceTopLogprobs * 4);
  be.copy_to_device(edits.p, std::vector<int32_t>(16, 0).data(), 64);
  std::vector<float> host(cells);
  struct Kind {
    const char* name;
    float sd, boost;  // sd 0: uniform in [-4, 4]
  };
  struct Params {
    const char* name;
    float temperature, top_p, min_p;
    int top_k;
    int logprobs = -1;
  };
  const Params params[] = {{"greedy", 0.0f, 1.0f, 0.0f, 0},
                           {"T=0.8", 0.8f, 1.0f, 0.0f, 0},
                           {"T=0.8 top_p=0.9", 0.8f, 0.9f, 0.0f, 0},
                           {"T=0.8 top_k=50", 0.8f, 1.0f, 0.0f, 50},
                           {"T=0.8 top_k=50 top_p=0.9", 0.8f, 0.9f, 0.0f, 50},
                           {"T=0.8 min_p=0.05", 0.8f, 1.0f, 0.05f, 0},
                           {"greedy logprobs=5", 0.0f, 1.0f, 0.0f, 0, 5},
                           {"greedy logprobs=20", 0.0f, 1.0f, 0.0f, 0, 20},
                           {"T=0.8 top_k=50 logprobs=5", 0.8f, 1.0f, 0.0f, 50, 5}};
  for (const Kind kind : {Kind{"flat", 0.0f, 0.0f}, Kind{"peaked", 2.5f, 6.0f}, Kind{"sharp", 1.5f, 10.0f}}) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
    std::normal_distribution<float> nrm(0.0f, kind.sd > 0.0f ? kind.sd : 1.0f);
    for (size_t i = 0; i < cells; ++i) host[i] = kind.sd > 0.0f ? nrm(rng) : uni(rng);
    if (kind.sd > 0.0f) {
      for (int r = 0; r < max_rows; ++r)
        for (int j = 0; j < 20; ++j) host[static_cast<size_t>(r) * vocab + rng() % vocab] += kind.boost + 0.3f * j;
    }
    be.copy_to_device(logits.p, host.data(), cells * 4);
    for (const Params& p : params) {
      for (int n : {1, 32, 100, 256}) {
        std::vector<DeviceSampleRow> rows(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) {
          DeviceSampleRow& d = rows[static_cast<size_t>(r)];
          d.logit_row = r;
          d.temperature = p.temperature;
          d.top_p = p.top_p;
          d.top_k = p.top_k;
          d.min_p = p.min_p;
          d.num_logprobs = p.logprobs;
          d.seed = 1000 + static_cast<uint64_t>(r);
          d.seq_index = r;
          d.position = 17;
        }
        be.copy_to_device(rows_d.p, rows.data(), rows.size() * sizeof(DeviceSampleRow));
        ops::Backend::SampleBatch b;
        b.logits = static_cast<const float*>(logits.p);
        b.vocab = vocab;
        b.num_rows = n;
        b.rows = rows_d.p;
        b.edit_ids = static_cast<const int32_t*>(edits.p);
        b.edit_vals = static_cast<const float*>(edits.p);
        b.scratch = static_cast<float*>(scratch.p);
        b.tokens = static_cast<int32_t*>(tok.p);
        b.logprobs = static_cast<float*>(lp.p);
        b.ranks = static_cast<int32_t*>(rank.p);
        b.top_ids = static_cast<int32_t*>(top_ids.p);
        b.top_logprobs = static_cast<float*>(top_lp.p);
        const double us = median_us(be, 5,
                                    [&] {
                                      for (int i = 0; i < 10; ++i) be.sample(b);
                                    }) /
                          10.0;
        std::printf("sampler %-7s %-26s rows %4d %10.1f us\n", kind.name, p.name, n, us);
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto be = cuda::make_cuda_backend({});
  if (!be) return 1;
  std::printf("device: %s\n", be->name());
  std::printf("%-34s %-30s %10s %9s\n", "op", "shape", "us", "rate");
  // One sweep alone, after the copy ceiling it is measured against.
  const std::pair<const char*, void (*)(ops::Backend&, double)> sweeps[] = {
      {"decode-attention", decode_attention_sweep},
      {"gemm-small", gemm_small_sweep},
      {"gemm-mid", gemm_mid_sweep},
      {"gemm-small-quant", gemm_small_quant_sweep},
      {"gemm-small-add", gemm_small_add_sweep},
      {"gemm-fp8", gemm_fp8_sweep},
      {"sampler", sampler_sweep}};
  for (const auto& [name, sweep] : sweeps) {
    if (argc > 1 && std::strcmp(argv[1], name) == 0) {
      const double copy_gbs = copy_ceiling(*be);
      sweep(*be, copy_gbs);
      std::printf("copy ceiling %.0f GB/s\n", copy_gbs);
      return 0;
    }
  }

  const double copy_gbs = copy_ceiling(*be);

  // Matmul: decode (n = 1) is weight-bound; prefill (n = 2048) compute-bound.
  const int64_t d = 4096, f = 14336;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32, DType::kQ8_0, DType::kQ4_1, DType::kQ4_0}) {
    const int64_t m = 2 * f, k = d;  // fused gate/up
    const size_t wbytes = static_cast<size_t>(dtype_row_bytes(t, k) * m);
    Buf w(*be, wbytes), x(*be, 2048 * k * 4), o(*be, 2048 * m * 4);
    Tensor wt(w.p, t, {m, k}, Device::kCuda);
    for (int64_t n : {1, 8, 2048}) {
      Tensor xt(x.p, DType::kF32, {n, k}, Device::kCuda), ot(o.p, DType::kF32, {n, m}, Device::kCuda);
      const double us = median_us(*be, n == 2048 ? 5 : 50, [&] { be->matmul(xt, wt, Tensor(), ot); });
      const std::string shape = "n=" + std::to_string(n) + " [" + std::to_string(m) + "x" + std::to_string(k) + "]";
      if (n <= 8) {
        row("matmul " + std::string(dtype_name(t)), shape, us, wbytes / us / 1e3, "GB/s weights");
      } else {
        row("matmul " + std::string(dtype_name(t)), shape, us, 2.0 * n * m * k / us / 1e6, "TFLOP/s");
      }
    }
  }

  // Paged attention, Llama-3-8B heads (32 q / 8 kv x 128), F32 pages of 16.
  const int hq = 32, hk = 8, hd = 128, bs = 16;
  for (auto [num_seqs, ctx, q_len] :
       {std::tuple{1, 4096, 1}, std::tuple{32, 4096, 1}, std::tuple{1, 32768, 1}, std::tuple{1, 2048, 2048}}) {
    const int pages_per_seq = (ctx + bs - 1) / bs;
    const int num_blocks = pages_per_seq * num_seqs;
    const int n = num_seqs * q_len;
    const size_t page_bytes = static_cast<size_t>(num_blocks) * bs * hk * hd * 4;
    Buf kc(*be, page_bytes), vc(*be, page_bytes), q(*be, static_cast<size_t>(n) * hq * hd * 4),
        out(*be, static_cast<size_t>(n) * hq * hd * 4);
    // Sequence s: pages [s * pages_per_seq, (s + 1) * pages_per_seq) in order;
    // no slot mapping (the op writes no KV).
    gpu_test::HostAttentionBatch h;
    for (int s = 0; s < num_seqs; ++s) h.add_seq_own_pages(q_len, ctx, bs, false);
    ops::AttentionBatch b = h.sizes();
    b.q_indptr = upload_ints(*be, h.q_indptr);
    b.kv_lens = upload_ints(*be, h.kv_lens);
    b.block_indptr = upload_ints(*be, h.block_indptr);
    b.block_indices = upload_ints(*be, h.block_indices);
    b.positions = upload_ints(*be, h.positions);
    ops::LayerKv kv;
    kv.k = Tensor(kc.p, DType::kF32, {num_blocks, bs, hk, hd}, Device::kCuda);
    kv.v = Tensor(vc.p, DType::kF32, {num_blocks, bs, hk, hd}, Device::kCuda);
    Tensor qt(q.p, DType::kF32, {n, hq, hd}, Device::kCuda), ot(out.p, DType::kF32, {n, hq, hd}, Device::kCuda);
    const double us = median_us(*be, 10, [&] { be->paged_attention(qt, kv, b, 0.088f, 0, ot); });
    const std::string shape =
        std::to_string(num_seqs) + " seq x " + std::to_string(q_len) + " q, ctx " + std::to_string(ctx);
    if (q_len == 1) {
      row("paged_attention decode F32 KV", shape, us, 2.0 * page_bytes / us / 1e3, "GB/s KV");
    } else {
      const double flops = 4.0 * hq * hd * (static_cast<double>(q_len) * (q_len + 1) / 2);
      row("paged_attention prefill F32 KV", shape, us, flops / us / 1e6, "TFLOP/s (causal)");
    }
    for (const int32_t* p : {b.q_indptr, b.kv_lens, b.block_indptr, b.block_indices, b.positions})
      be->free(const_cast<int32_t*>(p));
  }
  decode_attention_sweep(*be, copy_gbs);
  std::printf("copy ceiling %.0f GB/s\n", copy_gbs);
  return 0;
}
