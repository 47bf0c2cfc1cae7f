// Checks for CUDA runtime and cuBLAS calls. A failing call is a bug or a lost
// device: it aborts with the file, line, the call and the error string.
// Expected failures (out of memory in alloc) are handled at the call site.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/check.h"

namespace osprey::cuda::detail {

const char* cublas_status_string(cublasStatus_t s);

}  // namespace osprey::cuda::detail

#define OSP_CUDA_CHECK(expr)                                                                                         \
  do {                                                                                                               \
    const cudaError_t osp_err_ = (expr);                                                                             \
    if (osp_err_ != cudaSuccess)                                                                                     \
      ::osprey::detail::check_failed(__FILE__, __LINE__, #expr,                                                      \
                                     std::string(cudaGetErrorName(osp_err_)) + ": " + cudaGetErrorString(osp_err_)); \
  } while (0)

#define OSP_CUBLAS_CHECK(expr)                                                               \
  do {                                                                                       \
    const cublasStatus_t osp_st_ = (expr);                                                   \
    if (osp_st_ != CUBLAS_STATUS_SUCCESS)                                                    \
      ::osprey::detail::check_failed(__FILE__, __LINE__, #expr,                              \
                                     ::osprey::cuda::detail::cublas_status_string(osp_st_)); \
  } while (0)

// After a kernel launch: catches bad launch configurations at the call site.
#define OSP_CUDA_CHECK_LAUNCH() OSP_CUDA_CHECK(cudaGetLastError())
