// Continuing a run from a checkpoint (training.resume): rank 0 finds, reads and validates the
// file; every rank receives the weights, the momentum and the position, so other nodes need
// not see the file. A different world size is allowed; a different global batch is warned of.
#pragma once

#include <string>

#include "ddp/config.h"
#include "comm/process_group.h"
#include "io/training_checkpoint.h"
#include "train/replica.h"
#include "train/report.h"

namespace ddp {

/// Collective. Restores `replica` from the checkpoint training.resume names ("auto": the
/// newest in `checkpoint_dir`) and returns its position; returns false (and leaves `at`) when
/// there is nothing to resume.
bool resume_training(const TrainConfig& cfg, ProcessGroup& comm, Replica& replica, Reporter& report,
                     const std::string& checkpoint_dir, int64_t train_samples, TrainingState& at);

}  // namespace ddp
