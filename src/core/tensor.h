// Tensor: a non-owning view of contiguous row-major data on one device.
// Quantised tensors are 2-D [rows, cols] with cols a multiple of the block
// size; row r starts at data + r * row_bytes().
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace osprey {

enum class Device : uint8_t { kCpu, kCuda };

class Tensor {
 public:
  static constexpr int kMaxDims = 4;

  Tensor() = default;
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = Device::kCpu)
      : data_(data), dtype_(dtype), device_(device) {
    OSP_CHECK_LE(shape.size(), static_cast<size_t>(kMaxDims));
    for (int64_t s : shape) shape_[ndim_++] = s;
  }
  Tensor(void* data, DType dtype, const int64_t* shape, int ndim, Device device = Device::kCpu)
      : data_(data), dtype_(dtype), device_(device) {
    OSP_CHECK_LE(ndim, kMaxDims);
    for (int i = 0; i < ndim; ++i) shape_[ndim_++] = shape[i];
  }

  bool defined() const { return data_ != nullptr; }
  void* data() const { return data_; }
  template <class T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t dim(int i) const {
    if (i < 0) i += ndim_;
    OSP_CHECK(i >= 0 && i < ndim_);
    return shape_[i];
  }
  const int64_t* shape() const { return shape_.data(); }

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= shape_[i];
    return n;
  }
  // Elements in the last dimension; rows = numel / cols.
  int64_t cols() const { return ndim_ == 0 ? 1 : shape_[ndim_ - 1]; }
  int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }
  int64_t row_bytes() const { return dtype_row_bytes(dtype_, cols()); }
  int64_t nbytes() const { return rows() * row_bytes(); }

  // Pointer to row r (all dimensions but the last flattened).
  void* row(int64_t r) const { return static_cast<char*>(data_) + r * row_bytes(); }

  // Same data, new shape with the same number of elements.
  Tensor view(std::initializer_list<int64_t> shape) const {
    Tensor t(data_, dtype_, shape, device_);
    OSP_CHECK_EQ(t.numel(), numel());
    return t;
  }
  // Entries [begin, begin + n) of the first dimension.
  Tensor slice(int64_t begin, int64_t n) const {
    OSP_CHECK(ndim_ >= 1 && begin >= 0 && n >= 0 && begin + n <= shape_[0]);
    Tensor t = *this;
    const int64_t rows_per_entry = ndim_ == 1 ? 1 : rows() / (shape_[0] == 0 ? 1 : shape_[0]);
    if (ndim_ == 1) {
      t.data_ = static_cast<char*>(data_) + begin * dtype_block_bytes(dtype_) / dtype_block_elems(dtype_);
    } else {
      t.data_ = row(begin * rows_per_entry);
    }
    t.shape_[0] = n;
    return t;
  }

  std::string shape_string() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
};

}  // namespace osprey
