// CudaBackend::matmul: out[n, m] = x[n, k] @ w[m, k]^T (+ bias), fp32
// activations and output, any weight dtype.
//
// Paths (the row thresholds are where cuBLAS starts to beat re-reading the
// weights once per kGemvRowsPerPass rows):
//   n <= kDenseGemvMaxRows (F32/F16/BF16) or kQuantGemvMaxRows (quantised):
//     own GEMV kernels, fp32 activations (gemm/gemv.cu);
//   F32 weights: cuBLAS SGEMM (fp32 compute, no TF32);
//   F16/BF16 weights: activations converted to the weight dtype, cuBLAS with
//     fp32 accumulation and fp32 output (tensor cores); with
//     exact_fp32_matmul, like the quantised path instead;
//   quantised weights: panels of weight rows dequantised to fp32 scratch,
//     then SGEMM per panel.
#include <algorithm>
#include <limits>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/kernels.h"
#include "core/check.h"

namespace osprey::cuda {
namespace {

constexpr int64_t kDenseGemvMaxRows = 8;
constexpr int64_t kQuantGemvMaxRows = 4 * kGemvRowsPerPass;
// fp32 elements of one dequantised weight panel (64 MiB).
constexpr int64_t kPanelElems = int64_t{16} << 20;

bool is_weight_dtype(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
      return true;
    default:
      return false;
  }
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      OSP_CHECK_MSG(false, "no cuBLAS type for " << dtype_name(t));
  }
  return CUDA_R_32F;
}

}  // namespace

void CudaBackend::gemm(const void* w, cudaDataType_t w_type, const void* x, cudaDataType_t x_type, int64_t n, int64_t m,
                       int64_t k, float* out, int64_t ldo, bool accumulate) {
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  OSP_CHECK(n <= kMaxInt && m <= kMaxInt && k <= kMaxInt && ldo <= kMaxInt);
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  // Column-major view: out^T [m, n] (ld ldo) = w [k, m]^T * x^T [k, n].
  OSP_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
                                static_cast<int>(k), &alpha, w, w_type, static_cast<int>(k), x, x_type,
                                static_cast<int>(k), &beta, out, CUDA_R_32F, static_cast<int>(ldo), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  OSP_CHECK_MSG(x.dtype() == DType::kF32 && out.dtype() == DType::kF32, "matmul activations must be F32");
  OSP_CHECK_MSG(x.device() == Device::kCuda && w.device() == Device::kCuda && out.device() == Device::kCuda,
                "matmul tensors must be in CUDA device memory");
  OSP_CHECK_EQ(w.ndim(), 2);
  OSP_CHECK_MSG(is_weight_dtype(w.dtype()), "matmul: unsupported weight dtype " << dtype_name(w.dtype()));
  const int64_t m = w.dim(0);
  const int64_t k = w.dim(1);
  const int64_t n = x.rows();
  OSP_CHECK_EQ(x.cols(), k);
  OSP_CHECK_EQ(out.rows(), n);
  OSP_CHECK_EQ(out.cols(), m);
  const bool quant = dtype_is_quantized(w.dtype());
  if (quant) OSP_CHECK_EQ(k % kQuantBlock, 0);
  const float* b = nullptr;
  if (bias.defined()) {
    OSP_CHECK_MSG(bias.dtype() == DType::kF32 && bias.device() == Device::kCuda,
                  "matmul bias must be F32 on the device");
    OSP_CHECK_EQ(bias.numel(), m);
    b = bias.data_as<float>();
  }
  if (n == 0 || m == 0) return;
  bind_device();
  float* o = out.data_as<float>();
  const float* xp = x.data_as<float>();
  if (k == 0) {  // empty sum: out = bias or 0
    if (b) {
      launch_fill_rows(b, n, m, o, stream_);
    } else {
      OSP_CUDA_CHECK(cudaMemsetAsync(o, 0, static_cast<size_t>(n * m) * sizeof(float), stream_));
    }
    return;
  }

  if (n <= (quant ? kQuantGemvMaxRows : kDenseGemvMaxRows)) {
    launch_gemv(w.dtype(), w.data(), w.row_bytes(), m, k, xp, n, b, o, stream_);
    return;
  }
  if (b) launch_fill_rows(b, n, m, o, stream_);
  const bool accumulate = b != nullptr;

  if (w.dtype() == DType::kF32) {
    gemm(w.data(), CUDA_R_32F, xp, CUDA_R_32F, n, m, k, o, m, accumulate);
    return;
  }
  if (!quant && !options_.exact_fp32_matmul) {
    void* xh = act_scratch_.reserve(static_cast<size_t>(n * k) * 2, stream_);
    launch_convert_f32(xp, n * k, w.dtype(), xh, stream_);
    gemm(w.data(), cuda_type(w.dtype()), xh, cuda_type(w.dtype()), n, m, k, o, m, accumulate);
    return;
  }
  // Dequantised fp32 panels of weight rows; each panel fills columns [r0, r0 + rows) of out.
  const int64_t panel_rows = std::clamp<int64_t>(kPanelElems / k, 1, m);
  float* panel = panel_scratch_.reserve_as<float>(static_cast<size_t>(panel_rows * k), stream_);
  const auto* wp = static_cast<const char*>(w.data());
  for (int64_t r0 = 0; r0 < m; r0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, m - r0);
    launch_dequant_rows(w.dtype(), wp + r0 * w.row_bytes(), w.row_bytes(), rows, k, panel, stream_);
    gemm(panel, CUDA_R_32F, xp, CUDA_R_32F, n, rows, k, o + r0, m, accumulate);
  }
}

}  // namespace osprey::cuda
