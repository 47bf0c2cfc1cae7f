// Counter-based randomness for sampling: the uniform number used to sample
// token `position` of sequence `seq_index` of a request is a pure function of
// (seed, seq_index, position), so the output never depends on batch
// composition, on other requests or on preemption and recompute.
#pragma once

#include <cstdint>

namespace osprey {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits.
inline double sampling_uniform(uint64_t seed, int seq_index, int64_t position) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ (static_cast<uint64_t>(seq_index) * 0xd1b54a32d192ed03ULL));
  h = splitmix64(h ^ static_cast<uint64_t>(position));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace osprey
