// pdl_enabled(): the environment switch and the per-device check behind
// launch_pdl (pdl.cuh).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_query.h"
#include "backend/cuda/host_util.h"
#include "backend/cuda/pdl.cuh"

namespace osprey::cuda {
namespace {

constexpr int kMaxDevices = 64;

bool env_disables_pdl() {
  static const bool off = [] {
    const char* v = std::getenv("OSPREY_CUDA_NO_PDL");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return off;
}

// Compiled like every kernel of this library: its PTX version tells which
// architecture's code the device runs, hence whether pdl_wait() is a real
// griddepcontrol.wait (sm_90+ code) or compiled out.
__global__ void pdl_probe_kernel() {}

}  // namespace

bool attention_pdl_enabled() {
  static const bool on = !env_equals("OSPREY_ATTENTION_PDL", "0");
  return on;
}

bool pdl_enabled() {
  // 0: not looked up yet, 1: no, 2: yes (per device ordinal).
  static std::atomic<signed char> state[kMaxDevices] = {};
  if (env_disables_pdl()) return false;
  const int dev = current_device();  // every launch asks: no runtime call with one device
  if (dev < 0 || dev >= kMaxDevices) return false;
  signed char s = state[dev].load(std::memory_order_relaxed);
  if (s == 0) {
    cudaFuncAttributes fa{};
    OSP_CUDA_CHECK(cudaFuncGetAttributes(&fa, pdl_probe_kernel));
    s = device_sm(dev) >= 90 && fa.ptxVersion >= 90 ? 2 : 1;
    state[dev].store(s, std::memory_order_relaxed);
  }
  return s == 2;
}

}  // namespace osprey::cuda
