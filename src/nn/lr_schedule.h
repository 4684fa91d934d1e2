// The learning rate of every optimizer step (scheduler.* in the config), in closed form, as
// torch.optim.lr_scheduler's chainable schedulers give it when composed with SequentialLR:
// a linear warmup (LinearLR from warmup_start_factor·lr to lr over warmup_steps), then
//   constant  lr
//   step      StepLR: lr · gamma^⌊e / step_size⌋
//   cosine    CosineAnnealingLR: min_lr + (lr − min_lr)·(1 + cos(π·e / T)) / 2
//   linear    LinearLR from lr to min_lr
// where e counts the steps after the warmup and T = total_steps − warmup_steps; cosine and
// linear stay at min_lr after T. The lr depends only on the number of steps taken, so a resumed
// run (which keeps the original run's total_steps) continues the same schedule.
#pragma once

#include <cstdint>

#include "ddp/config.h"

namespace ddp {

class LrSchedule {
 public:
  /// `total_steps`: warmup and decay together (cosine, linear), as schedule_total_steps gives it.
  LrSchedule(const SchedulerConfig& cfg, double base_lr, int64_t total_steps);

  /// The lr of the optimizer step that follows `steps_done` steps (0: the first step).
  double lr(int64_t steps_done) const;

  int64_t total_steps() const { return total_steps_; }

 private:
  double after_warmup(int64_t e) const;

  SchedulerConfig cfg_;
  double base_lr_;
  int64_t total_steps_;
};

/// The length of a run's schedule: scheduler.total_steps when set, else the run's optimizer
/// steps: epochs × `steps_per_epoch`, or training.max_steps when that is smaller.
int64_t schedule_total_steps(const TrainConfig& cfg, int64_t steps_per_epoch);

}  // namespace ddp
