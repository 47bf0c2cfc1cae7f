// CudaBackend timer marks (ops::Backend::timer_mark / timer_elapsed_ms) for
// the per-op profile (ops/profiling_backend.h): a ring of kTimerMarksHeld
// CUDA events, created on first use. Mark i is recorded on the compute
// stream into event i % kTimerMarksHeld, so it stays readable until
// kTimerMarksHeld later marks have been taken.
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"

namespace osprey::cuda {

struct CudaBackend::MarkEvents {
  std::vector<cudaEvent_t> events;  // [kTimerMarksHeld]
  uint64_t next = 0;                // id of the next mark
  MarkEvents() {
    events.resize(ops::Backend::kTimerMarksHeld, nullptr);
    for (auto& e : events) OSP_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~MarkEvents() {
    for (auto& e : events)
      if (e) (void)cudaEventDestroy(e);
  }
  MarkEvents(const MarkEvents&) = delete;
  MarkEvents& operator=(const MarkEvents&) = delete;
};

uint64_t CudaBackend::timer_mark() {
  bind_device();
  if (!marks_) marks_ = std::make_shared<MarkEvents>();
  const uint64_t id = marks_->next++;
  OSP_CUDA_CHECK(cudaEventRecord(marks_->events[id % kTimerMarksHeld], stream_));
  return id;
}

double CudaBackend::timer_elapsed_ms(uint64_t a, uint64_t b) {
  if (!marks_ || a > b || b >= marks_->next || marks_->next - a > kTimerMarksHeld) return -1.0;
  bind_device();
  cudaEvent_t ea = marks_->events[a % kTimerMarksHeld];
  cudaEvent_t eb = marks_->events[b % kTimerMarksHeld];
  OSP_CUDA_CHECK(cudaEventSynchronize(eb));
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, ea, eb) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1.0;
  }
  return ms;
}

}  // namespace osprey::cuda
