// CudaBackend's device runtime (ops::Backend "device runtime" block): pinned
// host memory, copies queued on the compute stream, the memory report,
// device sampling (sampling/sampler.cu) and graph capture (graphs/).
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/graphs/cuda_graph.h"
#include "backend/cuda/sampling/sampler.h"

namespace osprey::cuda {

void* CudaBackend::alloc_host(size_t bytes) {
  bind_device();
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();  // out of pinned memory: reported by returning null
    return nullptr;
  }
  std::memset(p, 0, bytes);
  return p;
}

void CudaBackend::free_host(void* p) {
  if (!p) return;
  bind_device();
  OSP_CUDA_CHECK(cudaStreamSynchronize(stream_));  // queued copies may still use p
  OSP_CUDA_CHECK(cudaFreeHost(p));
}

void CudaBackend::copy_to_device_async(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  bind_device();
  OSP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

void CudaBackend::copy_to_host_async(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  bind_device();
  OSP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

void CudaBackend::copy_device_to_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  bind_device();
  OSP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

bool CudaBackend::memory_info(size_t& free_bytes, size_t& total_bytes) {
  bind_device();
  OSP_CUDA_CHECK(cudaStreamSynchronize(stream_));  // frees queued behind work are done
  OSP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return true;
}

void CudaBackend::sample(const SampleBatch& b) {
  if (b.num_rows <= 0) return;
  bind_device();
  SamplerArgs a;
  a.logits = b.logits;
  a.vocab = b.vocab;
  a.num_rows = b.num_rows;
  a.rows = static_cast<const DeviceSampleRow*>(b.rows);
  a.edit_ids = b.edit_ids;
  a.edit_vals = b.edit_vals;
  a.scratch = b.scratch;
  a.tokens = b.tokens;
  a.logprobs = b.logprobs;
  a.ranks = b.ranks;
  a.top_ids = b.top_ids;
  a.top_logprobs = b.top_logprobs;
  launch_sampler(a, stream_);
}

void CudaBackend::begin_capture() {
  bind_device();
  // Relaxed: an allocation made during capture (a scratch buffer's first use)
  // is not an error; the executor warms every captured shape up first anyway.
  OSP_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
}

std::unique_ptr<ops::Backend::Graph> CudaBackend::end_capture() {
  bind_device();
  return end_capture_on(stream_, options_.device_index);
}

}  // namespace osprey::cuda
