// The emulator's tests: deferred streams (cuda_emu.h) for the scope of an in-process test.
#pragma once

#include <chrono>
#include <initializer_list>
#include <limits>
#include <thread>

#include "cuda_emu.h"

namespace ddp_emu_test {

/// Deferred mode for the scope of a test, with a device lag (by default never: only the test's
/// own synchronisations run queued work, so what it finds queued does not depend on its pace);
/// the mode and the lag before come back (running what is queued).
class DeferredStreams {
 public:
  explicit DeferredStreams(double lag = std::numeric_limits<double>::infinity())
      : before_(ddp_emu::stream_mode()), lag_before_(ddp_emu::device_lag()) {
    ddp_emu::set_device_lag(lag);
    ddp_emu::set_stream_mode(ddp_emu::StreamMode::kDeferred);
  }
  ~DeferredStreams() {
    ddp_emu::set_stream_mode(before_);
    ddp_emu::set_device_lag(lag_before_);
  }
  DeferredStreams(const DeferredStreams&) = delete;
  DeferredStreams& operator=(const DeferredStreams&) = delete;

 private:
  ddp_emu::StreamMode before_;
  double lag_before_;
};

/// Polls, running nothing, until nothing is queued on `streams`; false after `seconds`.
inline bool drained_within(double seconds, std::initializer_list<cudaStream_t> streams) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  for (;;) {
    int64_t queued = 0;
    for (cudaStream_t s : streams) queued += ddp_emu::queued_operations(s);
    if (queued == 0) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace ddp_emu_test
