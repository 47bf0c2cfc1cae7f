// CudaGraph: an instantiated CUDA graph replayed on the backend's stream
// (ops::Backend::Graph). Capture itself: CudaBackend::begin_capture /
// end_capture (cuda_runtime.cpp).
#pragma once

#include <memory>

#include <cuda_runtime_api.h>

#include "ops/backend.h"

namespace osprey::cuda {

class CudaGraph final : public ops::Backend::Graph {
 public:
  // Takes ownership of exec; launches on stream of device `device`.
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream, int device) : exec_(exec), stream_(stream), device_(device) {}
  ~CudaGraph() override;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void launch() override;

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  int device_;
};

// Ends the capture on `stream` and instantiates it; null (with the reason
// on stderr) when capture failed or instantiation is impossible.
std::unique_ptr<ops::Backend::Graph> end_capture_on(cudaStream_t stream, int device);

}  // namespace osprey::cuda
