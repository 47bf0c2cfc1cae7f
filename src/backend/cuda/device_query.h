// Facts about the current CUDA device that launch paths ask on every call,
// answered without a runtime call after the first (device_query.cpp), and the
// per-device kernel attribute that launches set once.
#pragma once

#include <cstddef>

namespace osprey::cuda {

// The calling thread's current device ordinal (cudaGetDevice); with one
// visible device, 0 without asking the runtime.
int current_device();

// Compute capability of device `dev` as major * 10 + minor (90 on an H100
// or H200), looked up once per ordinal; 0 when it cannot be read.
int device_sm(int dev);

// Lets `kernel` (a __global__ function's host stub) launch with up to `bytes`
// of dynamic shared memory on the current device
// (cudaFuncAttributeMaxDynamicSharedMemorySize). The runtime is called only
// when `bytes` exceeds the largest size already set for this (device, kernel)
// pair, so every later launch, graph captures included, makes no runtime call
// here. Thread-safe; after the first raise, lock- and allocation-free.
// Precondition: bytes <= INT_MAX (checked).
void set_max_dynamic_smem_once(const void* kernel, size_t bytes);

template <class Kernel>
void set_max_dynamic_smem_once(Kernel* kernel, size_t bytes) {
  set_max_dynamic_smem_once(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace osprey::cuda
