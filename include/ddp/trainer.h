// The training loop: builds data, model, bucket plan, Reducer and optimizer from a TrainConfig,
// makes sure every rank holds the same model, then trains and evaluates epoch by epoch.
// Rank 0 logs progress, writes <output.dir>/metrics.jsonl, model.safetensors and the
// checkpoints (training_checkpoint.h) that training.resume continues from.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "ddp/config.h"
#include "ddp/safetensors.h"

namespace ddp {

class ProcessGroup;          // src/comm/process_group.h: the ranks of the job, control messages
class GradientCommunicator;  // src/comm/gradient_communicator.h: the gradient buckets' allreduce

struct TrainSummary {
  int64_t epochs = 0;    ///< epochs started
  int64_t steps = 0;     ///< optimizer steps taken
  int64_t samples = 0;   ///< training samples processed, all ranks
  double seconds = 0.0;  ///< wall time of the training loop (evaluation excluded)
  double samples_per_sec = 0.0;
  double train_loss = 0.0;  ///< mean over the last epoch, all ranks
  double train_accuracy = 0.0;
  bool evaluated = false;
  double test_loss = 0.0;
  double test_accuracy = 0.0;
  double comm_seconds = 0.0;    ///< this rank's allreduce execution time
  double hidden_seconds = 0.0;  ///< part of it that ran while backward was computing
  double wait_seconds = 0.0;    ///< time the training thread waited for allreduces
  double data_wait_seconds = 0.0;
  int64_t skipped_steps = 0;  ///< steps skipped for non-finite gradients (nan_policy skip_step)
  bool resumed = false;       ///< continued from a checkpoint
  /// Stopped by SIGTERM/SIGINT/SIGUSR1 (stop.h) after writing a checkpoint; stop_signal says which.
  bool interrupted = false;
  int stop_signal = 0;
  std::string last_checkpoint;  ///< the newest checkpoint this run wrote ("" if none)
  /// Share of allreduce time hidden behind backward (1 when nothing was communicated).
  double overlap() const { return comm_seconds > 0 ? hidden_seconds / comm_seconds : 1.0; }
};

class Trainer {
 public:
  /// Collective over group. host_gradients (over the same ranks; make_mpi_communicator gives
  /// one object that is both) must be new: the trainer takes its gradient arena
  /// (GradientCommunicator::gradient_arena is handed out once), for the buckets on the CPU and
  /// as the staged GPU communicator's host side. log: where rank 0 prints progress (nullptr:
  /// silent).
  Trainer(const TrainConfig& cfg, ProcessGroup& group, GradientCommunicator& host_gradients,
          std::ostream* log);
  ~Trainer();

  /// Trains for training.epochs (or training.max_steps), evaluating after each epoch.
  /// Collective. Writes metrics, checkpoints and the final weights on rank 0. A stop request
  /// (stop.h) on any rank ends training on every rank at the same step boundary with a
  /// checkpoint; the summary then says interrupted.
  TrainSummary run();

  /// The model's parameters as named tensors (layers.{i}.weight [out,in], layers.{i}.bias [out]).
  std::vector<NamedTensor> weights() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ddp
