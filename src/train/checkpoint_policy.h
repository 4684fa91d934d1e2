// When a run writes checkpoints and how: after every checkpoint.every_steps optimizer steps
// (one that ends an epoch waits for the epoch's evaluation), after every every_epochs epochs,
// on a stop request, and at the end of a run with periodic checkpoints that did not just write
// one. Rank 0 writes; every rank returns once the file is durable.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/config.h"
#include "comm/process_group.h"
#include "io/training_checkpoint.h"
#include "train/device_context.h"
#include "train/replica.h"
#include "train/report.h"

namespace ddp {

class CheckpointPolicy {
 public:
  CheckpointPolicy(const TrainConfig& cfg, ProcessGroup& comm, DeviceContext& ctx, Replica& replica,
                   Reporter& report, int64_t train_samples);

  const std::string& dir() const { return dir_; }
  /// The run the checkpoints belong to (TrainingState::run): a resumed run's, or a new one.
  /// Pruning (checkpoint.keep_last) removes only this run's checkpoints.
  void set_run(const std::string& run) { run_ = run; }
  const std::string& run() const { return run_; }
  /// A checkpoint is due after this optimizer step / after this (1-based) epoch.
  bool due_after_step(int64_t global_step) const;
  bool due_after_epoch(int64_t epochs_done) const;
  /// At the end of training: whether the last step still needs one (a run with periodic
  /// checkpoints leaves one of its last step, so it can be extended with --resume auto).
  bool due_at_end(int64_t global_step, int64_t first_step) const;

  /// Collective: writes the checkpoint of position `at`, with the epoch's loss and accuracy
  /// so far (this rank's tally, reduced here); throws the writer's error on every rank (a
  /// full disk: the previous checkpoint is still there).
  void save(TrainingState at, const Tally& epoch_tally);
  /// The newest checkpoint this run wrote ("" if none).
  const std::string& last() const { return last_; }

 private:
  const TrainConfig& cfg_;
  ProcessGroup& comm_;
  DeviceContext& ctx_;
  Replica& replica_;
  Reporter& report_;
  int64_t train_samples_;
  std::string dir_;
  std::string last_;
  std::string run_;
  int64_t last_step_ = -1;
};

}  // namespace ddp
