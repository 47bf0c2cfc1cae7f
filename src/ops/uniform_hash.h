// The counter-based hash behind Backend::fill_uniform, shared by the host and
// the CUDA kernels so that every backend fills the same values from a seed.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OSP_HOST_DEVICE __host__ __device__
#else
#define OSP_HOST_DEVICE
#endif

namespace osprey::ops {

// u in [0, 1) with 24 random bits: splitmix64 of (seed, index).
OSP_HOST_DEVICE inline float uniform_hash01(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0xD1B54A32D192ED03ull + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<uint32_t>(z >> 40)) * (1.0f / 16777216.0f);
}

}  // namespace osprey::ops
