// EventClock (see event_clock.h).
#include "core/clock.h"
#include "kernels/cuda/event_clock.h"

namespace ddp {
namespace cuda {

EventClock::EventClock(cudaStream_t stream) : stream_(stream) {
  DDP_CUDA_CHECK(cudaEventCreate(&anchor_));
  DDP_CUDA_CHECK(cudaEventCreate(&next_anchor_));
  DDP_CUDA_CHECK(cudaEventRecord(anchor_, stream_));
  DDP_CUDA_CHECK(cudaEventSynchronize(anchor_));
  anchor_host_ = seconds_now();
}

EventClock::~EventClock() {
  for (cudaEvent_t e : all_) (void)cudaEventDestroy(e);
  (void)cudaEventDestroy(anchor_);
  (void)cudaEventDestroy(next_anchor_);
}

cudaEvent_t EventClock::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) {
    cudaEvent_t e = nullptr;
    DDP_CUDA_CHECK(cudaEventCreate(&e));
    all_.push_back(e);
    return e;
  }
  cudaEvent_t e = free_.back();
  free_.pop_back();
  return e;
}

void EventClock::give_back(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(event);
}

double EventClock::seconds(cudaEvent_t event) {
  DDP_CUDA_CHECK(cudaEventSynchronize(event));
  std::lock_guard<std::mutex> lock(mutex_);
  if (next_recorded_) {
    const cudaError_t state = cudaEventQuery(next_anchor_);
    if (state == cudaSuccess) {
      float ms = 0.0f;
      DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, anchor_, next_anchor_));
      anchor_host_ += 1e-3 * static_cast<double>(ms);
      std::swap(anchor_, next_anchor_);
      next_recorded_ = false;
    } else if (state == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error; as PyTorch does, keep it off the error state
    } else {
      DDP_CUDA_CHECK(state);
    }
  }
  float ms = 0.0f;
  DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, anchor_, event));
  if (ms > 1000.0f && !next_recorded_) {
    DDP_CUDA_CHECK(cudaEventRecord(next_anchor_, stream_));
    next_recorded_ = true;
  }
  return anchor_host_ + 1e-3 * static_cast<double>(ms);
}

}  // namespace cuda
}  // namespace ddp
