// The emulator's tests: deferred streams (cuda_emu.h) for the scope of an in-process test.
#pragma once

#include <limits>

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

}  // namespace ddp_emu_test
