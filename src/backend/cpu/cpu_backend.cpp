// CpuBackend: construction, memory, and the row-wise ops (embedding, norms,
// add, rope, silu_mul, gather). Matmul is in cpu_matmul.cpp, attention and KV
// writes in cpu_attention.cpp.
#include "backend/cpu/cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "ops/uniform_hash.h"

namespace osprey::cpu {
namespace {

constexpr int kScratchSlots = 2;

void check_f32(const Tensor& t, const char* what) {
  OSP_CHECK_MSG(t.dtype() == DType::kF32, what << " must be F32, got " << dtype_name(t.dtype()));
  OSP_CHECK_MSG(t.device() == Device::kCpu, what << " must be in host memory");
}

const CpuKernels* pick_kernels(Isa isa) {
  if (isa == Isa::kScalar) return &scalar_kernels();
  if (isa == Isa::kAuto || isa == Isa::kAvx512) {
    if (const CpuKernels* k = avx512_kernels()) return k;
  }
  if (const CpuKernels* k = avx2_kernels()) return k;
  return &scalar_kernels();
}

}  // namespace

float* CpuBackend::Scratch::get(size_t floats) {
  if (floats > capacity) {
    std::free(data);
    const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    data = static_cast<float*>(std::aligned_alloc(64, bytes));
    OSP_CHECK_MSG(data != nullptr, "out of memory for " << bytes << " bytes of CPU scratch");
    capacity = bytes / sizeof(float);
  }
  return data;
}

CpuBackend::Scratch::~Scratch() {
  std::free(data);
}

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : kernels_(pick_kernels(options.isa)),
      pool_(options.num_threads, options.spin_us),
      name_(kernels_ == &scalar_kernels() ? "cpu-scalar"
            : kernels_ == avx2_kernels()  ? "cpu-avx2"
                                          : "cpu-avx512") {
  if (options.quantize_activations) q8_ = q8_kernels_for(kernels_);
  scratch_.reserve(static_cast<size_t>(pool_.num_threads()));
  for (int i = 0; i < pool_.num_threads(); ++i) scratch_.emplace_back(new Scratch[kScratchSlots]);
}

CpuBackend::~CpuBackend() = default;

CpuBackend::Scratch& CpuBackend::thread_scratch(int slot) {
  const int t = ThreadPool::thread_index();
  OSP_CHECK(t >= 0 && t < static_cast<int>(scratch_.size()) && slot < kScratchSlots);
  return scratch_[static_cast<size_t>(t)][slot];
}

std::unique_ptr<CpuBackend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

// ---- memory -------------------------------------------------------------------

void* CpuBackend::alloc(size_t bytes) {
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (p != nullptr) std::memset(p, 0, rounded);
  return p;
}

void CpuBackend::free(void* p) {
  std::free(p);
}

void CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

// ---- row-wise ops -------------------------------------------------------------

void CpuBackend::embedding(const Tensor& table, const int32_t* ids, Tensor& out) {
  check_f32(out, "embedding out");
  OSP_CHECK_EQ(table.ndim(), 2);
  const int64_t vocab = table.dim(0);
  const int64_t d = table.dim(1);
  OSP_CHECK_EQ(out.cols(), d);
  const int64_t n = out.rows();
  WeightFormat f;
  OSP_CHECK_MSG(weight_format_of(table.dtype(), &f), "embedding: unsupported dtype " << dtype_name(table.dtype()));
  const int64_t row_bytes = table.row_bytes();
  for (int64_t i = 0; i < n; ++i)
    OSP_CHECK_MSG(ids[i] >= 0 && ids[i] < vocab, "token id " << ids[i] << " out of range");
  const DequantRowsFn dq = kernels_->dequant[static_cast<int>(f)];
  float* o = out.data_as<float>();
  for_range(n, d, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dq(static_cast<const char*>(table.data()) + ids[i] * row_bytes, 0, d, 1, o + i * d);
  });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  check_f32(x, "rms_norm x");
  check_f32(w, "rms_norm w");
  check_f32(out, "rms_norm out");
  const int64_t d = x.cols();
  const int64_t n = x.rows();
  OSP_CHECK_EQ(w.numel(), d);
  OSP_CHECK_EQ(out.numel(), x.numel());
  const float* xp = x.data_as<float>();
  const float* wp = w.data_as<float>();
  float* op = out.data_as<float>();
  const CpuKernels& k = *kernels_;
  for_range(n, d, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float var = k.sum_sq(xp + i * d, d) / static_cast<float>(d);
      const float r = 1.0f / std::sqrt(var + eps);
      k.scale_mul(xp + i * d, r, wp, op + i * d, d);
    }
  });
}

void CpuBackend::add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  check_f32(residual, "add_rms_norm residual");
  check_f32(x, "add_rms_norm x");
  check_f32(w, "add_rms_norm w");
  check_f32(out, "add_rms_norm out");
  const int64_t d = residual.cols();
  const int64_t n = residual.rows();
  OSP_CHECK_EQ(x.numel(), residual.numel());
  OSP_CHECK_EQ(out.numel(), residual.numel());
  OSP_CHECK_EQ(w.numel(), d);
  float* rp = residual.data_as<float>();
  const float* xp = x.data_as<float>();
  const float* wp = w.data_as<float>();
  float* op = out.data_as<float>();
  const CpuKernels& k = *kernels_;
  for_range(n, 2 * d, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      k.add(rp + i * d, xp + i * d, d);
      const float var = k.sum_sq(rp + i * d, d) / static_cast<float>(d);
      const float r = 1.0f / std::sqrt(var + eps);
      k.scale_mul(rp + i * d, r, wp, op + i * d, d);
    }
  });
}

void CpuBackend::add(Tensor& x, const Tensor& y) {
  check_f32(x, "add x");
  check_f32(y, "add y");
  OSP_CHECK_EQ(x.numel(), y.numel());
  float* xp = x.data_as<float>();
  const float* yp = y.data_as<float>();
  const int64_t d = x.cols();
  const CpuKernels& k = *kernels_;
  for_range(x.rows(), d, [&](int64_t b, int64_t e) { k.add(xp + b * d, yp + b * d, (e - b) * d); });
}

void CpuBackend::head_rms_norm(Tensor& x, const Tensor& w, float eps) {
  check_f32(x, "head_rms_norm x");
  check_f32(w, "head_rms_norm w");
  const int64_t hd = x.cols();
  OSP_CHECK_EQ(w.numel(), hd);
  float* xp = x.data_as<float>();
  const float* wp = w.data_as<float>();
  const CpuKernels& k = *kernels_;
  for_range(x.rows(), hd, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* row = xp + i * hd;
      const float var = k.sum_sq(row, hd) / static_cast<float>(hd);
      k.scale_mul(row, 1.0f / std::sqrt(var + eps), wp, row, hd);
    }
  });
}

void CpuBackend::rope(Tensor& q, Tensor& k, const int32_t* positions, const ops::RopeTable& table) {
  check_f32(q, "rope q");
  check_f32(k, "rope k");
  OSP_CHECK_EQ(q.ndim(), 3);
  OSP_CHECK_EQ(k.ndim(), 3);
  const int64_t n = q.dim(0);
  OSP_CHECK_EQ(k.dim(0), n);
  const int64_t hd = q.dim(2);
  OSP_CHECK_EQ(k.dim(2), hd);
  const int rd = table.rotary_dim;
  OSP_CHECK(rd > 0 && rd % 2 == 0 && rd <= hd && table.inv_freq != nullptr);
  const int half = rd / 2;
  const int64_t hq = q.dim(1);
  const int64_t hk = k.dim(1);
  float* qp = q.data_as<float>();
  float* kp = k.data_as<float>();
  const float scaling = table.attention_scaling;
  for_range(n, (hq + hk) * rd * 2, [&](int64_t b, int64_t e) {
    // cs[0, half) = cos, cs[half, rd) = sin, for one token.
    float* cs = thread_scratch(1).get(static_cast<size_t>(rd));
    for (int64_t t = b; t < e; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int i = 0; i < half; ++i) {
        const float freq = pos * table.inv_freq[i];  // fp32 product, as torch does
        cs[i] = std::cos(freq) * scaling;
        cs[half + i] = std::sin(freq) * scaling;
      }
      auto rotate = [&](float* head) {
        for (int i = 0; i < half; ++i) {
          const float x1 = head[i];
          const float x2 = head[i + half];
          // q * cos + rotate_half(q) * sin, each product rounded separately.
          const float a1 = x1 * cs[i];
          const float b1 = x2 * cs[half + i];
          const float a2 = x2 * cs[i];
          const float b2 = x1 * cs[half + i];
          head[i] = a1 - b1;
          head[i + half] = a2 + b2;
        }
      };
      for (int64_t h = 0; h < hq; ++h) rotate(qp + (t * hq + h) * hd);
      for (int64_t h = 0; h < hk; ++h) rotate(kp + (t * hk + h) * hd);
    }
  });
}

void CpuBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  check_f32(gate_up, "silu_mul gate_up");
  check_f32(out, "silu_mul out");
  const int64_t f = out.cols();
  const int64_t n = out.rows();
  OSP_CHECK_EQ(gate_up.cols(), 2 * f);
  OSP_CHECK_EQ(gate_up.rows(), n);
  const float* g = gate_up.data_as<float>();
  float* o = out.data_as<float>();
  const CpuKernels& k = *kernels_;
  for_range(n, 8 * f, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) k.silu_mul(g + i * 2 * f, g + i * 2 * f + f, o + i * f, f);
  });
}

void CpuBackend::gather_rows(const Tensor& x, const int32_t* rows, int num_rows, Tensor& out) {
  OSP_CHECK(x.dtype() == out.dtype());
  OSP_CHECK_EQ(x.cols(), out.cols());
  OSP_CHECK_GE(out.rows(), num_rows);
  const int64_t rb = x.row_bytes();
  const int64_t n = x.rows();
  for (int r = 0; r < num_rows; ++r) {
    OSP_CHECK_MSG(rows[r] >= 0 && rows[r] < n, "gather_rows: row " << rows[r] << " out of range " << n);
    std::memcpy(out.row(r), x.row(rows[r]), static_cast<size_t>(rb));
  }
}

void CpuBackend::fill_rows_from(const Tensor& x, const int32_t* src_rows, int num_rows, Tensor& out) {
  OSP_CHECK(x.dtype() == out.dtype());
  OSP_CHECK_EQ(x.cols(), out.cols());
  OSP_CHECK_GE(num_rows, 0);
  OSP_CHECK_GE(out.rows(), num_rows);
  const int64_t rb = x.row_bytes();
  const int64_t n = x.rows();
  // The operands must not overlap (the CUDA kernel reads x while writing out).
  const char* xb = static_cast<const char*>(x.data());
  const char* ob = static_cast<const char*>(out.data());
  OSP_CHECK_MSG(num_rows == 0 || xb + n * rb <= ob || ob + num_rows * rb <= xb, "fill_rows_from: x and out overlap");
  for (int r = 0; r < num_rows; ++r) {
    if (src_rows[r] < 0) continue;
    OSP_CHECK_MSG(src_rows[r] < n, "fill_rows_from: row " << src_rows[r] << " out of range " << n);
    std::memcpy(out.row(r), x.row(src_rows[r]), static_cast<size_t>(rb));
  }
}

namespace {

bool is_float_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

void store_float(DType t, void* base, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = f32_to_fp16(v);
      break;
    default:
      static_cast<uint16_t*>(base)[i] = f32_to_bf16(v);
      break;
  }
}

}  // namespace

void CpuBackend::convert(const Tensor& src, Tensor& dst) {
  OSP_CHECK_MSG(is_float_dtype(src.dtype()) && is_float_dtype(dst.dtype()),
                "convert: F32/F16/BF16 only, got " << dtype_name(src.dtype()) << " -> " << dtype_name(dst.dtype()));
  OSP_CHECK_EQ(src.numel(), dst.numel());
  const int64_t n = src.numel();
  constexpr int64_t kChunk = 4096;
  float buf[kChunk];
  const int64_t src_es = src.dtype() == DType::kF32 ? 4 : 2;
  for (int64_t b = 0; b < n; b += kChunk) {
    const int64_t len = std::min(kChunk, n - b);
    dequantize_row(src.dtype(), static_cast<const char*>(src.data()) + b * src_es, buf, len);
    for (int64_t i = 0; i < len; ++i) store_float(dst.dtype(), dst.data(), b + i, buf[i]);
  }
}

void CpuBackend::fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) {
  OSP_CHECK_MSG(is_float_dtype(t.dtype()), "fill_uniform: F32/F16/BF16 only, got " << dtype_name(t.dtype()));
  const int64_t n = t.numel();
  const float span = hi - lo;
  void* base = t.data();
  const DType dt = t.dtype();
  for_range(n, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      store_float(dt, base, i, std::fmaf(span, ops::uniform_hash01(seed, static_cast<uint64_t>(i)), lo));
    }
  });
}

void CpuBackend::qkv_rope_kv_write(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                   const ops::RopeTable& rope_table, const ops::AttentionBatch& batch,
                                   ops::LayerKv& kv, Tensor& q_out) {
  OSP_CHECK_MSG(qkv.dtype() == DType::kF32 && q_out.dtype() == DType::kF32, "CPU qkv_rope_kv_write takes F32");
  OSP_CHECK_EQ(q_out.ndim(), 3);
  const int64_t n = q_out.dim(0), hq = q_out.dim(1), hd = q_out.dim(2);
  OSP_CHECK_EQ(qkv.rows(), n);
  const int64_t hk = (qkv.cols() / hd - hq) / 2;
  OSP_CHECK_MSG(hk > 0 && (hq + 2 * hk) * hd == qkv.cols(),
                "qkv_rope_kv_write: qkv has " << qkv.cols() << " columns, not (hq + 2 hk) * hd");
  if (n == 0) return;
  const size_t kv_elems = static_cast<size_t>(n * hk * hd);
  if (qkv_k_.size() < kv_elems) {
    qkv_k_.resize(kv_elems);
    qkv_v_.resize(kv_elems);
  }
  const float* src = qkv.data_as<float>();
  float* qo = q_out.data_as<float>();
  const int64_t row = qkv.cols(), qw = hq * hd, kw = hk * hd;
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(qo + t * qw, src + t * row, static_cast<size_t>(qw) * sizeof(float));
    std::memcpy(qkv_k_.data() + t * kw, src + t * row + qw, static_cast<size_t>(kw) * sizeof(float));
    std::memcpy(qkv_v_.data() + t * kw, src + t * row + qw + kw, static_cast<size_t>(kw) * sizeof(float));
  }
  Tensor k(qkv_k_.data(), DType::kF32, {n, hk, hd});
  Tensor v(qkv_v_.data(), DType::kF32, {n, hk, hd});
  if (q_norm.defined()) {
    head_rms_norm(q_out, q_norm, eps);
    head_rms_norm(k, k_norm, eps);
  }
  rope(q_out, k, batch.positions, rope_table);
  kv_write(k, v, batch, kv);
}

}  // namespace osprey::cpu

namespace osprey::ops {

std::unique_ptr<Backend> make_cpu_backend(int num_threads, bool quantize_activations) {
  cpu::CpuBackendOptions o;
  o.num_threads = num_threads;
  o.quantize_activations = quantize_activations;
  return cpu::make_cpu_backend(o);
}

}  // namespace osprey::ops
