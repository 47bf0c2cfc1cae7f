#include "core/tensor.h"

namespace osprey {

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[i]);
  }
  return s + "]";
}

}  // namespace osprey
