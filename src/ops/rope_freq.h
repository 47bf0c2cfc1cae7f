// Rotary inverse frequencies with the scalings Hugging Face applies.
#pragma once

#include <vector>

namespace osprey::ops {

struct RopeScalingParams {
  enum class Type { kNone, kLinear, kLlama3, kDynamic } type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

// inv_freq[i] = 1 / theta^(2i / rotary_dim), then scaled as transformers'
// ROPE_INIT_FUNCTIONS do for the given type. Dynamic NTK is applied as its
// value at max_position_embeddings or below (i.e. unscaled) for now.
std::vector<float> make_rope_inv_freq(float theta, int rotary_dim, const RopeScalingParams& s);

}  // namespace osprey::ops
