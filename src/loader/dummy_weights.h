// Random ("dummy") weights for benchmarks of real model shapes without weight
// files (`--load-format dummy`). This file knows where a dummy model's
// config comes from and how each tensor is filled; the Model allocates the
// tensors on its backend and fills them there (Backend::fill_uniform), so a
// GPU model needs no host buffer of its size.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "osprey/status.h"

namespace osprey {

// config.json text of a dummy model: `path` is a config.json file or a folder
// holding one. (Bundled config names are resolved by the model before this.)
struct DummyConfigText {
  std::string json;
  std::string origin;  // the file read, for error messages
};
Expected<DummyConfigText> read_dummy_config(const std::string& path);

// How one tensor is filled: values uniform in [lo, hi) from `seed`.
struct DummyFill {
  float lo = 0.0f;
  float hi = 0.0f;
  uint64_t seed = 0;
};

// Standard deviation of the random matrices (as the usual 0.02 init): the
// values are uniform in [-a, a) with a = kDummyStd * sqrt(3).
inline constexpr float kDummyStd = 0.02f;

// The fill of tensor `name` (canonical Hugging Face names, see
// loader/weights.h) for a model seed: norm weights ("...norm.weight") are 1,
// biases uniform in [-0.01, 0.01), everything else uniform with standard
// deviation kDummyStd. The seed depends on the name, so a tensor's values do
// not depend on the order in which tensors are made.
DummyFill dummy_fill(std::string_view name, uint64_t model_seed);

}  // namespace osprey
