// The epoch loop of a run (TrainLoop::run): each epoch hands its optimizer steps to the
// StepPipeline and tallies and reports each step's result once it is read (at once on the host,
// one step later on a GPU), then evaluates, reports and checkpoints. It ends at training.epochs,
// at training.max_steps or at a stop request the ranks agreed on (then with a checkpoint).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "comm/process_group.h"
#include "ddp/config.h"
#include "ddp/train_summary.h"
#include "io/training_checkpoint.h"
#include "nn/lr_schedule.h"
#include "train/checkpoint_policy.h"
#include "train/device_context.h"
#include "train/replica.h"
#include "train/report.h"
#include "train/step.h"
#include "train/stop_poll.h"
#include "train/straggler.h"
#include "train/training_data.h"

namespace ddp {

/// The parts of a run the loop drives; all outlive it.
struct RunParts {
  const TrainConfig& cfg;
  ProcessGroup& comm;
  DeviceContext& ctx;
  TrainingData& data;
  Replica& replica;
  Reporter& report;
  CheckpointPolicy& checkpoints;
};

class TrainLoop {
 public:
  /// `start`: where training stands (a checkpoint's position when `resumed`).
  TrainLoop(const RunParts& parts, const TrainingState& start, bool resumed);
  /// Collective. Trains to the end (or a stop) and returns what happened.
  TrainSummary run();

 private:
  /// One epoch's place in the data.
  struct Epoch {
    int64_t index = 0;          ///< 0-based
    int64_t position = 0;       ///< samples of the epoch's global order consumed
    int64_t step_in_epoch = 0;  ///< optimizer steps taken in it
    int64_t batches = 0;        ///< this rank's micro-batches in it (from the start position)
    int64_t shard = 0;          ///< this rank's samples in it
    double restored_count = 0;  ///< samples a resumed epoch had trained before the checkpoint
    double start_time = 0;
    bool complete = false;        ///< the last step ended the epoch
    bool checkpoint_due = false;  ///< a step checkpoint waits for the epoch's evaluation
  };

  Epoch begin_epoch(int64_t index);
  void train_steps(Epoch& e);
  bool after_step(Epoch& e, int64_t rows, const std::optional<StepResult>& read);
  bool end_epoch(Epoch& e);
  void report_epoch(const Epoch& e, const Tally& train, double seconds, double trained);
  Tally evaluate();
  TrainSummary finish();

  void note_scaler();
  void read_step(const StepResult& r);
  void read_all_steps();
  void progress_line(const StepResult& rec);
  IntervalReport gather_rank_splits(double interval_end);
  void note_stragglers_and_mfu();
  bool logged(int64_t global_step) const;
  bool traced_now() const;
  const Batch* next_train_batch();

  RunParts p_;
  Backend& be_;
  StepPipeline pipeline_;
  StopPoll stop_poll_;
  const LrSchedule schedule_;
  std::unique_ptr<BatchFeed> train_feed_, test_feed_;
  const TrainingState start_;
  TrainingState at_;  ///< where training stands after the last step: what a checkpoint records
  TrainSummary sum_;
  int64_t first_step_ = 0;  ///< this run's steps are traced and timed from here
  bool stop_ = false;
  bool traced_ = false;  ///< the current step is traced (and its batch waits)
  bool shapes_printed_ = false;
  Tally epoch_tally_, log_tally_;
  int64_t steps_in_epoch_ = 0;
  double run_start_ = 0, log_start_ = 0, train_seconds_ = 0;
  /// The per-rank report: rank 0's output.straggler_threshold (0: off), the rank's waits since
  /// the last progress line (the loader's total at its start; the steps' collective waits), and
  /// which rank was slowest at each logged interval.
  double straggler_threshold_ = 0;
  double log_data_wait_start_ = 0;
  WaitTally log_waits_;
  StragglerTally stragglers_;
};

}  // namespace ddp
