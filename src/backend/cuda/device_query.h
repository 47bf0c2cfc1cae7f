// Facts about the current CUDA device that launch paths ask on every call,
// answered without a runtime call after the first (device_query.cpp).
#pragma once

namespace osprey::cuda {

// The calling thread's current device ordinal (cudaGetDevice); with one
// visible device, 0 without asking the runtime.
int current_device();

// Compute capability of device `dev` as major * 10 + minor (90 on an H100
// or H200), looked up once per ordinal; 0 when it cannot be read.
int device_sm(int dev);

}  // namespace osprey::cuda
