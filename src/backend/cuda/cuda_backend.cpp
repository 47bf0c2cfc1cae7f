// CudaBackend: construction, memory, copies and the row-wise ops.
#include "backend/cuda/cuda_backend_impl.h"

#include <cstdio>
#include <cstring>

#include "backend/cuda/host_util.h"
#include "backend/cuda/kernels.h"
#include "core/check.h"

namespace osprey::cuda {
namespace detail {

const char* cublas_status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

}  // namespace detail

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

void check_cuda_f32(const Tensor& t, const char* what) {
  OSP_CHECK_MSG(t.dtype() == DType::kF32, what << " must be F32, got " << dtype_name(t.dtype()));
  OSP_CHECK_MSG(t.device() == Device::kCuda, what << " must be in CUDA device memory");
}

// An activation tensor: F32, BF16 or F16 in device memory.
void check_cuda_act(const Tensor& t, const char* what) {
  OSP_CHECK_MSG(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16,
                what << " must be F32, BF16 or F16, got " << dtype_name(t.dtype()));
  OSP_CHECK_MSG(t.device() == Device::kCuda, what << " must be in CUDA device memory");
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* what) {
  OSP_CHECK_MSG(a.dtype() == b.dtype(), what << ": dtypes differ (" << dtype_name(a.dtype()) << " vs "
                                             << dtype_name(b.dtype()) << ")");
}

bool is_float_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

CudaBackend::CudaBackend(const CudaBackendOptions& options) : options_(options) {
  const int count = device_count();
  if (options.device_index < 0 || options.device_index >= count) {
    error_ = "CUDA device " + std::to_string(options.device_index) + " is not available (" + std::to_string(count) +
             " device(s) found)";
    return;
  }
  if (cudaSetDevice(options.device_index) != cudaSuccess) {
    error_ = "cannot open CUDA device " + std::to_string(options.device_index) + ": " +
             cudaGetErrorString(cudaGetLastError());
    return;
  }
  cudaDeviceProp prop{};
  OSP_CUDA_CHECK(cudaGetDeviceProperties(&prop, options.device_index));
  num_sms_ = prop.multiProcessorCount;
  fp8_tensor_cores_ = prop.major > 8 || (prop.major == 8 && prop.minor >= 9);  // Ada, Hopper and newer
  if (prop.major < 8) {
    error_ = std::string("CUDA device ") + prop.name + " has compute capability " + std::to_string(prop.major) + "." +
             std::to_string(prop.minor) + "; osprey needs 8.0 or newer";
    return;
  }
  name_ = "cuda:" + std::to_string(options.device_index) + " (" + prop.name + ")";
  OSP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  OSP_CUBLAS_CHECK(cublasCreate(&cublas_));
  OSP_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  OSP_CUBLAS_CHECK(cublasLtCreate(&lt_));
  // Our own workspace: no allocation inside cuBLAS calls (and graph capture later).
  OSP_CUBLAS_CHECK(
      cublasSetWorkspace(cublas_, cublas_workspace_.reserve(kCublasWorkspaceBytes, stream_), kCublasWorkspaceBytes));
  // Default math: fp32 GEMMs stay fp32 (no TF32); F16/BF16 inputs use tensor cores.
  OSP_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  // Before any capture: the decode split-merge counters start at zero.
  const size_t ticket_bytes = static_cast<size_t>(kDecodeSplitTickets) * sizeof(unsigned int);
  OSP_CUDA_CHECK(cudaMemsetAsync(decode_tickets_.reserve(ticket_bytes, stream_), 0, ticket_bytes, stream_));
  OSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaBackend::~CudaBackend() {
  if (stream_) {
    bind_device();
    OSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  for (auto& [key, plan] : lt_plans_) {
    (void)key;
    if (plan.a) OSP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.a));
    if (plan.b) OSP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.b));
    if (plan.c) OSP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.c));
    if (plan.desc) OSP_CUBLAS_CHECK(cublasLtMatmulDescDestroy(plan.desc));
  }
  lt_plans_.clear();
  if (lt_) OSP_CUBLAS_CHECK(cublasLtDestroy(lt_));
  if (cublas_) OSP_CUBLAS_CHECK(cublasDestroy(cublas_));
  // Buffers go before the stream they were used on.
  cublas_workspace_.reset();
  act_scratch_.reset();
  panel_scratch_.reset();
  attn_acc_.reset();
  attn_ml_.reset();
  decode_tickets_.reset();
  rope_freq_.reset();
  if (stream_) OSP_CUDA_CHECK(cudaStreamDestroy(stream_));
}

void CudaBackend::bind_device() const {
  int current = -1;
  OSP_CUDA_CHECK(cudaGetDevice(&current));
  if (current != options_.device_index) OSP_CUDA_CHECK(cudaSetDevice(options_.device_index));
}

// ---- memory -------------------------------------------------------------------

void* CudaBackend::alloc(size_t bytes) {
  bind_device();
  void* p = nullptr;
  const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
  const cudaError_t err = cudaMalloc(&p, rounded);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // out of memory is an expected failure: report it by returning null
    return nullptr;
  }
  OSP_CUDA_CHECK(err);
  OSP_CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, stream_));
  return p;
}

void CudaBackend::free(void* p) {
  if (!p) return;
  bind_device();
  OSP_CUDA_CHECK(cudaStreamSynchronize(stream_));  // queued work may still use p
  OSP_CUDA_CHECK(cudaFree(p));
}

void CudaBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  bind_device();
  // From pageable memory the call returns once src has been staged, so the
  // caller may reuse src at once; cudaMemcpyDefault also takes device sources.
  OSP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  bind_device();
  OSP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  OSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() {
  bind_device();
  OSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- row-wise ops -------------------------------------------------------------

void CudaBackend::embedding(const Tensor& table, const int32_t* ids, Tensor& out) {
  check_cuda_act(out, "embedding out");
  OSP_CHECK_MSG(table.device() == Device::kCuda, "embedding table must be in CUDA device memory");
  OSP_CHECK_EQ(table.ndim(), 2);
  const int64_t d = table.dim(1);
  OSP_CHECK_EQ(out.cols(), d);
  bind_device();
  launch_embedding(table.dtype(), table.data(), table.row_bytes(), table.dim(0), d, ids, out.rows(), out.dtype(),
                   out.data(), stream_);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  check_cuda_act(x, "rms_norm x");
  check_cuda_f32(w, "rms_norm w");
  check_cuda_act(out, "rms_norm out");
  check_same_dtype(x, out, "rms_norm");
  OSP_CHECK_EQ(w.numel(), x.cols());
  OSP_CHECK_EQ(out.numel(), x.numel());
  bind_device();
  launch_rms_norm(x.dtype(), x.data(), w.data_as<float>(), eps, x.rows(), x.cols(), out.data(), stream_);
}

void CudaBackend::add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  check_cuda_act(residual, "add_rms_norm residual");
  check_cuda_act(x, "add_rms_norm x");
  check_cuda_f32(w, "add_rms_norm w");
  check_cuda_act(out, "add_rms_norm out");
  check_same_dtype(residual, x, "add_rms_norm");
  check_same_dtype(residual, out, "add_rms_norm");
  OSP_CHECK_EQ(x.numel(), residual.numel());
  OSP_CHECK_EQ(out.numel(), residual.numel());
  OSP_CHECK_EQ(w.numel(), residual.cols());
  bind_device();
  launch_add_rms_norm(residual.dtype(), residual.data(), x.data(), w.data_as<float>(), eps, residual.rows(),
                      residual.cols(), out.data(), stream_);
}

void CudaBackend::add(Tensor& x, const Tensor& y) {
  check_cuda_act(x, "add x");
  check_cuda_act(y, "add y");
  check_same_dtype(x, y, "add");
  OSP_CHECK_EQ(x.numel(), y.numel());
  bind_device();
  launch_add(x.dtype(), x.data(), y.data(), x.numel(), stream_);
}

void CudaBackend::head_rms_norm(Tensor& x, const Tensor& w, float eps) {
  check_cuda_act(x, "head_rms_norm x");
  check_cuda_f32(w, "head_rms_norm w");
  OSP_CHECK_EQ(w.numel(), x.cols());
  bind_device();
  launch_rms_norm(x.dtype(), x.data(), w.data_as<float>(), eps, x.rows(), x.cols(), x.data(), stream_);
}

const float* CudaBackend::device_inv_freq(const ops::RopeTable& table) {
  if (table.inv_freq != last_inv_freq_) {
    cudaPointerAttributes attr{};
    OSP_CUDA_CHECK(cudaPointerGetAttributes(&attr, table.inv_freq));
    last_inv_freq_ = table.inv_freq;
    last_inv_freq_on_device_ = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  }
  if (last_inv_freq_on_device_) return table.inv_freq;
  // Host table: copied every call, since its contents may have changed.
  const size_t bytes = static_cast<size_t>(table.rotary_dim / 2) * sizeof(float);
  void* dst = rope_freq_.reserve(bytes, stream_);
  OSP_CUDA_CHECK(cudaMemcpyAsync(dst, table.inv_freq, bytes, cudaMemcpyDefault, stream_));
  return static_cast<const float*>(dst);
}

void CudaBackend::rope(Tensor& q, Tensor& k, const int32_t* positions, const ops::RopeTable& table) {
  check_cuda_act(q, "rope q");
  check_cuda_act(k, "rope k");
  check_same_dtype(q, k, "rope");
  OSP_CHECK_EQ(q.ndim(), 3);
  OSP_CHECK_EQ(k.ndim(), 3);
  OSP_CHECK_EQ(k.dim(0), q.dim(0));
  OSP_CHECK_EQ(k.dim(2), q.dim(2));
  OSP_CHECK(table.inv_freq != nullptr);
  const int hd = static_cast<int>(q.dim(2));
  OSP_CHECK(table.rotary_dim > 0 && table.rotary_dim % 2 == 0 && table.rotary_dim <= hd);
  if (q.dim(0) == 0) return;
  bind_device();
  launch_rope(q.dtype(), q.data(), k.data(), positions, q.dim(0), static_cast<int>(q.dim(1)),
              static_cast<int>(k.dim(1)), hd, device_inv_freq(table), table.rotary_dim, table.attention_scaling,
              stream_);
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  check_cuda_act(gate_up, "silu_mul gate_up");
  check_cuda_act(out, "silu_mul out");
  check_same_dtype(gate_up, out, "silu_mul");
  OSP_CHECK_EQ(gate_up.cols(), 2 * out.cols());
  OSP_CHECK_EQ(gate_up.rows(), out.rows());
  bind_device();
  launch_silu_mul(out.dtype(), gate_up.data(), out.rows(), out.cols(), out.data(), stream_);
}

void CudaBackend::matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& gate_up, Tensor& out) {
  // One row of 16-bit activations: one kernel (gemm/gemv.cu), gate_up unwritten.
  const bool one_row = x.ndim() == 2 && x.rows() == 1 && out.ndim() == 2 && out.rows() == 1 &&
                       x.dtype() == out.dtype() && (x.dtype() == DType::kBF16 || x.dtype() == DType::kF16) &&
                       x.device() == Device::kCuda && out.device() == Device::kCuda &&
                       w_gate_up.device() == Device::kCuda && w_gate_up.ndim() == 2 &&
                       w_gate_up.dim(0) == 2 * out.cols() && w_gate_up.dim(1) == x.cols();
  if (one_row) {
    bind_device();
    if (launch_gemv_silu_mul(w_gate_up.dtype(), w_gate_up.data(), w_gate_up.row_bytes(), out.cols(), x.cols(),
                             x.dtype(), x.data(), out.data(), stream_))
      return;
  }
  ops::Backend::matmul_silu_mul(x, w_gate_up, gate_up, out);  // matmul, then silu_mul
}

void CudaBackend::gather_rows(const Tensor& x, const int32_t* rows, int num_rows, Tensor& out) {
  OSP_CHECK_MSG(x.dtype() == out.dtype(), "gather_rows: x and out differ in dtype");
  OSP_CHECK_EQ(x.cols(), out.cols());
  OSP_CHECK_GE(out.rows(), num_rows);
  OSP_CHECK_GE(num_rows, 0);
  OSP_CHECK_MSG(x.device() == Device::kCuda && out.device() == Device::kCuda,
                "gather_rows tensors must be in CUDA device memory");
  bind_device();
  launch_gather_rows(x.data(), x.row_bytes(), x.rows(), rows, num_rows, out.data(), stream_);
}

void CudaBackend::fill_rows_from(const Tensor& x, const int32_t* src_rows, int num_rows, Tensor& out) {
  OSP_CHECK_MSG(x.dtype() == out.dtype(), "fill_rows_from: x and out differ in dtype");
  OSP_CHECK_EQ(x.cols(), out.cols());
  OSP_CHECK_GE(num_rows, 0);
  OSP_CHECK_GE(out.rows(), num_rows);
  OSP_CHECK_MSG(x.device() == Device::kCuda && out.device() == Device::kCuda,
                "fill_rows_from tensors must be in CUDA device memory");
  const char* xb = static_cast<const char*>(x.data());
  const char* ob = static_cast<const char*>(out.data());
  OSP_CHECK_MSG(num_rows == 0 || xb + x.nbytes() <= ob || ob + num_rows * out.row_bytes() <= xb,
                "fill_rows_from: x and out overlap");
  bind_device();
  launch_fill_rows_from(x.data(), x.row_bytes(), x.rows(), src_rows, num_rows, out.data(), stream_);
}

void CudaBackend::convert(const Tensor& src, Tensor& dst) {
  OSP_CHECK_MSG(is_float_dtype(src.dtype()) && is_float_dtype(dst.dtype()),
                "convert: F32/F16/BF16 only, got " << dtype_name(src.dtype()) << " -> " << dtype_name(dst.dtype()));
  OSP_CHECK_EQ(src.numel(), dst.numel());
  OSP_CHECK_MSG(src.device() == Device::kCuda && dst.device() == Device::kCuda,
                "convert tensors must be in CUDA device memory");
  bind_device();
  launch_convert(src.dtype(), src.data(), src.numel(), dst.dtype(), dst.data(), stream_);
}

void CudaBackend::fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) {
  OSP_CHECK_MSG(is_float_dtype(t.dtype()), "fill_uniform: F32/F16/BF16 only, got " << dtype_name(t.dtype()));
  OSP_CHECK_MSG(t.device() == Device::kCuda, "fill_uniform tensor must be in CUDA device memory");
  bind_device();
  launch_fill_uniform(t.dtype(), t.data(), t.numel(), seed, lo, hi, stream_);
}

// ---- RMSNorm weights folded into the projections ----------------------------

bool CudaBackend::folds_norms(DType act) const {
  static const bool env_off = env_equals("OSPREY_FOLDED_NORM", "0");
  return options_.folded_norm && !env_off && act == DType::kBF16;
}

void CudaBackend::scale_columns(Tensor& w, const Tensor& scale) {
  OSP_CHECK_MSG(is_float_dtype(w.dtype()), "scale_columns: w must be F32, F16 or BF16, got " << dtype_name(w.dtype()));
  OSP_CHECK_MSG(w.device() == Device::kCuda, "scale_columns w must be in CUDA device memory");
  check_cuda_f32(scale, "scale_columns scale");
  OSP_CHECK_EQ(scale.numel(), w.cols());
  bind_device();
  launch_scale_columns(w.dtype(), w.data(), w.numel(), w.cols(), scale.data_as<float>(), stream_);
}

namespace {
// Rows above which the row factors of a folded norm are computed in a pass
// of their own (launch_row_inv_rms, x read once) instead of by every block
// that reads a product: at decode sizes the pass would add a kernel
// boundary, at prefill sizes each reading block's reduction (x re-read per
// block, the reduction ahead of its loads) costs more than the pass.
constexpr int64_t kRowScalePassRows = 512;
}  // namespace

const float* CudaBackend::row_inv_rms_pass(const Tensor& x, float eps) {
  if (x.rows() <= kRowScalePassRows) return nullptr;
  auto* inv = static_cast<float*>(row_inv_.reserve(static_cast<size_t>(x.rows()) * sizeof(float), stream_));
  launch_row_inv_rms(x.dtype(), x.data(), x.rows(), x.cols(), eps, inv, stream_);
  return inv;
}

void CudaBackend::rms_scaled_qkv_rope_kv_write(const Tensor& x, float x_eps, const Tensor& qkv, const Tensor& qkv_bias,
                                               const Tensor& q_norm, const Tensor& k_norm, float eps,
                                               const ops::RopeTable& rope, const ops::AttentionBatch& batch,
                                               ops::LayerKv& kv, Tensor& q_out) {
  run_qkv_rope(&x, x_eps, &qkv_bias, qkv, q_norm, k_norm, eps, rope, batch, kv, q_out);
}

void CudaBackend::rms_scaled_silu_mul(const Tensor& x, float x_eps, const Tensor& gate_up, Tensor& out) {
  check_cuda_act(x, "rms_scaled_silu_mul x");
  check_cuda_act(gate_up, "rms_scaled_silu_mul gate_up");
  check_cuda_act(out, "rms_scaled_silu_mul out");
  check_same_dtype(x, gate_up, "rms_scaled_silu_mul");
  check_same_dtype(gate_up, out, "rms_scaled_silu_mul");
  OSP_CHECK_EQ(gate_up.cols(), 2 * out.cols());
  OSP_CHECK_EQ(gate_up.rows(), out.rows());
  OSP_CHECK_EQ(x.rows(), gate_up.rows());
  OSP_CHECK_GT(x.cols(), 0);
  bind_device();
  if (const float* inv = row_inv_rms_pass(x, x_eps)) {
    launch_silu_mul(out.dtype(), gate_up.data(), out.rows(), out.cols(), out.data(), stream_, inv);
    return;
  }
  launch_rms_scaled_silu_mul(out.dtype(), x.data(), x.cols(), x_eps, gate_up.data(), out.rows(), out.cols(),
                             out.data(), stream_);
}

void CudaBackend::qkv_rope_kv_write(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                    const ops::RopeTable& rope, const ops::AttentionBatch& batch, ops::LayerKv& kv,
                                    Tensor& q_out) {
  run_qkv_rope(nullptr, 0.0f, nullptr, qkv, q_norm, k_norm, eps, rope, batch, kv, q_out);
}

void CudaBackend::run_qkv_rope(const Tensor* rms_x, float rms_eps, const Tensor* qkv_bias, const Tensor& qkv,
                               const Tensor& q_norm, const Tensor& k_norm, float eps, const ops::RopeTable& rope,
                               const ops::AttentionBatch& batch, ops::LayerKv& kv, Tensor& q_out) {
  check_cuda_act(qkv, "qkv_rope_kv_write qkv");
  check_cuda_act(q_out, "qkv_rope_kv_write q_out");
  check_same_dtype(qkv, q_out, "qkv_rope_kv_write");
  OSP_CHECK_EQ(q_out.ndim(), 3);
  const int64_t n = q_out.dim(0), hq = q_out.dim(1), hd = q_out.dim(2);
  OSP_CHECK_EQ(qkv.rows(), n);
  OSP_CHECK_EQ(n, batch.num_tokens);
  OSP_CHECK_EQ(kv.k.ndim(), 4);
  const int64_t hk = kv.k.dim(2);
  OSP_CHECK_MSG((hq + 2 * hk) * hd == qkv.cols(),
                "qkv_rope_kv_write: qkv has " << qkv.cols() << " columns, not (hq + 2 hk) * hd");
  OSP_CHECK_EQ(kv.k.dim(3), hd);
  check_kv_pages(kv);
  OSP_CHECK(rope.inv_freq != nullptr);
  OSP_CHECK(rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= hd);
  OSP_CHECK_MSG(q_norm.defined() == k_norm.defined(), "q_norm and k_norm go together");
  if (q_norm.defined()) {
    check_cuda_f32(q_norm, "q_norm");
    check_cuda_f32(k_norm, "k_norm");
    OSP_CHECK_EQ(q_norm.numel(), hd);
    OSP_CHECK_EQ(k_norm.numel(), hd);
  }
  if (rms_x) {
    check_cuda_act(*rms_x, "rms_scaled_qkv_rope_kv_write x");
    check_same_dtype(*rms_x, qkv, "rms_scaled_qkv_rope_kv_write");
    OSP_CHECK_EQ(rms_x->rows(), n);
    OSP_CHECK_GT(rms_x->cols(), 0);
  }
  const bool bias = qkv_bias && qkv_bias->defined();
  if (bias) {
    check_cuda_f32(*qkv_bias, "rms_scaled_qkv_rope_kv_write qkv_bias");
    OSP_CHECK_EQ(qkv_bias->numel(), qkv.cols());
  }
  if (n == 0) return;
  bind_device();
  QkvRopeArgs a;
  a.act = qkv.dtype();
  a.qkv = qkv.data();
  a.q_out = q_out.data();
  a.n = n;
  a.hq = static_cast<int>(hq);
  a.hk = static_cast<int>(hk);
  a.hd = static_cast<int>(hd);
  a.q_norm = q_norm.defined() ? q_norm.data_as<float>() : nullptr;
  a.k_norm = k_norm.defined() ? k_norm.data_as<float>() : nullptr;
  a.eps = eps;
  a.positions = batch.positions;
  a.inv_freq = device_inv_freq(rope);
  a.rotary_dim = rope.rotary_dim;
  a.attention_scaling = rope.attention_scaling;
  a.slot_mapping = batch.slot_mapping;
  a.cache_dtype = kv.k.dtype();
  a.k_cache = kv.k.data();
  a.v_cache = kv.v.data();
  if (a.cache_dtype == DType::kF8E4M3) {
    a.k_inv_scale = 1.0f / kv.k_scale;
    a.v_inv_scale = 1.0f / kv.v_scale;
  }
  a.k_row_scales = kv.k_row_scales.data_as<float>();  // null but for I8 pages (check_kv_pages)
  a.v_row_scales = kv.v_row_scales.data_as<float>();
  a.block_size = static_cast<int>(kv.k.dim(1));
  a.num_slots = kv.k.dim(0) * kv.k.dim(1);
  if (rms_x) {
    a.rms_inv = row_inv_rms_pass(*rms_x, rms_eps);
    a.rms_x = rms_x->data();
    a.rms_d = rms_x->cols();
    a.rms_eps = rms_eps;
    if (bias) a.qkv_bias = qkv_bias->data_as<float>();
  }
  launch_qkv_rope_kv_write(a, stream_);
}

}  // namespace osprey::cuda

namespace osprey::cuda {

std::unique_ptr<ops::Backend> make_cuda_backend(const CudaBackendOptions& options) {
  auto backend = std::make_unique<CudaBackend>(options);
  if (!backend->ok()) {
    std::fprintf(stderr, "osprey: %s\n", backend->error().c_str());
    return nullptr;
  }
  return backend;
}

}  // namespace osprey::cuda

namespace osprey::ops {

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  cuda::CudaBackendOptions o;
  o.device_index = device_index;
  return cuda::make_cuda_backend(o);
}

}  // namespace osprey::ops
