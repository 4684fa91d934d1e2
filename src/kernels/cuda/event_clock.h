// GPU times on the host's clock: CUDA events taken from a pool, recorded on any stream of the
// device, and converted to seconds_now() time once the device has passed them, without the
// host waiting when they are recorded. For the overlap statistics and the trace.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda/cuda_api.h"

namespace ddp {
namespace cuda {

class EventClock {
 public:
  /// Anchors the clock: one event on `stream`, waited for, read against seconds_now().
  explicit EventClock(cudaStream_t stream);
  ~EventClock();
  EventClock(const EventClock&) = delete;
  EventClock& operator=(const EventClock&) = delete;

  /// A timing event from the pool (created on first need); give it back when done.
  cudaEvent_t take();
  void give_back(cudaEvent_t event);

  /// The seconds_now() time at which the device reached `event` (recorded on any stream of
  /// this device). Waits for the event.
  double seconds(cudaEvent_t event);

 private:
  std::mutex mutex_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> free_, all_;
  // cudaEventElapsedTime is a float of milliseconds: precise to ~0.1 us over a second, to
  // ~60 us over an hour. The anchor therefore moves forward: a new one is recorded once an
  // event lies more than a second past it, and adopted (its host time derived from the old
  // anchor) once the device has passed it.
  cudaEvent_t anchor_ = nullptr, next_anchor_ = nullptr;
  double anchor_host_ = 0.0;
  bool next_recorded_ = false;
};

}  // namespace cuda
}  // namespace ddp
