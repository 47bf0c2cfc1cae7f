// Whole-model figures on the CUDA backend with dummy weights of a bundled
// config (default Llama-3-8B) in bf16: TTFT of one prompt (2048 tokens, or --prompt),
// batch-1 decode time per step at several context lengths with MBU against
// the measured copy bandwidth, and a per-op breakdown of one decode step and
// of the prefill (CUDA events around every backend call). A benchmark: it
// prints figures and asserts nothing. Built as model_bench next to gpu_tests.
//
// Usage: model_bench [config name, default llama-3-8b] [dtype, default bfloat16] [--decode-only] [--ctx N]...
//        [--ttft-reps N] [--ttft-gap-ms G] [--batch N]... [--pool-gb G] [--scatter] [--mixed P] [--profile-step]
//        [--ctx-spread F] [--fp8] [--kv-cache-dtype D] [--prompt N]
// --prompt N (1..32768, default 2048): the TTFT prompt's length.
// --kv-cache-dtype D: the KV pages' dtype (ModelLoadOptions::kv_cache_dtype,
// e.g. fp8; default auto = the compute dtype); MBU counts their bytes.
// --decode-only skips the TTFT and prefill breakdown (A/B runs of decode
// switches such as OSPREY_CUDA_NO_PDL=1, which the header line echoes);
// --ctx N (repeatable, 1..8192) replaces the decode contexts 512, 2048,
// 4096, 8192 (the per-op breakdown is printed at 2048 only). --ttft-reps N
// (default 5, after 2 warm-up runs) times N back-to-back prefills; above 5
// it also prints the series and the median of the last 5 (the SM clock
// ramps and dips under the power cap in the first ~1 s of load).
// --ttft-gap-ms G (default 0) leaves the GPU idle G ms before every TTFT run
// (warm-ups included): a prompt reaching an idle server, whose SM clock has
// recovered from the power cap, against back-to-back prompts under load.
// --batch N (repeatable, 1..512, default 1) times a decode step of N
// sequences, each at every --ctx context with its own KV pages (one token
// and one logits row per sequence, as the engine's decode steps), and prints
// the per-op breakdown at every context (batch 1: at 2048 only). Batches run
// in the order given, so cuBLASLt's tuning buckets see the n's in that order
// (the engine warms its decode graphs smallest first). Pairs whose KV
// exceeds kMaxBatchKvBytes are skipped.
// --pool-gb G (default: just the pages the runs need) allocates a KV pool of
// G GB (32 layers x K and V, as the engine's pool) and --scatter gives the
// batched decode steps' sequences pages drawn at random over the whole pool
// (fixed seed) instead of one contiguous run per sequence: the page layout
// of a server that has run for a while (A/B for the engine's decode steps).
// --mixed P adds to every batched decode step (--batch N > 1) one prompt of P
// new tokens (serving's mixed steps: decodes riding along a prompt chunk;
// the MBU column then still counts only the decodes' bytes). Run it with
// OSPREY_MIXED_ATTENTION=joint for the single-launch attention (A/B).
// --ctx-spread F (0..0.95, default 0) gives the batched decode steps'
// sequences contexts spread evenly over ctx * [1 - F, 1 + F] in a shuffled
// order (the mean stays ctx), as a server's sequences are; every batched
// step carries the longest-first order the engine passes
// (AttentionBatch::decode_order; OSPREY_DECODE_ORDER=0 ignores it, A/B).
// --profile-step brackets one eager decode step of every --batch x --ctx
// pair with cudaProfilerStart/Stop, for `ncu --profile-from-start off`:
// each kernel's own time and DRAM bytes, without the event overhead of the
// breakdown (bench/gpu/ncu_step.sh).
// --graph-edges prints, for the first --batch x --ctx pair, the captured
// decode step's kernel nodes in order with the type of the edge into each
// (programmatic = the node may start before the one before it ends: PDL).
// --pdl-gemm (an experiment, first --batch x --ctx pair): captures the
// decode step twice, turns every ordinary edge into a cuBLAS kernel node
// (a node whose name the runtime cannot give) of the second graph into a
// programmatic one (the GEMM may launch before the kernel before it ends;
// correct only if the GEMM waits on its dependencies, griddepcontrol.wait),
// then replays both with new token ids each time, compares the first
// logits rows bit for bit, and times both.
// --fp8 loads the model with quantization fp8 (the layers' projections in
// E4M3, FP8 GEMMs; bytes/step and MBU then count the E4M3 weights).
// --trace (where CUPTI is built in, OSPREY_HAVE_CUPTI): after each graph
// replay timing, five more replays under CUPTI's concurrent-kernel activity
// tracing; for the last, the step's first 24 kernels in order (start and
// duration in us, gap after the kernel before: negative = overlap, PDL) and
// the step summarised per kernel and grid (bench/kernel_timeline.h: busy,
// and gating = the moments it was the oldest kernel running), with the five
// traced walls against the untraced replay.
// OSPREY_BENCH_SKIP=label[,label...] leaves those ops (breakdown labels,
// e.g. rms_scale+silu_mul) out of every step: the time a fusion that
// removed them could save at most.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <thread>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "bench/kernel_timeline.h"
#include "model/model.h"
#include "ops/decode_order.h"

#if OSPREY_HAVE_CUPTI
#include <cupti.h>
#include <cxxabi.h>
#endif

namespace {

using namespace osprey;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

#if OSPREY_HAVE_CUPTI
// CUPTI concurrent-kernel activity records, collected into g_spans.
std::vector<bench::KernelSpan> g_spans;

void CUPTIAPI trace_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{16} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI trace_buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    int status = 0;
    char* dem = abi::__cxa_demangle(k->name, nullptr, nullptr, &status);
    std::string name = bench::short_kernel_name(status == 0 && dem != nullptr ? dem : k->name);
    std::free(dem);
    name += " [" + std::to_string(k->gridX) + (k->gridY > 1 || k->gridZ > 1 ? "x" + std::to_string(k->gridY) : "") +
            (k->gridZ > 1 ? "x" + std::to_string(k->gridZ) : "") + "]";
    g_spans.push_back({name, k->start, k->end});
  }
  std::free(buffer);
}

#define CUPTI_CK(x)                                                           \
  do {                                                                        \
    CUptiResult r_ = (x);                                                     \
    if (r_ != CUPTI_SUCCESS) {                                                \
      const char* m_ = nullptr;                                               \
      cuptiGetResultString(r_, &m_);                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, m_);     \
      return;                                                                 \
    }                                                                         \
  } while (0)

// Five replays of `launch` (drained with `sync`) under kernel activity
// tracing; prints the last one's kernels and summary (--trace).
void trace_replays(const std::function<void()>& launch, const std::function<void()>& sync, double untraced_ms) {
  // Registered afresh each call: the cuptiFinalize below detaches CUPTI.
  CUPTI_CK(cuptiActivityRegisterCallbacks(trace_buffer_requested, trace_buffer_completed));
  CUPTI_CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  std::vector<std::pair<uint64_t, uint64_t>> windows;
  for (int r = 0; r < 5; ++r) {
    sync();
    uint64_t t0 = 0, t1 = 0;
    CUPTI_CK(cuptiGetTimestamp(&t0));
    launch();
    sync();
    CUPTI_CK(cuptiGetTimestamp(&t1));
    windows.emplace_back(t0, t1);
  }
  CUPTI_CK(cuptiActivityFlushAll(1));
  CUPTI_CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  // Detach CUPTI (the stream is drained and the buffers flushed): left
  // attached, it slowed every later untraced graph replay of the process
  // (session 37, H200: Llama-3-8B batch 1 at 2048 keys after a trace at 512
  // read 4.26-4.28 ms against 4.17 ms of kernels; 4.17 with this detach,
  // the same as a run without --trace).
  CUPTI_CK(cuptiFinalize());
  std::vector<bench::KernelSpan> last;
  std::printf("  trace (CUPTI, graph replay): walls");
  for (const auto& [t0, t1] : windows) {
    std::vector<bench::KernelSpan> in;
    for (const auto& sp : g_spans)
      if (sp.start_ns >= t0 && sp.end_ns <= t1) in.push_back(sp);
    std::printf(" %.1f", bench::summarize_kernel_timeline(in).wall_us);
    last = std::move(in);
  }
  std::printf(" us (untraced replay %.1f us)\n", untraced_ms * 1e3);
  g_spans.clear();
  std::sort(last.begin(), last.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  if (last.empty()) return;
  std::printf("  %-44s %9s %9s %9s\n", "first kernels of the last traced step", "start us", "dur us", "gap us");
  uint64_t prev_end = last.front().start_ns;
  for (size_t i = 0; i < last.size() && i < 24; ++i) {
    const auto& sp = last[i];
    std::printf("  %-44s %9.2f %9.2f %9.2f\n", sp.name.c_str(), (sp.start_ns - last.front().start_ns) * 1e-3,
                (sp.end_ns - sp.start_ns) * 1e-3, (static_cast<double>(sp.start_ns) - static_cast<double>(prev_end)) * 1e-3);
    prev_end = sp.end_ns;
  }
  std::printf("%s", bench::format_kernel_timeline(bench::summarize_kernel_timeline(last)).c_str());
}
#else
void trace_replays(const std::function<void()>&, const std::function<void()>&, double) {
  std::printf("  trace: this model_bench was built without CUPTI\n");
}
#endif

// Forwards every op to the CUDA backend; when on, brackets each call with
// CUDA events on the backend's stream and files the time under a label.
class ProfilingBackend final : public ops::Backend {
 public:
  ProfilingBackend(ops::Backend& inner, cudaStream_t stream) : b_(inner), stream_(stream) {
    events_.resize(8192);
    for (auto& e : events_) CK(cudaEventCreate(&e));
  }
  ~ProfilingBackend() override {
    for (auto& e : events_) cudaEventDestroy(e);
  }
  bool on = false;
  // label -> (total ms, calls) of the last collect()
  std::map<std::string, std::pair<double, int>> collect() {
    CK(cudaStreamSynchronize(stream_));
    std::map<std::string, std::pair<double, int>> out;
    for (size_t i = 0; i < labels_.size(); ++i) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]));
      auto& s = out[labels_[i]];
      s.first += ms;
      s.second += 1;
    }
    labels_.clear();
    return out;
  }

  Device device() const override { return b_.device(); }
  const char* name() const override { return b_.name(); }
  void* alloc(size_t n) override { return b_.alloc(n); }
  void free(void* p) override { b_.free(p); }
  void copy_to_device(void* d, const void* s, size_t n) override { b_.copy_to_device(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { b_.copy_to_host(d, s, n); }
  void synchronize() override { b_.synchronize(); }
  DType default_activation_dtype() const override { return b_.default_activation_dtype(); }
  bool supports_activation_dtype(DType t) const override { return b_.supports_activation_dtype(t); }
  void convert(const Tensor& s, Tensor& d) override { b_.convert(s, d); }
  void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) override { b_.fill_uniform(t, seed, lo, hi); }

  void embedding(const Tensor& t, const int32_t* ids, Tensor& o) override {
    timed("embedding", [&] { b_.embedding(t, ids, o); });
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& o) override {
    timed("rms_norm", [&] { b_.rms_norm(x, w, eps, o); });
  }
  void add_rms_norm(Tensor& r, const Tensor& x, const Tensor& w, float eps, Tensor& o) override {
    timed("add_rms_norm", [&] { b_.add_rms_norm(r, x, w, eps, o); });
  }
  void add(Tensor& x, const Tensor& y) override {
    timed("add", [&] { b_.add(x, y); });
  }
  void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& o) override {
    const std::string label = "matmul " + std::to_string(w.dim(0)) + "x" + std::to_string(w.dim(1));
    timed(label, [&] { b_.matmul(x, w, bias, o); });
    bytes_[label] = static_cast<double>(w.nbytes());
  }
  // Forwarded whole, so the model takes the inner backend's residual sequence.
  void matmul_add(const Tensor& x, const Tensor& w, Tensor& r, Tensor& s) override {
    const std::string label = "matmul+add " + std::to_string(w.dim(0)) + "x" + std::to_string(w.dim(1));
    timed(label, [&] { b_.matmul_add(x, w, r, s); });
    bytes_[label] = static_cast<double>(w.nbytes());
  }
  bool fuses_matmul_add(DType act) const override { return b_.fuses_matmul_add(act); }
  // Forwarded whole, so the model folds the norms as it would unprofiled.
  void rms_norm_matmul(const Tensor& x, const Tensor& nw, float eps, const Tensor& w, const Tensor& bias,
                       Tensor& normed, Tensor& o) override {
    const std::string label = "rms_norm+matmul " + std::to_string(w.dim(0)) + "x" + std::to_string(w.dim(1));
    timed(label, [&] { b_.rms_norm_matmul(x, nw, eps, w, bias, normed, o); });
    bytes_[label] = static_cast<double>(w.nbytes());
  }
  void rms_norm_matmul_silu_mul(const Tensor& x, const Tensor& nw, float eps, const Tensor& w, Tensor& normed,
                                Tensor& g, Tensor& o) override {
    const std::string label =
        "rms_norm+matmul+silu_mul " + std::to_string(w.dim(0)) + "x" + std::to_string(w.dim(1));
    timed(label, [&] { b_.rms_norm_matmul_silu_mul(x, nw, eps, w, normed, g, o); });
    bytes_[label] = static_cast<double>(w.nbytes());
  }
  bool fuses_rms_norm_matmul(int64_t n, DType act) const override { return b_.fuses_rms_norm_matmul(n, act); }
  // FP8 weights (--fp8): as the inner backend; the conversion runs at load, untimed.
  bool supports_fp8_weights(DType act) const override { return b_.supports_fp8_weights(act); }
  bool supports_kv_dtype(DType kv, DType act, int head_dim, int group) const override {
    return b_.supports_kv_dtype(kv, act, head_dim, group);
  }
  Status quantize_weight_fp8(const Tensor& w, Tensor& q) override { return b_.quantize_weight_fp8(w, q); }
  // Forwarded, so the model folds the norms as it would unprofiled.
  bool folds_norms(DType act) const override { return b_.folds_norms(act); }
  void scale_columns(Tensor& w, const Tensor& s) override { b_.scale_columns(w, s); }
  void rms_scaled_qkv_rope_kv_write(const Tensor& x, float xe, const Tensor& qkv, const Tensor& bias, const Tensor& qn,
                                    const Tensor& kn, float eps, const ops::RopeTable& rt, const ops::AttentionBatch& a,
                                    ops::LayerKv& kv, Tensor& q) override {
    timed("rms_scale+qkv_rope_kv_write",
          [&] { b_.rms_scaled_qkv_rope_kv_write(x, xe, qkv, bias, qn, kn, eps, rt, a, kv, q); });
  }
  void rms_scaled_silu_mul(const Tensor& x, float xe, const Tensor& g, Tensor& o) override {
    timed("rms_scale+silu_mul", [&] { b_.rms_scaled_silu_mul(x, xe, g, o); });
  }
  void head_rms_norm(Tensor& x, const Tensor& w, float eps) override {
    timed("head_rms_norm", [&] { b_.head_rms_norm(x, w, eps); });
  }
  void rope(Tensor& q, Tensor& k, const int32_t* p, const ops::RopeTable& t) override {
    timed("rope", [&] { b_.rope(q, k, p, t); });
  }
  void silu_mul(const Tensor& g, Tensor& o) override {
    timed("silu_mul", [&] { b_.silu_mul(g, o); });
  }
  void matmul_silu_mul(const Tensor& x, const Tensor& w, Tensor& g, Tensor& o) override {
    const std::string label = "matmul+silu_mul " + std::to_string(w.dim(0)) + "x" + std::to_string(w.dim(1));
    timed(label, [&] { b_.matmul_silu_mul(x, w, g, o); });
    bytes_[label] = static_cast<double>(w.nbytes());
  }
  void kv_write(const Tensor& k, const Tensor& v, const ops::AttentionBatch& a, ops::LayerKv& kv) override {
    timed("kv_write", [&] { b_.kv_write(k, v, a, kv); });
  }
  void paged_attention(const Tensor& q, const ops::LayerKv& kv, const ops::AttentionBatch& a, float s, int w,
                       Tensor& o) override {
    timed("paged_attention", [&] { b_.paged_attention(q, kv, a, s, w, o); });
  }
  void gather_rows(const Tensor& x, const int32_t* r, int n, Tensor& o) override {
    timed("gather_rows", [&] { b_.gather_rows(x, r, n, o); });
  }
  void fill_rows_from(const Tensor& x, const int32_t* r, int n, Tensor& o) override {
    timed("fill_rows_from", [&] { b_.fill_rows_from(x, r, n, o); });
  }
  void qkv_rope_kv_write(const Tensor& qkv, const Tensor& qn, const Tensor& kn, float eps, const ops::RopeTable& rt,
                         const ops::AttentionBatch& a, ops::LayerKv& kv, Tensor& q) override {
    timed("qkv_rope_kv_write", [&] { b_.qkv_rope_kv_write(qkv, qn, kn, eps, rt, a, kv, q); });
  }
  // Minimum bytes one call of `label` reads (paged_attention: the step's KV).
  void set_bytes(const std::string& label, double bytes) { bytes_[label] = bytes; }
  double weight_bytes_of(const std::string& label) const {
    auto it = bytes_.find(label);
    return it == bytes_.end() ? 0.0 : it->second;
  }

 private:
  template <class F>
  void timed(const std::string& label, F&& fn) {
    if (skipped(label)) return;
    if (!on || 2 * labels_.size() + 2 > events_.size()) {
      fn();
      return;
    }
    const size_t i = labels_.size();
    CK(cudaEventRecord(events_[2 * i], stream_));
    fn();
    CK(cudaEventRecord(events_[2 * i + 1], stream_));
    labels_.push_back(label);
  }
  // OSPREY_BENCH_SKIP: comma-separated op labels that are not run at all
  // (a leave-one-out timing: what the step would take without them; the
  // outputs are then wrong, so only the times mean anything).
  static bool skipped(const std::string& label) {
    static const std::vector<std::string> skip = [] {
      std::vector<std::string> v;
      const char* e = std::getenv("OSPREY_BENCH_SKIP");
      std::string cur;
      for (const char* c = e ? e : ""; ; ++c) {
        if (*c == ',' || *c == '\0') {
          if (!cur.empty()) v.push_back(cur);
          cur.clear();
          if (*c == '\0') break;
        } else {
          cur += *c;
        }
      }
      return v;
    }();
    return std::find(skip.begin(), skip.end(), label) != skip.end();
  }
  ops::Backend& b_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  std::vector<std::string> labels_;
  std::map<std::string, double> bytes_;
};

// Device copies of one step's inputs for a single sequence.
struct Step {
  std::vector<void*> bufs;
  ForwardBatch fb;
};

int32_t* put(ops::Backend& be, Step& s, const std::vector<int32_t>& v) {
  void* p = be.alloc(std::max<size_t>(4, v.size() * 4));
  be.copy_to_device(p, v.data(), v.size() * 4);
  s.bufs.push_back(p);
  return static_cast<int32_t*>(p);
}

// Page slots each sequence of a batched decode step owns (make_decode_batch).
int decode_pages_per_seq(int ctx, int bs, double spread) {
  const int most = static_cast<int>(std::lround(ctx * (1.0 + spread)));  // spread >= 0: >= ctx
  return (most + bs - 1) / bs;
}

// A decode step of `seqs` sequences, one new token each at position
// ctx - 1; sequence i owns pages page_of[i * pages + p] for p < pages =
// ceil(ctx / bs) (page_of empty: pages [i * pages, (i + 1) * pages));
// logits of every row. mixed > 0 appends a sequence of `mixed` new prompt
// tokens at positions [0, mixed) on pages seqs * pages, seqs * pages + 1, ...
// (a prompt riding along the decodes, as serving's mixed steps); its last
// token gets a logits row. spread > 0 (--ctx-spread): sequence i's context
// is ctx * (1 + spread * u_i), the u_i evenly spaced over [-1, 1] in a
// shuffled order (fixed seed), each sequence owning ceil(ctx * (1 + spread)
// / bs) page slots of which it uses its own count. Every step also carries
// AttentionBatch::decode_order (most keys first), as the engine's do.
Step make_decode_batch(ops::Backend& be, int seqs, int ctx, int bs, int vocab,
                       const std::vector<int32_t>& page_of = {}, int mixed = 0, double spread = 0) {
  Step s;
  const int pages = decode_pages_per_seq(ctx, bs, spread);
  std::vector<int32_t> ctx_of(static_cast<size_t>(seqs), ctx);
  if (spread > 0 && seqs > 1) {
    for (int i = 0; i < seqs; ++i) {
      const double u = -1.0 + 2.0 * i / (seqs - 1);
      ctx_of[static_cast<size_t>(i)] = std::max(1, static_cast<int>(std::lround(ctx * (1.0 + spread * u))));
    }
    std::shuffle(ctx_of.begin(), ctx_of.end(), std::mt19937(4242));
  }
  std::vector<int32_t> ids, pos, slots, q_indptr{0}, kv_lens, bptr{0}, bidx, rows;
  for (int i = 0; i < seqs; ++i) {
    const int len = ctx_of[static_cast<size_t>(i)];
    ids.push_back((i * 7919 + 13) % vocab);
    pos.push_back(len - 1);
    auto page = [&](int p) { return page_of.empty() ? i * pages + p : page_of[static_cast<size_t>(i * pages + p)]; };
    slots.push_back(page((len - 1) / bs) * bs + (len - 1) % bs);
    q_indptr.push_back(i + 1);
    kv_lens.push_back(len);
    const int used = (len + bs - 1) / bs;
    bptr.push_back(bptr.back() + used);
    for (int p = 0; p < used; ++p) bidx.push_back(page(p));
    rows.push_back(i);
  }
  std::vector<int32_t> order(static_cast<size_t>(seqs));
  ops::longest_first_order(kv_lens.data(), seqs, order.data());
  if (mixed > 0) {
    const int first_free = seqs * pages;
    for (int t = 0; t < mixed; ++t) {
      ids.push_back((t * 104729 + 7) % vocab);
      pos.push_back(t);
      slots.push_back((first_free + t / bs) * bs + t % bs);
    }
    q_indptr.push_back(seqs + mixed);
    kv_lens.push_back(mixed);
    const int pp = (mixed + bs - 1) / bs;
    bptr.push_back(bptr.back() + pp);
    for (int p = 0; p < pp; ++p) bidx.push_back(first_free + p);
    rows.push_back(seqs + mixed - 1);
  }
  const int nseq = seqs + (mixed > 0 ? 1 : 0);
  s.fb.token_ids = put(be, s, ids);
  s.fb.attn.num_seqs = nseq;
  s.fb.attn.num_tokens = seqs + mixed;
  s.fb.attn.max_q_len = std::max(1, mixed);
  s.fb.attn.max_kv_len = std::max(*std::max_element(ctx_of.begin(), ctx_of.end()), mixed);
  s.fb.attn.decode_order = put(be, s, order);
  s.fb.attn.num_leading_decodes = seqs;
  s.fb.attn.q_indptr = put(be, s, q_indptr);
  s.fb.attn.kv_lens = put(be, s, kv_lens);
  s.fb.attn.block_indptr = put(be, s, bptr);
  s.fb.attn.block_indices = put(be, s, bidx);
  s.fb.attn.positions = put(be, s, pos);
  s.fb.attn.slot_mapping = put(be, s, slots);
  s.fb.logit_rows = put(be, s, rows);
  s.fb.num_logit_rows = static_cast<int>(rows.size());
  return s;
}

// A step of `n` new tokens at positions [ctx - n, ctx) of one sequence whose
// pages are 0, 1, 2, ... (block size bs); logits of the last token.
Step make_step(ops::Backend& be, int n, int ctx, int bs, int vocab) {
  Step s;
  std::vector<int32_t> ids(static_cast<size_t>(n)), pos(static_cast<size_t>(n)), slots(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ids[static_cast<size_t>(i)] = (i * 7919 + 13) % vocab;
    pos[static_cast<size_t>(i)] = ctx - n + i;
    slots[static_cast<size_t>(i)] = ctx - n + i;
  }
  const int pages = (ctx + bs - 1) / bs;
  std::vector<int32_t> bidx(static_cast<size_t>(pages));
  std::iota(bidx.begin(), bidx.end(), 0);
  s.fb.token_ids = put(be, s, ids);
  s.fb.attn.num_seqs = 1;
  s.fb.attn.num_tokens = n;
  s.fb.attn.max_q_len = n;
  s.fb.attn.max_kv_len = ctx;
  s.fb.attn.q_indptr = put(be, s, {0, n});
  s.fb.attn.kv_lens = put(be, s, {ctx});
  s.fb.attn.block_indptr = put(be, s, {0, pages});
  s.fb.attn.block_indices = put(be, s, bidx);
  s.fb.attn.positions = put(be, s, pos);
  s.fb.attn.slot_mapping = put(be, s, slots);
  s.fb.logit_rows = put(be, s, {n - 1});
  s.fb.num_logit_rows = 1;
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_breakdown(ProfilingBackend& prof, const std::map<std::string, std::pair<double, int>>& ops,
                     double copy_gbs) {
  double total = 0;
  for (const auto& [k, v] : ops) total += v.first;
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(ops.begin(), ops.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("  %-28s %6s %10s %7s %12s\n", "op", "calls", "ms", "share", "GB/s (weights or KV read, % of copy)");
  for (const auto& [k, v] : rows) {
    const double wb = prof.weight_bytes_of(k) * v.second;
    char rate[64] = "";
    if (wb > 0)
      std::snprintf(rate, sizeof rate, "%8.0f (%2.0f%%)", wb / (v.first * 1e-3) / 1e9,
                    100.0 * wb / (v.first * 1e-3) / 1e9 / copy_gbs);
    std::printf("  %-28s %6d %10.3f %6.1f%% %s\n", k.c_str(), v.second, v.first, 100.0 * v.first / total, rate);
  }
  std::printf("  %-28s %6s %10.3f (sum of op times)\n", "total", "", total);
}

// A graph's edges: from[e] -> to[e] with data[e].
struct GraphEdges {
  std::vector<cudaGraphNode_t> from, to;
  std::vector<cudaGraphEdgeData> data;
};
GraphEdges graph_edges(cudaGraph_t g) {
  size_t n = 0;
  CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  GraphEdges e{std::vector<cudaGraphNode_t>(n), std::vector<cudaGraphNode_t>(n), std::vector<cudaGraphEdgeData>(n)};
  CK(cudaGraphGetEdges(g, e.from.data(), e.to.data(), e.data.data(), &n));
  return e;
}

// "(not a kernel)", the kernel's name, or "" for a kernel whose name the
// runtime cannot give (a library's kernel: cuBLAS here).
std::string node_name(cudaGraphNode_t n) {
  cudaGraphNodeType type{};
  CK(cudaGraphNodeGetType(n, &type));
  if (type != cudaGraphNodeTypeKernel) return "(not a kernel)";
  cudaKernelNodeParams kp{};
  const char* fname = nullptr;
  if (cudaGraphKernelNodeGetParams(n, &kp) == cudaSuccess && cudaFuncGetName(&fname, kp.func) == cudaSuccess &&
      fname != nullptr) {
    return fname;
  }
  cudaGetLastError();
  return "";
}

// Captures fn on stream (not instantiated) and prints its kernel nodes in
// topological order: name and the types of the edges into the node.
template <class F>
void print_graph_edges(cudaStream_t stream, F&& fn) {
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  fn();
  cudaGraph_t g = nullptr;
  CK(cudaStreamEndCapture(stream, &g));
  size_t num_nodes = 0;
  CK(cudaGraphGetNodes(g, nullptr, &num_nodes));
  std::vector<cudaGraphNode_t> nodes(num_nodes);
  CK(cudaGraphGetNodes(g, nodes.data(), &num_nodes));
  const GraphEdges edges = graph_edges(g);
  std::map<cudaGraphNode_t, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
  size_t programmatic = 0;
  for (const auto& e : edges.data) programmatic += e.type == cudaGraphDependencyTypeProgrammatic ? 1 : 0;
  std::printf("graph: %zu nodes, %zu edges, %zu programmatic\n", num_nodes, edges.data.size(), programmatic);
  for (size_t i = 0; i < nodes.size() && i < 40; ++i) {
    std::string name = node_name(nodes[i]);
    if (name.empty()) name = "(kernel, name unknown)";
    std::string in;
    for (size_t e = 0; e < edges.data.size(); ++e) {
      if (edges.to[e] != nodes[i]) continue;
      const cudaGraphEdgeData& d = edges.data[e];
      in += " <- " + std::to_string(index[edges.from[e]]);
      if (d.type == cudaGraphDependencyTypeProgrammatic) {
        in += d.from_port == cudaGraphKernelNodePortProgrammatic ? " (programmatic)" : " (launch completion)";
      }
    }
    std::printf("  node %3zu %.90s%s\n", i, name.c_str(), in.c_str());
  }
  CK(cudaGraphDestroy(g));
}

template <class F>
void pdl_gemm_experiment(cudaStream_t stream, ops::Backend& be, F&& forward, int32_t* ids_dev, int num_ids,
                         int vocab) {
  Tensor logits;
  auto capture = [&](bool programmatic, int& converted) {
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    logits = forward();
    cudaGraph_t g = nullptr;
    CK(cudaStreamEndCapture(stream, &g));
    converted = 0;
    if (programmatic) {
      GraphEdges edges = graph_edges(g);
      for (size_t e = 0; e < edges.data.size(); ++e) {
        cudaGraphNodeType ft{};
        CK(cudaGraphNodeGetType(edges.from[e], &ft));
        if (edges.data[e].type != cudaGraphDependencyTypeDefault || ft != cudaGraphNodeTypeKernel ||
            !node_name(edges.to[e]).empty())
          continue;
        CK(cudaGraphRemoveDependencies(g, &edges.from[e], &edges.to[e], &edges.data[e], 1));
        cudaGraphEdgeData pd{};
        pd.from_port = cudaGraphKernelNodePortProgrammatic;
        pd.type = cudaGraphDependencyTypeProgrammatic;
        CK(cudaGraphAddDependencies(g, &edges.from[e], &edges.to[e], &pd, 1));
        ++converted;
      }
    }
    cudaGraphExec_t exec = nullptr;
    CK(cudaGraphInstantiate(&exec, g, 0));
    CK(cudaGraphDestroy(g));
    return exec;
  };
  int none = 0, converted = 0;
  cudaGraphExec_t plain = capture(false, none);
  cudaGraphExec_t pdl = capture(true, converted);
  const size_t rows = std::min<int64_t>(4, logits.rows());
  const size_t bytes = rows * static_cast<size_t>(logits.row_bytes());
  std::vector<uint8_t> a(bytes), b(bytes);
  std::mt19937 rng(99);
  int mismatches = 0;
  const int replays = 30;
  for (int r = 0; r < replays; ++r) {
    std::vector<int32_t> ids(static_cast<size_t>(num_ids));
    for (auto& v : ids) v = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    be.copy_to_device(ids_dev, ids.data(), ids.size() * 4);
    CK(cudaGraphLaunch(plain, stream));
    CK(cudaStreamSynchronize(stream));
    be.copy_to_host(a.data(), logits.data(), bytes);
    CK(cudaGraphLaunch(pdl, stream));
    CK(cudaStreamSynchronize(stream));
    be.copy_to_host(b.data(), logits.data(), bytes);
    mismatches += a == b ? 0 : 1;
  }
  auto time_ms = [&](cudaGraphExec_t e) {
    std::vector<double> t;
    for (int r = 0; r < 60; ++r) {
      CK(cudaStreamSynchronize(stream));
      const auto t0 = std::chrono::steady_clock::now();
      CK(cudaGraphLaunch(e, stream));
      CK(cudaStreamSynchronize(stream));
      if (r >= 10) t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double t_plain1 = time_ms(plain), t_pdl1 = time_ms(pdl), t_plain2 = time_ms(plain), t_pdl2 = time_ms(pdl);
  std::printf("pdl-gemm: %d edges into cuBLAS nodes made programmatic; %d of %d replays with new ids differ in the "
              "first %zu logits rows; graph replay %.3f / %.3f ms plain, %.3f / %.3f ms programmatic\n",
              converted, mismatches, replays, rows, t_plain1, t_plain2, t_pdl1, t_pdl2);
  CK(cudaGraphExecDestroy(plain));
  CK(cudaGraphExecDestroy(pdl));
}

// KV bytes one --batch x --ctx pair may hold (Llama-3-8B: 128 KiB/token, so
// about 300k tokens, e.g. 128 x 2048 or 512 x 512).
constexpr double kMaxBatchKvBytes = 60e9;

const char* env_or(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : dflt;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  bool decode_only = false;
  std::vector<int> contexts;
  int ttft_reps = 5;
  int ttft_gap_ms = 0;
  std::vector<int> batches;
  double pool_gb = 0;
  bool scatter = false;
  int mixed = 0;
  double ctx_spread = 0;
  bool profile_step = false;
  bool trace = false;
  bool graph_edges = false;
  bool pdl_gemm = false;
  bool fp8 = false;
  std::string kv_cache_dtype = "auto";
  int prompt = 2048;  // TTFT prompt tokens
  // The value of option argv[i] (i advanced past it) if it is an integer in
  // [lo, hi]; otherwise a message and false.
  auto int_arg = [&](int& i, int lo, int hi, int& out) {
    out = std::atoi(argv[++i]);
    if (out >= lo && out <= hi) return true;
    std::fprintf(stderr, "%s: %d..%d\n", argv[i - 1], lo, hi);
    return false;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    int n = 0;
    if (a == "--decode-only") {
      decode_only = true;
    } else if (a == "--pdl-gemm") {
      pdl_gemm = true;
    } else if (a == "--fp8") {
      fp8 = true;
    } else if (a == "--kv-cache-dtype" && has_value) {
      kv_cache_dtype = argv[++i];
    } else if (a == "--graph-edges") {
      graph_edges = true;
    } else if (a == "--profile-step") {
      profile_step = true;
    } else if (a == "--trace") {
      trace = true;
    } else if (a == "--scatter") {
      scatter = true;
    } else if (a == "--ttft-reps" && has_value) {
      if (!int_arg(i, 1, 1000, ttft_reps)) return 2;
    } else if (a == "--prompt" && has_value) {
      if (!int_arg(i, 1, 32768, prompt)) return 2;
    } else if (a == "--ttft-gap-ms" && has_value) {
      if (!int_arg(i, 0, 10000, ttft_gap_ms)) return 2;
    } else if (a == "--batch" && has_value) {
      if (!int_arg(i, 1, 512, n)) return 2;
      batches.push_back(n);
    } else if (a == "--mixed" && has_value) {
      if (!int_arg(i, 1, 8192, mixed)) return 2;
    } else if (a == "--ctx-spread" && has_value) {
      char* end = nullptr;
      const char* v = argv[++i];
      ctx_spread = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(ctx_spread >= 0 && ctx_spread <= 0.95)) {
        std::fprintf(stderr, "--ctx-spread: [0, 0.95]\n");
        return 2;
      }
    } else if (a == "--ctx" && has_value) {
      if (!int_arg(i, 1, 8192, n)) return 2;
      contexts.push_back(n);
    } else if (a == "--pool-gb" && has_value) {
      pool_gb = std::atof(argv[++i]);
      if (!(pool_gb > 0 && pool_gb <= 200)) {
        std::fprintf(stderr, "--pool-gb: (0, 200]\n");
        return 2;
      }
    } else {
      pos.push_back(a);
    }
  }
  const std::string config = pos.size() > 0 ? pos[0] : "llama-3-8b";
  const std::string dtype = pos.size() > 1 ? pos[1] : "bfloat16";
  auto cuda_be = cuda::make_cuda_backend({});
  if (!cuda_be) return 1;
  auto* impl = dynamic_cast<cuda::CudaBackend*>(cuda_be.get());
  ProfilingBackend be(*cuda_be, impl->stream());
  std::printf("device: %s\n", be.name());
  std::printf(
      "env: OSPREY_CUDA_NO_PDL=%s OSPREY_DECODE_ATTENTION=%s OSPREY_DECODE_MIN_KEYS=%s OSPREY_DECODE_MERGE=%s "
      "OSPREY_FUSED_SILU=%s\n",
      env_or("OSPREY_CUDA_NO_PDL", "(unset)"), env_or("OSPREY_DECODE_ATTENTION", "(unset)"),
      env_or("OSPREY_DECODE_MIN_KEYS", "(unset)"), env_or("OSPREY_DECODE_MERGE", "(unset)"),
      env_or("OSPREY_FUSED_SILU", "(unset)"));
  if (std::getenv("OSPREY_BENCH_SKIP") != nullptr)
    std::printf("env: OSPREY_BENCH_SKIP=%s (those ops are left out: times only, outputs wrong)\n",
                std::getenv("OSPREY_BENCH_SKIP"));
  if (contexts.empty()) contexts = {512, 2048, 4096, 8192};
  if (batches.empty()) batches = {1};
  const std::string env_lt = std::string("OSPREY_LT_AUTOTUNE=") + env_or("OSPREY_LT_AUTOTUNE", "(unset)") +
                             " OSPREY_LT_FINE_MAX=" + env_or("OSPREY_LT_FINE_MAX", "(unset)") +
                             " OSPREY_FUSED_RESIDUAL=" + env_or("OSPREY_FUSED_RESIDUAL", "(unset)") +
                             " OSPREY_FUSED_NORM=" + env_or("OSPREY_FUSED_NORM", "(unset)") +
                             " OSPREY_FOLDED_NORM=" + env_or("OSPREY_FOLDED_NORM", "(unset)");
  std::printf("env: %s\n", env_lt.c_str());

  // Copy bandwidth ceiling: 2 GiB device to device, read + write counted.
  double copy_gbs = 0;
  {
    const size_t bytes = size_t{2} << 30;
    void* a = be.alloc(bytes);
    void* b = be.alloc(bytes);
    std::vector<double> t;
    for (int r = 0; r < 12; ++r) {
      be.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, impl->stream()));
      be.synchronize();
      if (r >= 2) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    copy_gbs = 2.0 * static_cast<double>(bytes) / median(t) / 1e9;
    be.free(a);
    be.free(b);
    std::printf("copy d2d 2 GiB: %.0f GB/s (read + write)\n", copy_gbs);
  }

  ModelLoadOptions o;
  o.load_format = "dummy";
  o.dtype = dtype;
  if (fp8) o.quantization = "fp8";
  o.kv_cache_dtype = kv_cache_dtype;
  const auto t_load = std::chrono::steady_clock::now();
  auto model_or = Model::load(config, be, o);
  if (!model_or.ok()) {
    std::fprintf(stderr, "load: %s\n", model_or.status().to_string().c_str());
    return 1;
  }
  Model& model = **model_or;
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const ModelConfig& c = model.config();
  std::printf("model: %s dummy, %s activations, %s KV; %.2f GB of weights, made in %.2f s; KV %zu B/token\n",
              config.c_str(), std::string(dtype_name(model.activation_dtype())).c_str(),
              std::string(dtype_name(model.kv_dtype())).c_str(), static_cast<double>(model.weight_bytes()) / 1e9,
              load_s, model.kv_bytes_per_token());

  const int bs = 16;
  // A (batch, ctx) pair runs unless its KV is over kMaxBatchKvBytes (batch 1 always runs).
  auto runs = [&](int b, int ctx) {
    return b == 1 || static_cast<double>(model.kv_bytes_per_token()) * b * ctx <= kMaxBatchKvBytes;
  };
  // Pages for the largest pair that runs (and the TTFT prompt).
  int kv_pages = (prompt + bs - 1) / bs;
  for (int b : batches)
    for (int ctx : contexts)
      if (runs(b, ctx))
        kv_pages = std::max(kv_pages, b * decode_pages_per_seq(ctx, bs, ctx_spread) + (mixed + bs - 1) / bs);
  const double page_bytes = static_cast<double>(model.kv_bytes_per_token()) * bs;
  const int pool_pages = std::max(kv_pages + 1, static_cast<int>(pool_gb * 1e9 / page_bytes));
  KvCache kv = model.allocate_kv(pool_pages, bs);
  std::printf("KV pool: %d pages of %d tokens (%.2f GB)%s\n", pool_pages, bs, pool_pages * page_bytes / 1e9,
              scatter ? ", batched decode pages scattered at random over it" : "");
  std::vector<int32_t> scattered;  // a random order of the pool's pages (fixed seed)
  if (scatter) {
    scattered.resize(static_cast<size_t>(pool_pages));
    std::iota(scattered.begin(), scattered.end(), 0);
    std::shuffle(scattered.begin(), scattered.end(), std::mt19937(12345));
  }
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  model.reserve(std::max(prompt, max_batch + mixed), max_batch + 1);

  // TTFT: one prompt of `prompt` tokens (forward incl. the last row's logits).
  if (!decode_only) {
    Step s = make_step(be, prompt, prompt, bs, c.vocab_size);
    std::vector<double> t;
    for (int r = 0; r < ttft_reps + 2; ++r) {
      be.synchronize();
      if (ttft_gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ttft_gap_ms));
      const auto t0 = std::chrono::steady_clock::now();
      model.forward(s.fb, kv);
      be.synchronize();
      if (r >= 2) t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    const double flops = 2.0 * static_cast<double>(c.num_parameters()) * prompt;
    if (ttft_reps > 5) {  // the whole series: the SM clock may still be ramping in the first runs
      std::printf("\nTTFT series (ms):");
      for (double v : t) std::printf(" %.2f", v);
      std::printf("\n");
      const std::vector<double> tail(t.end() - 5, t.end());
      std::printf("TTFT, last 5 runs: %.2f ms (median)\n", median(tail));
    }
    const double ms = median(t);
    std::printf("\nTTFT, one %d-token prompt: %.2f ms (%.0f TFLOP/s on 2 x params x tokens)%s\n", prompt, ms,
                flops / (ms * 1e-3) / 1e12,
                ttft_gap_ms > 0 ? (", each after " + std::to_string(ttft_gap_ms) + " ms idle").c_str() : ", back to back");
    be.on = true;
    model.forward(s.fb, kv);
    be.on = false;
    std::printf("prefill breakdown (%d tokens):\n", prompt);
    print_breakdown(be, be.collect(), copy_gbs);
    for (void* p : s.bufs) be.free(p);
  }

  // Batch-1 decode at several contexts (KV beyond the prompt is zeros).
  const double embed_bytes = static_cast<double>(c.vocab_size) * c.hidden_size *
                             static_cast<double>(dtype_row_bytes(model.activation_dtype(), 1));
  for (int batch : batches) {
    std::printf("\nbatch-%d decode%s (bytes/step = weights without the embedding table + KV read):\n", batch,
                mixed > 0 && batch > 1 ? (" + one " + std::to_string(mixed) + "-token prompt").c_str() : "");
    if (ctx_spread > 0 && batch > 1)
      std::printf("  (contexts spread over ctx x [%.2f, %.2f], longest-first order %s)\n", 1 - ctx_spread,
                  1 + ctx_spread, env_or("OSPREY_DECODE_ORDER", "(unset)"));
    std::printf("  %8s %10s %8s %10s %7s\n", "context", "ms/step", "tok/s", "GB/step", "MBU");
    for (int ctx : contexts) {
      if (!runs(batch, ctx)) {
        std::printf("  %8d skipped: KV of %d x %d tokens is over %.0f GB\n", ctx, batch, ctx, kMaxBatchKvBytes / 1e9);
        continue;
      }
      Step s =
          batch == 1 ? make_step(be, 1, ctx, bs, c.vocab_size)
                     : make_decode_batch(be, batch, ctx, bs, c.vocab_size, scattered, mixed, ctx_spread);
      // Median ms of 50 runs of fn after 10 warm-up runs, each drained.
      auto time_ms = [&](const auto& fn) {
        std::vector<double> t;
        for (int r = 0; r < 60; ++r) {
          be.synchronize();
          const auto t0 = std::chrono::steady_clock::now();
          fn();
          be.synchronize();
          if (r >= 10)
            t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        return median(t);
      };
      const double ms = time_ms([&] { model.forward(s.fb, kv); });
      const double bytes = static_cast<double>(model.weight_bytes()) - embed_bytes +
                           static_cast<double>(model.kv_bytes_per_token()) * ctx * batch;
      // The same step captured in a CUDA graph and replayed (no launch gaps).
      double gms = 0;
      std::unique_ptr<ops::Backend::Graph> graph;
      if (cuda_be->supports_graphs()) {
        cuda_be->begin_capture();
        model.forward(s.fb, kv);
        graph = cuda_be->end_capture();
        if (graph) gms = time_ms([&] { graph->launch(); });
      }
      std::printf("  %8d %10.3f %8.1f %10.2f %6.1f%%   graph replay: %.3f ms/step, %.1f tok/s, MBU %.1f%%\n", ctx, ms,
                  1000.0 * batch / ms, bytes / 1e9, 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_gbs, gms,
                  gms > 0 ? 1000.0 * batch / gms : 0, gms > 0 ? 100.0 * bytes / (gms * 1e-3) / 1e9 / copy_gbs : 0);
      if (trace && graph) trace_replays([&] { graph->launch(); }, [&] { be.synchronize(); }, gms);
      if (pdl_gemm) {
        pdl_gemm = false;  // the first pair only
        pdl_gemm_experiment(impl->stream(), be, [&] { return model.forward(s.fb, kv); },
                            const_cast<int32_t*>(s.fb.token_ids), s.fb.attn.num_tokens, c.vocab_size);
      }
      if (graph_edges) {
        graph_edges = false;  // the first pair only
        print_graph_edges(impl->stream(), [&] { model.forward(s.fb, kv); });
      }
      if (profile_step) {
        be.synchronize();
        CK(cudaProfilerStart());
        model.forward(s.fb, kv);
        be.synchronize();
        CK(cudaProfilerStop());
      }
      if (ctx == 2048 || batch > 1) {
        be.set_bytes("paged_attention", static_cast<double>(model.kv_bytes_per_token()) * ctx * batch / c.num_layers);
        be.on = true;
        model.forward(s.fb, kv);
        be.on = false;
        std::printf("decode breakdown at context %d (event-timed, launch gaps excluded):\n", ctx);
        print_breakdown(be, be.collect(), copy_gbs);
      }
      for (void* p : s.bufs) be.free(p);
    }
  }
  model.free_kv(kv);
  return 0;
}
