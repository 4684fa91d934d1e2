// PowerSGD's state (distributed.compression powersgd) in and out of checkpoints: each rank's
// error feedback gathered to rank 0 and scattered back, Q (the same on every rank) named by
// its weights. A resumed run continues bitwise where the checkpoint holds the state of as many
// ranks with factors of the same rank; otherwise the state starts afresh and the run says why.
#pragma once

#include <cstdint>
#include <string>

#include "comm/process_group.h"
#include "io/training_checkpoint.h"
#include "train/replica.h"

namespace ddp {

/// Collective: the replica's PowerSGD state into `out` on rank 0 (left empty elsewhere, and
/// everywhere before the first compressed step or without PowerSGD).
void save_powersgd_state(ProcessGroup& comm, Replica& replica, PowerSgdCheckpoint& out);

/// Collective, after the weights are restored: a run resumed after `global_step` steps
/// continues PowerSGD's step count from there and restores `stored` (rank 0's checkpoint;
/// ignored elsewhere) where it fits this run. Returns the line to tell the user where the
/// state starts afresh, or "". Without PowerSGD: does nothing, returns "".
std::string resume_powersgd_state(ProcessGroup& comm, Replica& replica,
                                  const PowerSgdCheckpoint& stored, int64_t global_step);

}  // namespace ddp
