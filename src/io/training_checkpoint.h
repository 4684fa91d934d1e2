// Training checkpoints: the model, the optimizer's state and where training stands, in one
// safetensors file per checkpoint (<dir>/step-<global step>.safetensors). The model tensors
// carry the final weights' names, so PyTorch loads a checkpoint like model.safetensors; each
// optimizer state array is stored as "optimizer.<state>.<name>" (optimizer.momentum.*,
// optimizer.exp_avg.*, ...) and where training stands as "ddp.*" metadata, with a CRC-32 over
// every tensor and metadata value so a flipped bit is found, not trained on.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/safetensors.h"

namespace ddp {

/// Where training stands at an optimizer-step boundary.
struct TrainingState {
  int64_t epoch = 0;            ///< the epoch to continue (0-based)
  int64_t step_in_epoch = 0;    ///< optimizer steps already taken in it
  int64_t epoch_position = 0;   ///< positions of the epoch's global sample order consumed
  int64_t global_step = 0;      ///< optimizer steps taken in total (skipped ones included)
  int64_t optimizer_steps = 0;  ///< updates the optimizer applied (> 0: its state is in use)
  int64_t skipped_steps = 0;    ///< steps skipped for non-finite gradients (nan_policy skip_step)
  int64_t scaler_skipped_steps = 0;  ///< steps skipped by loss scaling (the gradient overflowed)
  /// Loss scaling's scale (a float32 value) and growth tracker after the last step; 0 where the
  /// run had none, or the checkpoint predates it: a resumed run starts at loss_scale_init.
  double loss_scale = 0.0;
  int64_t loss_scale_growth_tracker = 0;
  /// The length of the run's lr schedule (scheduler.total_steps as resolved when the run
  /// started): a resumed run keeps it. 0 in checkpoints written before schedules existed.
  int64_t schedule_steps = 0;
  int64_t world_size = 0;     ///< ranks of the run that wrote it
  int64_t global_batch = 0;   ///< samples per optimizer step over all ranks
  int64_t train_samples = 0;  ///< size of the training set epoch_position refers to
  /// The epoch so far, summed over all ranks (so a resumed epoch reports the whole epoch).
  double epoch_loss_sum = 0.0, epoch_correct = 0.0, epoch_count = 0.0;
  /// The run that wrote it: random hex, made when a run starts fresh and kept by the runs that
  /// resume it, so pruning touches only this run's checkpoints. "" in checkpoints written
  /// before runs were named (never pruned).
  std::string run;
  /// "key = value" lines of the settings a resumed run must share (model, data order,
  /// optimizer, seed): compared line by line on resume. The batch and the world size may
  /// change (the resumed run warns that the global batch did).
  std::string config;
};

/// Every field of a TrainingState with its name, in one order: the checkpoint's metadata
/// ("ddp.<name>") is written and read, and a resumed position broadcast, by walking this list.
/// `visit(name, field)` is called with int64_t&, double& and std::string& fields.
template <typename State, typename Visit>
void visit_training_state(State& s, Visit&& visit) {
  visit("epoch", s.epoch);
  visit("step_in_epoch", s.step_in_epoch);
  visit("epoch_position", s.epoch_position);
  visit("global_step", s.global_step);
  visit("optimizer_steps", s.optimizer_steps);
  visit("skipped_steps", s.skipped_steps);
  visit("scaler_skipped_steps", s.scaler_skipped_steps);
  visit("loss_scale", s.loss_scale);
  visit("loss_scale_growth_tracker", s.loss_scale_growth_tracker);
  visit("schedule_steps", s.schedule_steps);
  visit("world_size", s.world_size);
  visit("global_batch", s.global_batch);
  visit("train_samples", s.train_samples);
  visit("epoch_loss_sum", s.epoch_loss_sum);
  visit("epoch_correct", s.epoch_correct);
  visit("epoch_count", s.epoch_count);
  visit("run", s.run);
  visit("config", s.config);
}

/// One state array of the optimizer ("momentum", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
/// as tensors with the weights' names and shapes.
struct OptimizerState {
  std::string name;
  std::vector<NamedTensor> tensors;
};

/// PowerSGD's state (distributed.compression powersgd), once it compressed a step: each rank's
/// error feedback, stored as "powersgd.error.<rank>.<weight>" with the weights' shapes, and the
/// Q of each weight sent as factors, "powersgd.q.<weight>" of shape [in, r] (none where its
/// bucket starts afresh), the same on every rank.
struct PowerSgdCheckpoint {
  std::vector<std::vector<NamedTensor>> error;  ///< [rank]: one per weight, with its name
  std::vector<NamedTensor> q;                   ///< with their weights' names
  bool empty() const { return error.empty() && q.empty(); }
};

struct TrainingCheckpoint {
  TrainingState state;
  std::vector<NamedTensor> weights;       ///< layers.{i}.weight [out,in], layers.{i}.bias [out]
  std::vector<OptimizerState> optimizer;  ///< in the optimizer's order; empty for plain SGD
  PowerSgdCheckpoint powersgd;            ///< empty without PowerSGD
};

/// "<dir>/step-<global_step, 9 digits>.safetensors".
std::string checkpoint_path(const std::string& dir, int64_t global_step);

/// Writes `ckpt` to `path` atomically and durably (temporary file, fsync, rename, fsync of
/// the directory): a crash or a full disk leaves either the old file or the new one. Throws
/// ddp::Error naming the path and the OS error.
void write_checkpoint(const std::string& path, const TrainingCheckpoint& ckpt);

/// Reads and validates a checkpoint: safetensors structure (header, dtypes, shapes, sizes,
/// truncation), the checksum, every state field, that each optimizer state and each rank's
/// PowerSGD error feedback holds exactly the weights' names and shapes (one error per rank of
/// the run that wrote it), and that each PowerSGD Q is [in, r] for a weight [out, in]. Throws
/// ddp::Error naming the file and what is wrong.
TrainingCheckpoint read_checkpoint(const std::string& path);

/// The complete checkpoints in `dir` (names step-N.safetensors; temporary files are not
/// complete), oldest first, as (global step, path). A missing directory has none.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

/// The run that wrote the checkpoint at `path` (its "ddp.run", from the header alone); "" for
/// one written before runs were named, or a file that is not a readable checkpoint.
std::string checkpoint_run(const std::string& path);

/// Keeps `written` (the checkpoint just written) and the newest `keep_last` - 1 other
/// checkpoints of run `run` (keep_last 0: keeps all) and removes that run's older ones; other
/// runs' checkpoints and unnamed ones are never removed. Also removes the temporary files of
/// interrupted writes whose writer is gone. Returns the paths removed.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last,
                                           const std::string& run, const std::string& written);

/// A new run's name: 16 random hex digits.
std::string new_run_name();

/// What a run about to resume expects of a checkpoint.
struct ResumeExpectation {
  std::vector<std::pair<std::string, std::vector<int64_t>>> parameters;  ///< names and shapes
  std::vector<std::string> optimizer_state;  ///< the state arrays this run's optimizer keeps
  int64_t train_samples = 0;
  std::string config;    ///< as TrainingState::config
  std::string defaults;  ///< the same lines for the default config
};

/// Throws ddp::Error (prefixed with `path`) when `ckpt` cannot continue this run: a parameter
/// missing, extra or of another shape, optimizer state missing or unexpected, another
/// training-set size, or a config line that differs (named: "optimizer.lr: checkpoint 0.1, this
/// run 0.01"). A line missing from the checkpoint is accepted when this run has the key's
/// default (`expected.defaults`): the key was added after the checkpoint was written.
/// A different world size is allowed (the caller warns: the global batch changes).
void check_resumable(const TrainingCheckpoint& ckpt, const std::string& path,
                     const ResumeExpectation& expected);

}  // namespace ddp
