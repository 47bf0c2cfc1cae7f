// DeviceBuffer: owned device memory (cudaMalloc), freed on destruction.
// Scratch buffers grow only: reserve() keeps the buffer when it is already
// large enough, so steady-state steps allocate nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace osprey::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  // Ensures at least `bytes` bytes. Growing waits for `stream` first, since
  // work queued on it may still read the old buffer; contents are not kept.
  void* reserve(size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return ptr_;
    // Grow by at least 1.5x so slowly growing shapes do not reallocate every step.
    const size_t want = std::max(bytes, bytes_ + bytes_ / 2);
    if (ptr_) OSP_CUDA_CHECK(cudaStreamSynchronize(stream));
    reset();
    OSP_CUDA_CHECK(cudaMalloc(&ptr_, want));
    bytes_ = want;
    return ptr_;
  }

  template <class T>
  T* reserve_as(size_t count, cudaStream_t stream) {
    return static_cast<T*>(reserve(count * sizeof(T), stream));
  }

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

  void reset() {
    if (ptr_) OSP_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace osprey::cuda
