#include "backend/cuda/device_query.h"

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>

#include "backend/cuda/cuda_check.h"

namespace osprey::cuda {
namespace {

constexpr int kMaxDevices = 64;

// The largest dynamic shared memory size set for one (device, kernel) pair.
// `kernel` is written once, last, with release order, and never changes
// afterwards: a reader that loads it non-null (acquire) also sees `dev`.
// `bytes` only grows, and is stored (release) after the runtime call that
// set it returned.
struct SmemEntry {
  std::atomic<const void*> kernel{nullptr};
  std::atomic<int> dev{-1};
  std::atomic<int> bytes{0};
};

// Open addressing with linear probing, never erased. Far more slots than the
// (kernel, device) pairs a process launches (at most ~150 kernels call this,
// times the devices); were it full, a pair without an entry would call the
// runtime on every launch, as the launchers did before this cache.
constexpr size_t kSmemSlots = 4096;  // a power of two; 64 KiB of zeroed storage
static_assert((kSmemSlots & (kSmemSlots - 1)) == 0);

// Constant-initialised: no static-initialisation order or guard.
SmemEntry g_smem[kSmemSlots];
std::mutex g_smem_mu;  // serialises inserts and raises, never taken on the fast path

size_t smem_home_slot(const void* kernel, int dev) {
  uint64_t h = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(kernel)) ^ (static_cast<uint64_t>(dev) << 56);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return static_cast<size_t>(h) & (kSmemSlots - 1);
}

// The entry of (kernel, dev), or nullptr. `empty`, when given, receives the
// first empty slot on the probe path (nullptr: the table is full).
SmemEntry* find_smem_entry(const void* kernel, int dev, SmemEntry** empty) {
  size_t i = smem_home_slot(kernel, dev);
  for (size_t n = 0; n < kSmemSlots; ++n, i = (i + 1) & (kSmemSlots - 1)) {
    SmemEntry& e = g_smem[i];
    const void* k = e.kernel.load(std::memory_order_acquire);
    if (k == nullptr) {
      if (empty != nullptr) *empty = &e;
      return nullptr;
    }
    if (k == kernel && e.dev.load(std::memory_order_relaxed) == dev) return &e;
  }
  if (empty != nullptr) *empty = nullptr;
  return nullptr;
}

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

void set_max_dynamic_smem_once(const void* kernel, size_t bytes) {
  OSP_CHECK_LE(bytes, size_t{INT_MAX});
  const int want = static_cast<int>(bytes);
  const int dev = current_device();
  const SmemEntry* seen = find_smem_entry(kernel, dev, nullptr);
  if (seen != nullptr && seen->bytes.load(std::memory_order_acquire) >= want) return;

  const std::lock_guard<std::mutex> lock(g_smem_mu);
  SmemEntry* empty = nullptr;
  SmemEntry* e = find_smem_entry(kernel, dev, &empty);
  if (e != nullptr && e->bytes.load(std::memory_order_relaxed) >= want) return;  // raised meanwhile
  OSP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, want));
  if (e != nullptr) {
    e->bytes.store(want, std::memory_order_release);
  } else if (empty != nullptr) {
    empty->dev.store(dev, std::memory_order_relaxed);
    empty->bytes.store(want, std::memory_order_relaxed);
    empty->kernel.store(kernel, std::memory_order_release);
  }
}

}  // namespace osprey::cuda
