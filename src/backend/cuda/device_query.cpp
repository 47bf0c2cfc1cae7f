#include "backend/cuda/device_query.h"

#include <cuda_runtime.h>

#include <atomic>

#include "backend/cuda/cuda_check.h"

namespace osprey::cuda {
namespace {

constexpr int kMaxDevices = 64;

}  // namespace

int current_device() {
  static const bool single_device = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n == 1;
  }();
  int dev = 0;
  if (!single_device) OSP_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

int device_sm(int dev) {
  // 0: not looked up yet (no device has compute capability 0.0).
  static std::atomic<int> sm[kMaxDevices] = {};
  if (dev < 0 || dev >= kMaxDevices) return 0;
  int s = sm[dev].load(std::memory_order_relaxed);
  if (s == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      return 0;
    }
    s = major * 10 + minor;
    sm[dev].store(s, std::memory_order_relaxed);
  }
  return s;
}

}  // namespace osprey::cuda
