// When a run writes checkpoints and how: after every checkpoint.every_steps optimizer steps
// (one that ends an epoch waits for the epoch's evaluation), after every every_epochs epochs,
// on a stop request, and at the end of a run with periodic checkpoints that did not just write
// one. Rank 0 writes; every rank returns once the file is durable, or with checkpoint.async
// once rank 0 holds a copy that a thread writes while training goes on.
#pragma once

#include <cstdint>
#include <future>
#include <optional>
#include <string>

#include "comm/process_group.h"
#include "ddp/config.h"
#include "io/training_checkpoint.h"
#include "train/device_context.h"
#include "train/powersgd_state.h"
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
  /// full disk: the previous checkpoint is still there). With checkpoint.async it first waits
  /// for the previous one (settle), then returns once rank 0 holds a copy of the state.
  void save(TrainingState at, const Tally& epoch_tally);
  /// Collective: waits for the checkpoint being written in the background, if any, reports it,
  /// and throws its error on every rank. The run's end and a stop request call it, so a run
  /// never ends before its last checkpoint is durable.
  void settle();
  /// The newest checkpoint this run wrote and settled ("" if none).
  const std::string& last() const { return last_; }

 private:
  /// What rank 0's writer reports: the file's size and how long it took to write.
  struct Written {
    double megabytes = 0.0;
    double seconds = 0.0;
  };
  /// A checkpoint handed to the writer thread, from save to settle (the same on every rank).
  struct InFlight {
    TrainingState at;
    std::string path;
    double blocked_seconds = 0.0;  ///< what save cost the training thread
  };

  /// The optimizer's state arrays into snapshot_ (a collective for a sharded optimizer); the
  /// gradient path's (PowerSGD's) follows it through save_powersgd_state.
  void copy_optimizer_state();
  /// Rank 0: writes snapshot_ durably to `path`, then prunes this run's older checkpoints.
  Written write(const std::string& path) const;
  /// The "checkpoint" line and record of a checkpoint written at `at`.
  void report(const TrainingState& at, const std::string& path, double megabytes,
              double blocked_seconds, const Written* background);

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
  /// Rank 0's copy of what a checkpoint holds, its memory reused from one to the next (fresh
  /// pages cost more than the copy); the writer thread reads it until settle.
  TrainingCheckpoint snapshot_;
  std::vector<float> staging_;  ///< one arena-shaped array on its way into snapshot_
  std::optional<InFlight> in_flight_;
  std::future<Written> writing_;  ///< rank 0's writer thread (checkpoint.async)
};

}  // namespace ddp
