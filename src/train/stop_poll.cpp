// Polling for stop requests (stop_poll.h).
#include "train/stop_poll.h"

#include "train/stop_request.h"

namespace ddp {

bool StopPoll::due(int64_t global_step) { return global_step % kStopPollSteps == 0; }

bool StopPoll::poll() {
  bool agreed = false;
  if (work_) {
    work_->wait();
    agreed = flags_[slot_ ^ 1] > 0.0f;
  }
  flags_[slot_] = stop_requested() != 0 ? 1.0f : 0.0f;
  work_ = comm_.allreduce_async(&flags_[slot_], 1, ReduceOp::Sum);
  slot_ ^= 1;
  return agreed;
}

void StopPoll::finish() {
  if (work_) work_->wait();
}

}  // namespace ddp
