// The emulator's tests: deferred streams (cuda_emu.h) for the scope of an in-process test.
#pragma once

#include "cuda_emu.h"

namespace ddp_emu_test {

/// Deferred mode for the scope of a test; the mode before comes back (running what is queued).
class DeferredStreams {
 public:
  DeferredStreams() : before_(ddp_emu::stream_mode()) {
    ddp_emu::set_stream_mode(ddp_emu::StreamMode::kDeferred);
  }
  ~DeferredStreams() { ddp_emu::set_stream_mode(before_); }
  DeferredStreams(const DeferredStreams&) = delete;
  DeferredStreams& operator=(const DeferredStreams&) = delete;

 private:
  ddp_emu::StreamMode before_;
};

}  // namespace ddp_emu_test
