// Helpers for the GPU tests: random data, quantisers for every weight dtype,
// device buffers owned through the backend, attention steps (host arrays in
// attention_batch.h; their device copy and the kernels' view of it here),
// and error measures (NMSE and max-abs relative to the reference's magnitude).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attention_batch.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/backend.h"

namespace osprey::gpu_test {

// KV slots for n tokens: a seeded shuffle of [0, num_slots) (n <= num_slots),
// with tokens first_skip, first_skip + skip_every, ... skipped (-1).
inline std::vector<int32_t> shuffled_slots(int n, int num_slots, uint32_t seed, int first_skip, int skip_every) {
  std::vector<int32_t> s(static_cast<size_t>(num_slots));
  std::iota(s.begin(), s.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(s.begin(), s.end(), rng);
  s.resize(static_cast<size_t>(n));
  for (int i = first_skip; i < n; i += skip_every) s[static_cast<size_t>(i)] = -1;
  return s;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// I8 pages' codes of rows r = slot * hk + head, hd values each, as the KV
// write stores them: row r (r < lg.size()) holds 10^lg[r] x f[r hd ..]
// (all zeros where r % 23 == 5), quantised by int8_row_quantize into
// codes[r hd ..], its scale at scales[ops::kv_row_scale_index(slot, head,
// hk, bs)]; values, if given, gets code x scale at [r hd ..].
inline void i8_quantize_rows(const std::vector<float>& f, const std::vector<float>& lg, int hd, int hk, int bs,
                             uint8_t* codes, float* scales, float* values = nullptr) {
  std::vector<float> row(static_cast<size_t>(hd));
  for (int64_t r = 0; r < static_cast<int64_t>(lg.size()); ++r) {
    const float m = r % 23 == 5 ? 0.0f : std::pow(10.0f, lg[static_cast<size_t>(r)]);
    for (int d = 0; d < hd; ++d) row[static_cast<size_t>(d)] = m * f[static_cast<size_t>(r * hd + d)];
    int8_t* q = reinterpret_cast<int8_t*>(codes) + r * hd;
    const float sc = int8_row_quantize(row.data(), hd, q);
    scales[ops::kv_row_scale_index(r / hk, r % hk, hk, bs)] = sc;
    if (values != nullptr) {
      for (int d = 0; d < hd; ++d) values[r * hd + d] = static_cast<float>(q[d]) * sc;
    }
  }
}

// 16-bit values of v (each rounded once), those values back as floats, and
// the round trip: bf16 (to_bf16 / from_bf16 / round_bf16) and f16
// (to_f16 / from_f16 / round_f16).
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}
inline std::vector<float> round_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }
inline std::vector<uint16_t> to_f16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_fp16(v[i]);
  return out;
}
inline std::vector<float> from_f16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = fp16_to_f32(v[i]);
  return out;
}
inline std::vector<float> round_f16(const std::vector<float>& v) { return from_f16(to_f16(v)); }

// Packs rows x cols floats as dtype t (GGUF-style quantisers; cols % 32 == 0
// for the quantised types).
inline std::vector<uint8_t> pack(DType t, const std::vector<float>& src, int64_t rows, int64_t cols) {
  const int64_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<uint8_t> out(static_cast<size_t>(row_bytes * rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, src.data() + r * cols, out.data() + r * row_bytes, cols);
  return out;
}

// Dequantises packed rows with the portable core reference, as doubles.
inline std::vector<double> unpack(DType t, const std::vector<uint8_t>& packed, int64_t rows, int64_t cols) {
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t, packed.data() + r * dtype_row_bytes(t, cols), row.data(), cols);
    std::copy(row.begin(), row.end(), out.begin() + r * cols);
  }
  return out;
}

// Device memory from the backend, freed on destruction.
class DeviceMem {
 public:
  DeviceMem(ops::Backend& be, size_t bytes) : be_(&be), bytes_(bytes), p_(be.alloc(bytes)) {
    EXPECT_NE(p_, nullptr) << "device alloc of " << bytes << " bytes failed";
  }
  ~DeviceMem() {
    if (p_) be_->free(p_);
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  DeviceMem(DeviceMem&& o) noexcept : be_(o.be_), bytes_(o.bytes_), p_(std::exchange(o.p_, nullptr)) {}

  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  ops::Backend* be_;
  size_t bytes_;
  void* p_;
};

template <class T>
DeviceMem upload(ops::Backend& be, const std::vector<T>& v) {
  DeviceMem m(be, std::max<size_t>(1, v.size() * sizeof(T)));
  be.copy_to_device(m.get(), v.data(), v.size() * sizeof(T));
  return m;
}

inline DeviceMem upload_bytes(ops::Backend& be, const void* p, size_t bytes) {
  DeviceMem m(be, std::max<size_t>(1, bytes));
  be.copy_to_device(m.get(), p, bytes);
  return m;
}

template <class T>
std::vector<T> download(ops::Backend& be, const DeviceMem& m, size_t count) {
  std::vector<T> v(count);
  be.copy_to_host(v.data(), m.get(), count * sizeof(T));
  return v;
}

// The arrays of a HostAttentionBatch copied to `be`'s device; `b` points at them.
struct DeviceAttentionBatch {
  DeviceMem q_indptr, kv_lens, block_indptr, block_indices, positions, slots;
  ops::AttentionBatch b;
  DeviceAttentionBatch(ops::Backend& be, const HostAttentionBatch& h)
      : q_indptr(upload(be, h.q_indptr)),
        kv_lens(upload(be, h.kv_lens)),
        block_indptr(upload(be, h.block_indptr)),
        block_indices(upload(be, h.block_indices)),
        positions(upload(be, h.positions)),
        slots(upload(be, h.slots)),
        b(h.sizes()) {
    b.q_indptr = q_indptr.as<int32_t>();
    b.kv_lens = kv_lens.as<int32_t>();
    b.block_indptr = block_indptr.as<int32_t>();
    b.block_indices = block_indices.as<int32_t>();
    b.positions = positions.as<int32_t>();
    b.slot_mapping = slots.as<int32_t>();
  }
};

// The kernels' arguments with the batch fields of `b` (counts, maxima and
// the arrays but slot_mapping) set; the caller sets the rest (tensors,
// heads, page pool, scale, window).
inline cuda::PagedAttentionArgs paged_attention_args(const ops::AttentionBatch& b) {
  cuda::PagedAttentionArgs a;
  a.num_seqs = b.num_seqs;
  a.num_tokens = b.num_tokens;
  a.max_q_len = b.max_q_len;
  a.max_kv_len = b.max_kv_len;
  a.q_indptr = b.q_indptr;
  a.kv_lens = b.kv_lens;
  a.block_indptr = b.block_indptr;
  a.block_indices = b.block_indices;
  a.positions = b.positions;
  return a;
}

// Error of got against ref: NMSE = sum (got - ref)^2 / sum ref^2, and the
// largest |got - ref| relative to max |ref|. NaN anywhere makes both infinite.
struct ErrorStats {
  double nmse = 0.0;
  double max_rel = 0.0;
};

template <class G, class R>
ErrorStats error_stats(const G* got, const R* ref, size_t n) {
  double num = 0.0, den = 0.0, max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    const double d = g - r;
    if (!std::isfinite(g) || !std::isfinite(r)) return {INFINITY, INFINITY};
    num += d * d;
    den += r * r;
    max_diff = std::max(max_diff, std::fabs(d));
    max_ref = std::max(max_ref, std::fabs(r));
  }
  ErrorStats s;
  s.nmse = den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
  s.max_rel = max_ref > 0 ? max_diff / max_ref : (max_diff > 0 ? INFINITY : 0.0);
  return s;
}

template <class G, class R>
void expect_close(const std::vector<G>& got, const std::vector<R>& ref, double max_nmse, double max_rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const ErrorStats s = error_stats(got.data(), ref.data(), got.size());
  EXPECT_LE(s.nmse, max_nmse) << what << " (max rel " << s.max_rel << ")";
  EXPECT_LE(s.max_rel, max_rel) << what << " (nmse " << s.nmse << ")";
}

// Base fixture: a CUDA backend and the CPU reference backend. Fails (never
// skips) when no GPU is present: this binary exists to run on one.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(cuda::device_count(), 0) << "no CUDA device: the GPU tests need one";
    gpu_ = cuda::make_cuda_backend(gpu_options());
    ASSERT_NE(gpu_, nullptr);
    cpu_ = ops::make_cpu_backend(2);
  }
  virtual cuda::CudaBackendOptions gpu_options() const { return {}; }

  ops::Backend& gpu() { return *gpu_; }
  ops::Backend& cpu() { return *cpu_; }

  std::unique_ptr<ops::Backend> gpu_;
  std::unique_ptr<ops::Backend> cpu_;
};

inline Tensor dev_tensor(const DeviceMem& m, DType t, std::initializer_list<int64_t> shape) {
  return Tensor(m.get(), t, shape, Device::kCuda);
}

// A decode chain's ops run three ways on the same inputs: `chain(true)`
// drains the stream after each op (the expected BF16 residual bytes, read
// by `read()`: all finite and different from the start `x0`), then three
// times `chain(false)` queued and three replays of one CUDA graph of it,
// `reset()` before every run. Each run must give the serialised bytes.
template <class Reset, class Chain, class Read>
void expect_chain_queued_and_graph_equal_serialised(ops::Backend& gpu, Reset reset, Chain chain, Read read,
                                                    const std::vector<uint16_t>& x0, const std::string& what) {
  reset();
  chain(true);
  const std::vector<uint16_t> want = read();
  int finite = 0;
  for (uint16_t v : want) finite += std::isfinite(bf16_to_f32(v)) ? 1 : 0;
  ASSERT_EQ(finite, static_cast<int>(want.size())) << what << "the serialised chain must give finite values";
  ASSERT_NE(want, x0) << what << "the chain must change the residual";
  for (int rep = 0; rep < 3; ++rep) {
    reset();
    chain(false);
    EXPECT_EQ(read(), want) << what << "queued run " << rep;
  }
  reset();
  gpu.begin_capture();
  chain(false);
  auto graph = gpu.end_capture();
  ASSERT_NE(graph, nullptr) << what;
  for (int rep = 0; rep < 3; ++rep) {
    reset();
    graph->launch();
    EXPECT_EQ(read(), want) << what << "graph replay " << rep;
  }
}

}  // namespace osprey::gpu_test
