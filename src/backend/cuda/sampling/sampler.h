// The device sampler (sampler.cu): one block per sampled row. Semantics in
// src/sampling/device_sampling.h; every pointer is device memory.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "sampling/device_sampling.h"

namespace osprey::cuda {

struct SamplerArgs {
  const float* logits = nullptr;  // [logit rows, vocab]
  int64_t vocab = 0;
  int num_rows = 0;
  const DeviceSampleRow* rows = nullptr;  // [num_rows]
  const int32_t* edit_ids = nullptr;
  const float* edit_vals = nullptr;
  float* scratch = nullptr;               // [scratch rows, vocab]
  int32_t* tokens = nullptr;              // [num_rows]
  float* logprobs = nullptr;              // [num_rows]
  int32_t* ranks = nullptr;               // [num_rows]
  int32_t* top_ids = nullptr;             // [num_rows, kMaxDeviceTopLogprobs]
  float* top_logprobs = nullptr;          // [num_rows, kMaxDeviceTopLogprobs]
};

// Enqueues the sampler on `stream` (nothing when num_rows == 0).
void launch_sampler(const SamplerArgs& a, cudaStream_t stream);

// The uniform number of (seed, seq_index, position), computed on the device
// (tests compare it with sampling_uniform of src/sampling/rng.h).
void device_sampling_uniform(const uint64_t* seeds, const int32_t* seq_index, const int64_t* positions, int n,
                             double* out, cudaStream_t stream);

}  // namespace osprey::cuda
