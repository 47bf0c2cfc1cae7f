#include "ops/profiling_backend.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace osprey::ops {

namespace {

const char* const kPhaseNames[] = {"prefill", "decode", "other"};

int64_t triangle(int64_t x) {
  return x * (x + 1) / 2;
}  // 1 + 2 + ... + x

double nbytes(const Tensor& t) {
  return t.defined() ? static_cast<double>(t.nbytes()) : 0.0;
}

// Bytes of one token's K and V in one layer's pages.
double kv_bytes_per_position(const LayerKv& kv) {
  if (!kv.k.defined() || kv.k.ndim() < 2) return 0.0;
  const double positions = static_cast<double>(kv.k.dim(0)) * static_cast<double>(kv.k.dim(1));
  return positions > 0 ? (nbytes(kv.k) + nbytes(kv.v)) / positions : 0.0;
}

}  // namespace

int64_t attended_pairs(int64_t q_len, int64_t kv_len, int window) {
  q_len = std::min(q_len, kv_len);
  if (q_len <= 0) return 0;
  const int64_t a = kv_len - q_len, b = kv_len - 1;  // positions of the query tokens
  if (window <= 0) return triangle(b + 1) - triangle(a);
  const int64_t w = window;
  const int64_t c = std::min(b, w - 1);  // positions p <= w - 1 attend to p + 1 positions
  int64_t sum = c >= a ? triangle(c + 1) - triangle(a) : 0;
  const int64_t lo = std::max(a, w);  // the others to w
  if (b >= lo) sum += (b - lo + 1) * w;
  return sum;
}

int64_t kv_positions_read(int64_t q_len, int64_t kv_len, int window) {
  q_len = std::min(q_len, kv_len);
  if (q_len <= 0) return 0;
  if (window <= 0) return kv_len;
  const int64_t first = std::max<int64_t>(0, kv_len - q_len - window + 1);
  return kv_len - first;
}

Ceilings measure_ceilings(Backend& be) {
  Ceilings c;
  const bool host = be.device() == Device::kCpu;
  be.synchronize();
  // Copy: read + write bytes over the best of several timed copies.
  {
    const size_t bytes = host ? size_t{256} << 20 : size_t{1} << 30;
    void* src = be.alloc(bytes);
    void* dst = src ? be.alloc(bytes) : nullptr;
    if (src && dst) {
      be.copy_device_to_device(dst, src, bytes);  // warm-up (first touch of the pages)
      double best = std::numeric_limits<double>::infinity();
      for (int r = 0; r < (host ? 3 : 5); ++r) {
        const uint64_t m0 = be.timer_mark();
        be.copy_device_to_device(dst, src, bytes);
        const uint64_t m1 = be.timer_mark();
        const double ms = be.timer_elapsed_ms(m0, m1);
        if (ms > 0) best = std::min(best, ms);
      }
      if (best < std::numeric_limits<double>::infinity())
        c.copy_gbs = 2.0 * static_cast<double>(bytes) / (best * 1e-3) / 1e9;
    }
    if (dst) be.free(dst);
    if (src) be.free(src);
  }
  // GEMM: out[n, m] = x[n, k] @ w[m, k]^T at the default activation dtype.
  {
    const DType t = be.default_activation_dtype();
    const int64_t n = host ? 256 : 4096, m = host ? 1024 : 4096, k = host ? 1024 : 4096;
    const size_t es = static_cast<size_t>(dtype_row_bytes(t, 1));
    void* x = be.alloc(static_cast<size_t>(n * k) * es);
    void* w = be.alloc(static_cast<size_t>(m * k) * es);
    void* o = be.alloc(static_cast<size_t>(n * m) * es);
    if (x && w && o) {
      Tensor tx(x, t, {n, k}, be.device()), tw(w, t, {m, k}, be.device()), to(o, t, {n, m}, be.device());
      be.fill_uniform(tx, 1, -1.0f, 1.0f);
      be.fill_uniform(tw, 2, -1.0f, 1.0f);
      be.matmul(tx, tw, Tensor(), to);  // warm-up (plans, workspaces)
      double best = std::numeric_limits<double>::infinity();
      for (int r = 0; r < (host ? 3 : 10); ++r) {
        const uint64_t m0 = be.timer_mark();
        be.matmul(tx, tw, Tensor(), to);
        const uint64_t m1 = be.timer_mark();
        const double ms = be.timer_elapsed_ms(m0, m1);
        if (ms > 0) best = std::min(best, ms);
      }
      if (best < std::numeric_limits<double>::infinity()) {
        c.gemm_tflops =
            2.0 * static_cast<double>(n) * static_cast<double>(m) * static_cast<double>(k) / (best * 1e-3) / 1e12;
        c.gemm_shape =
            std::string(dtype_name(t)) + " " + std::to_string(n) + "x" + std::to_string(m) + "x" + std::to_string(k);
      }
    }
    be.synchronize();
    if (o) be.free(o);
    if (w) be.free(w);
    if (x) be.free(x);
  }
  return c;
}

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {
  pending_.reserve(kMaxPending);
}

ProfilingBackend::~ProfilingBackend() = default;

void ProfilingBackend::begin_step(const ProfileStep& s) {
  in_step_ = enabled_.load(std::memory_order_relaxed);
  pending_.clear();
  q_lens_.clear();
  kv_lens_.clear();
  if (!in_step_) return;
  phase_ = s.num_tokens <= 0 ? kOther : s.num_tokens > s.num_seqs ? kPrefill : kDecode;
  if (s.num_seqs > 0 && s.q_indptr.size() >= static_cast<size_t>(s.num_seqs) + 1 &&
      s.kv_lens.size() >= static_cast<size_t>(s.num_seqs)) {
    for (int i = 0; i < s.num_seqs; ++i) {
      q_lens_.push_back(s.q_indptr[static_cast<size_t>(i) + 1] - s.q_indptr[static_cast<size_t>(i)]);
      kv_lens_.push_back(s.kv_lens[static_cast<size_t>(i)]);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++steps_[phase_];
}

void ProfilingBackend::end_step() {
  if (!in_step_) return;
  in_step_ = false;
  // Timer reads may wait for the device: done before taking the lock.
  for (Pending& p : pending_) p.ms = inner_->timer_elapsed_ms(p.begin, p.end);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Pending& p : pending_) {
    if (p.ms < 0) {
      ++untimed_;  // the mark was no longer held
      continue;
    }
    ProfileGroup& g = groups_[static_cast<size_t>(p.group)];
    g.calls += 1;
    g.total_ms += p.ms;
    g.bytes += p.bytes;
    g.flops += p.flops;
  }
  pending_.clear();
}

ProfileSnapshot ProfilingBackend::snapshot() const {
  ProfileSnapshot s;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const ProfileGroup& g : groups_)
    if (g.calls > 0) s.groups.push_back(g);
  auto phase_rank = [](const std::string& p) {
    for (int i = 0; i < kNumPhases; ++i)
      if (p == kPhaseNames[i]) return i;
    return static_cast<int>(kNumPhases);
  };
  std::sort(s.groups.begin(), s.groups.end(), [&](const ProfileGroup& a, const ProfileGroup& b) {
    const int pa = phase_rank(a.phase), pb = phase_rank(b.phase);
    if (pa != pb) return pa < pb;
    if (a.total_ms != b.total_ms) return a.total_ms > b.total_ms;
    return a.group < b.group;
  });
  s.prefill_steps = steps_[kPrefill];
  s.decode_steps = steps_[kDecode];
  s.other_steps = steps_[kOther];
  s.untimed_calls = untimed_;
  s.ceilings = ceilings_;
  return s;
}

void ProfilingBackend::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (ProfileGroup& g : groups_) {
    g.calls = 0;
    g.total_ms = g.bytes = g.flops = 0;
  }
  for (int64_t& n : steps_) n = 0;
  untimed_ = 0;
}

void ProfilingBackend::set_ceilings(const Ceilings& c) {
  std::lock_guard<std::mutex> lock(mutex_);
  ceilings_ = c;
}

int ProfilingBackend::group_index(const char* label) {
  key_.assign(kPhaseNames[phase_]);
  key_.push_back('|');
  key_.append(label);
  auto it = index_.find(key_);
  if (it != index_.end()) return it->second;
  const int i = static_cast<int>(groups_.size());
  ProfileGroup g;
  g.phase = kPhaseNames[phase_];
  g.group = label;
  groups_.push_back(std::move(g));
  index_.emplace(key_, i);
  return i;
}

template <class F>
void ProfilingBackend::timed(const char* label, double bytes, double flops, F&& fn) {
  if (!recording()) {
    fn();
    return;
  }
  if (pending_.size() >= kMaxPending) {
    fn();
    std::lock_guard<std::mutex> lock(mutex_);
    ++untimed_;
    return;
  }
  Pending p;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    p.group = group_index(label);
  }
  p.bytes = bytes;
  p.flops = flops;
  p.begin = inner_->timer_mark();
  fn();
  p.end = inner_->timer_mark();
  pending_.push_back(p);
}

void ProfilingBackend::embedding(const Tensor& table, const int32_t* ids, Tensor& out) {
  const double bytes = nbytes(out) + static_cast<double>(out.rows()) * static_cast<double>(table.row_bytes());
  timed("embedding", bytes, 0, [&] { inner_->embedding(table, ids, out); });
}

void ProfilingBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  timed("rms_norm", nbytes(x) + nbytes(w) + nbytes(out), 0, [&] { inner_->rms_norm(x, w, eps, out); });
}

void ProfilingBackend::add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  const double bytes = 2 * nbytes(residual) + nbytes(x) + nbytes(w) + nbytes(out);
  timed("add_rms_norm", bytes, 0, [&] { inner_->add_rms_norm(residual, x, w, eps, out); });
}

void ProfilingBackend::add(Tensor& x, const Tensor& y) {
  timed("add", 2 * nbytes(x) + nbytes(y), 0, [&] { inner_->add(x, y); });
}

const char* ProfilingBackend::matmul_label(const char* op, const Tensor& w) {
  if (recording()) {
    std::snprintf(label_buf_, sizeof label_buf_, "%s %lldx%lld %s", op, static_cast<long long>(w.rows()),
                  static_cast<long long>(w.cols()), std::string(dtype_name(w.dtype())).c_str());
  }
  return label_buf_;
}

namespace {

// 2 * n * m * k for x [n, k] times w [m, k]^T.
double matmul_flops(const Tensor& x, const Tensor& w) {
  return 2.0 * static_cast<double>(x.rows()) * static_cast<double>(w.rows()) * static_cast<double>(w.cols());
}

}  // namespace

void ProfilingBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  const char* label = matmul_label("matmul", w);
  const double flops = matmul_flops(x, w);
  const double bytes = nbytes(w) + nbytes(x) + nbytes(out) + nbytes(bias);
  timed(label, bytes, flops, [&] { inner_->matmul(x, w, bias, out); });
}

void ProfilingBackend::matmul_add(const Tensor& x, const Tensor& w, Tensor& residual, Tensor& scratch) {
  const char* label = matmul_label("matmul+add", w);
  const double bytes = nbytes(w) + nbytes(x) + 2 * nbytes(residual);
  timed(label, bytes, matmul_flops(x, w), [&] { inner_->matmul_add(x, w, residual, scratch); });
}

void ProfilingBackend::rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                                       const Tensor& bias, Tensor& normed, Tensor& out) {
  const char* label = matmul_label("rms_norm+matmul", w);
  const double bytes = nbytes(w) + nbytes(x) + nbytes(norm_w) + nbytes(out) + nbytes(bias);
  timed(label, bytes, matmul_flops(x, w), [&] { inner_->rms_norm_matmul(x, norm_w, eps, w, bias, normed, out); });
}

void ProfilingBackend::rms_norm_matmul_silu_mul(const Tensor& x, const Tensor& norm_w, float eps,
                                                const Tensor& w_gate_up, Tensor& normed, Tensor& gate_up,
                                                Tensor& out) {
  const char* label = matmul_label("rms_norm+matmul+silu_mul", w_gate_up);
  const double bytes = nbytes(w_gate_up) + nbytes(x) + nbytes(norm_w) + nbytes(out);
  timed(label, bytes, matmul_flops(x, w_gate_up),
        [&] { inner_->rms_norm_matmul_silu_mul(x, norm_w, eps, w_gate_up, normed, gate_up, out); });
}

void ProfilingBackend::head_rms_norm(Tensor& x, const Tensor& w, float eps) {
  timed("head_rms_norm", 2 * nbytes(x) + nbytes(w), 0, [&] { inner_->head_rms_norm(x, w, eps); });
}

void ProfilingBackend::rope(Tensor& q, Tensor& k, const int32_t* positions, const RopeTable& table) {
  timed("rope", 2 * (nbytes(q) + nbytes(k)), 0, [&] { inner_->rope(q, k, positions, table); });
}

void ProfilingBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  timed("silu_mul", nbytes(gate_up) + nbytes(out), 0, [&] { inner_->silu_mul(gate_up, out); });
}

void ProfilingBackend::kv_write(const Tensor& k, const Tensor& v, const AttentionBatch& batch, LayerKv& kv) {
  const double written = static_cast<double>(k.rows() > 0 ? k.dim(0) : 0) * kv_bytes_per_position(kv);
  timed("kv_write", nbytes(k) + nbytes(v) + written, 0, [&] { inner_->kv_write(k, v, batch, kv); });
}

void ProfilingBackend::paged_attention(const Tensor& q, const LayerKv& kv, const AttentionBatch& batch, float scale,
                                       int sliding_window, Tensor& out) {
  double bytes = nbytes(q) + nbytes(out), flops = 0;
  if (recording() && q.ndim() >= 1 && q.dim(0) > 0) {
    const double q_width = static_cast<double>(q.numel()) / static_cast<double>(q.dim(0));  // heads * head_dim
    int64_t pairs = 0, positions = 0;
    for (size_t s = 0; s < q_lens_.size(); ++s) {
      pairs += attended_pairs(q_lens_[s], kv_lens_[s], sliding_window);
      positions += kv_positions_read(q_lens_[s], kv_lens_[s], sliding_window);
    }
    bytes += static_cast<double>(positions) * kv_bytes_per_position(kv);
    flops = 4.0 * q_width * static_cast<double>(pairs);
  }
  timed("attention", bytes, flops, [&] { inner_->paged_attention(q, kv, batch, scale, sliding_window, out); });
}

void ProfilingBackend::gather_rows(const Tensor& x, const int32_t* rows, int num_rows, Tensor& out) {
  timed("gather_rows", 2 * nbytes(out), 0, [&] { inner_->gather_rows(x, rows, num_rows, out); });
}

void ProfilingBackend::fill_rows_from(const Tensor& x, const int32_t* src_rows, int num_rows, Tensor& out) {
  // At most every row read and written, plus the index array.
  const double bytes = 2.0 * static_cast<double>(num_rows) * static_cast<double>(out.row_bytes()) + 4.0 * num_rows;
  timed("fill_rows_from", bytes, 0, [&] { inner_->fill_rows_from(x, src_rows, num_rows, out); });
}

void ProfilingBackend::convert(const Tensor& src, Tensor& dst) {
  timed("convert", nbytes(src) + nbytes(dst), 0, [&] { inner_->convert(src, dst); });
}

void ProfilingBackend::fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) {
  timed("fill_uniform", nbytes(t), 0, [&] { inner_->fill_uniform(t, seed, lo, hi); });
}

void ProfilingBackend::qkv_rope_kv_write(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                         const RopeTable& rope, const AttentionBatch& batch, LayerKv& kv,
                                         Tensor& q_out) {
  const double written = static_cast<double>(qkv.rows()) * kv_bytes_per_position(kv);
  timed("qkv_rope_kv_write", nbytes(qkv) + nbytes(q_out) + written, 0,
        [&] { inner_->qkv_rope_kv_write(qkv, q_norm, k_norm, eps, rope, batch, kv, q_out); });
}

void ProfilingBackend::rms_scaled_qkv_rope_kv_write(const Tensor& x, float x_eps, const Tensor& qkv,
                                                    const Tensor& qkv_bias, const Tensor& q_norm,
                                                    const Tensor& k_norm, float eps, const RopeTable& rope,
                                                    const AttentionBatch& batch, LayerKv& kv, Tensor& q_out) {
  const double written = static_cast<double>(qkv.rows()) * kv_bytes_per_position(kv);
  timed("rms_scale+qkv_rope_kv_write", nbytes(x) + nbytes(qkv) + nbytes(qkv_bias) + nbytes(q_out) + written, 0, [&] {
    inner_->rms_scaled_qkv_rope_kv_write(x, x_eps, qkv, qkv_bias, q_norm, k_norm, eps, rope, batch, kv, q_out);
  });
}

void ProfilingBackend::rms_scaled_silu_mul(const Tensor& x, float x_eps, const Tensor& gate_up, Tensor& out) {
  timed("rms_scale+silu_mul", nbytes(x) + nbytes(gate_up) + nbytes(out), 0,
        [&] { inner_->rms_scaled_silu_mul(x, x_eps, gate_up, out); });
}

void ProfilingBackend::copy_to_device_async(void* dst, const void* src, size_t bytes) {
  timed("copy to device", static_cast<double>(bytes), 0, [&] { inner_->copy_to_device_async(dst, src, bytes); });
}

void ProfilingBackend::copy_to_host_async(void* dst, const void* src, size_t bytes) {
  timed("copy to host", static_cast<double>(bytes), 0, [&] { inner_->copy_to_host_async(dst, src, bytes); });
}

void ProfilingBackend::copy_device_to_device(void* dst, const void* src, size_t bytes) {
  timed("copy device to device", 2.0 * static_cast<double>(bytes), 0,
        [&] { inner_->copy_device_to_device(dst, src, bytes); });
}

void ProfilingBackend::sample(const SampleBatch& batch) {
  const double bytes = static_cast<double>(batch.num_rows) * static_cast<double>(batch.vocab) * sizeof(float);
  timed("sample", bytes, 0, [&] { inner_->sample(batch); });
}

void ProfilingBackend::begin_capture() {
  capturing_ = true;
  inner_->begin_capture();
}

std::unique_ptr<Backend::Graph> ProfilingBackend::end_capture() {
  capturing_ = false;
  return inner_->end_capture();
}

}  // namespace osprey::ops
