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
#include "ddp/train_summary.h"

namespace ddp {

class MpiCommunicator;  // src/comm/mpi/mpi_communicator.h: the job's ranks and their collectives

class Trainer {
 public:
  /// Collective over comm's ranks, its control messages and (on the host, and as the staged GPU
  /// communicator's host side) its gradient buckets. `comm` (make_mpi_communicator) must be
  /// new: the trainer takes its gradient arena, which is handed out once. log: where rank 0
  /// prints progress (nullptr: silent).
  Trainer(const TrainConfig& cfg, MpiCommunicator& comm, std::ostream* log);
  ~Trainer();

  /// Trains for training.epochs (or training.max_steps), evaluating after each epoch.
  /// Collective. Writes metrics, checkpoints and the final weights on rank 0. A stop request
  /// (src/train/stop_request.h) on any rank ends training on every rank at the same step
  /// boundary with a checkpoint; the summary then says interrupted.
  TrainSummary run();

  /// The model's parameters as named tensors (layers.{i}.weight [out,in], layers.{i}.bias [out]).
  std::vector<NamedTensor> weights() const;

 private:
  TrainSummary train_and_save();

  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ddp
