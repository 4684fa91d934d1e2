// What a training run did: steps, samples, the last epoch's losses and accuracies, where the
// time went, how it ended (Trainer::run returns it; the summary line and record show it).
#pragma once

#include <cstdint>
#include <string>

namespace ddp {

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
  int64_t scaler_skipped_steps = 0;  ///< steps skipped by loss scaling (the gradient overflowed)
  int64_t graph_steps = 0;  ///< steps whose device work ran as a CUDA graph (training.cuda_graphs)
  double loss_scale = 0.0;  ///< loss scaling's scale at the end; 0: no loss scaling
  /// The per-rank report (output.straggler_threshold; 0: it was off): logged intervals, those
  /// whose skew (the slowest rank's compute + data wait over the median's) passed the threshold,
  /// and the rank slowest at more than half of those (at least 3); -1: none.
  double straggler_threshold = 0.0;
  int64_t logged_intervals = 0;
  int64_t straggler_flagged = 0;
  int straggler_rank = -1;
  int64_t straggler_slowest_at = 0;  ///< flagged intervals where straggler_rank was the slowest
  double straggler_skew = 0.0;       ///< its mean skew over those
  /// Model FLOPs utilisation: flops_per_sample x samples_per_sec / (peak_flops x ranks).
  double flops_per_sample = 0.0;
  double peak_flops = 0.0;  ///< one rank's peak FLOP/s; 0: unknown (then mfu is too)
  std::string peak_source;  ///< where peak_flops came from
  double mfu = 0.0;
  bool resumed = false;     ///< continued from a checkpoint
  /// Stopped by SIGTERM/SIGINT/SIGUSR1 (src/train/stop_request.h) after writing a checkpoint;
  /// stop_signal says which.
  bool interrupted = false;
  int stop_signal = 0;
  std::string last_checkpoint;  ///< the newest checkpoint this run wrote ("" if none)
  /// Share of allreduce time hidden behind backward (1 when nothing was communicated).
  double overlap() const { return comm_seconds > 0 ? hidden_seconds / comm_seconds : 1.0; }
};

}  // namespace ddp
