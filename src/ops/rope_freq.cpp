#include "ops/rope_freq.h"

#include <cmath>

namespace osprey::ops {

std::vector<float> make_rope_inv_freq(float theta, int rotary_dim, const RopeScalingParams& s) {
  const int half = rotary_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    // Computed like torch: base ** (arange(0, dim, 2).float() / dim), in fp32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    inv[i] = 1.0f / std::pow(theta, expo);
  }
  if (s.type == RopeScalingParams::Type::kLinear) {
    for (float& f : inv) f /= s.factor;
  } else if (s.type == RopeScalingParams::Type::kLlama3) {
    const float old_len = static_cast<float>(s.original_max_position_embeddings);
    const float low_wavelen = old_len / s.low_freq_factor;
    const float high_wavelen = old_len / s.high_freq_factor;
    const float pi = 3.14159265358979323846f;
    for (float& f : inv) {
      const float wavelen = 2.0f * pi / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        const float smooth = (old_len / wavelen - s.low_freq_factor) /
                             (s.high_freq_factor - s.low_freq_factor);
        f = (1.0f - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

}  // namespace osprey::ops
