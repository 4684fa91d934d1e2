// The ranks' agreement on a stop request (stop_request.h): every kStopPollSteps optimizer steps
// each rank contributes its flag to a one-float allreduce on the process group (on MPI the lane
// the gradients share, so it travels behind the step's buckets) that is read at the next poll,
// so no step waits for the network and every rank sees the same answer at the same step.
#pragma once

#include <memory>

#include "comm/process_group.h"

namespace ddp {

class StopPoll {
 public:
  explicit StopPoll(ProcessGroup& comm) : comm_(comm) {}
  /// Whether this optimizer step is one where the ranks poll.
  static bool due(int64_t global_step);
  /// Collective, at the same steps on every rank: whether any rank had a stop request at the
  /// previous poll. Starts this poll's allreduce.
  bool poll();
  /// Waits for the last poll's allreduce (before the communicator goes away).
  void finish();

 private:
  ProcessGroup& comm_;
  float flags_[2] = {0.0f, 0.0f};  // outlive the collective that reads them
  int slot_ = 0;
  std::shared_ptr<Work> work_;
};

}  // namespace ddp
