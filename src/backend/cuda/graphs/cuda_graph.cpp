#include "backend/cuda/graphs/cuda_graph.h"

#include <cstdio>

#include "backend/cuda/cuda_check.h"

namespace osprey::cuda {

CudaGraph::~CudaGraph() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != device_) (void)cudaSetDevice(device_);
  (void)cudaGraphExecDestroy(exec_);
}

void CudaGraph::launch() {
  int current = -1;
  OSP_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device_) OSP_CUDA_CHECK(cudaSetDevice(device_));
  OSP_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
}

std::unique_ptr<ops::Backend::Graph> end_capture_on(cudaStream_t stream, int device) {
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(stream, &graph);
  if (err != cudaSuccess || !graph) {
    std::fprintf(stderr, "osprey: CUDA graph capture failed (%s); decode steps run eagerly\n", cudaGetErrorString(err));
    (void)cudaGetLastError();
    if (graph) (void)cudaGraphDestroy(graph);
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "osprey: CUDA graph instantiation failed (%s); decode steps run eagerly\n",
                 cudaGetErrorString(err));
    (void)cudaGetLastError();
    return nullptr;
  }
  return std::make_unique<CudaGraph>(exec, stream, device);
}

}  // namespace osprey::cuda
