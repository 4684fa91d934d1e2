// Learning-rate schedules (lr_schedule.h). Each phase is torch's closed form
// (_get_closed_form_lr), its operations in the same order.
#include "nn/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace ddp {

LrSchedule::LrSchedule(const SchedulerConfig& cfg, double base_lr, int64_t total_steps)
    : cfg_(cfg), base_lr_(base_lr), total_steps_(total_steps) {
  DDP_CHECK(base_lr > 0, "LrSchedule: lr " << base_lr << " (must be > 0)");
  DDP_CHECK(cfg.name != SchedulerName::Step || cfg.step_size >= 1,
            "scheduler.step_size: required (>= 1) for scheduler.name step");
}

double LrSchedule::lr(int64_t steps_done) const {
  const int64_t w = cfg_.warmup_steps;
  if (steps_done < w) {
    // LinearLR(start_factor=f, end_factor=1, total_iters=w).
    const double f = cfg_.warmup_start_factor;
    return base_lr_ * (f + (1.0 - f) * static_cast<double>(steps_done) / static_cast<double>(w));
  }
  return after_warmup(steps_done - w);
}

double LrSchedule::after_warmup(int64_t e) const {
  const double decay_steps = static_cast<double>(total_steps_ - cfg_.warmup_steps);
  const double t = static_cast<double>(e);
  switch (cfg_.name) {
    case SchedulerName::Constant:
      return base_lr_;
    case SchedulerName::Step:
      // StepLR: gamma ** (last_epoch // step_size).
      return base_lr_ * std::pow(cfg_.gamma, static_cast<double>(e / cfg_.step_size));
    case SchedulerName::Cosine:
      // CosineAnnealingLR(T_max = decay_steps, eta_min = min_lr).
      if (t >= decay_steps) return cfg_.min_lr;  // also a run no longer than its warmup
      return cfg_.min_lr +
             (base_lr_ - cfg_.min_lr) * (1.0 + std::cos(M_PI * t / decay_steps)) / 2.0;
    case SchedulerName::Linear: {
      // LinearLR(start_factor=1, end_factor=min_lr/lr, total_iters=decay_steps).
      if (decay_steps <= 0) return cfg_.min_lr;  // a run no longer than its warmup
      const double end_factor = cfg_.min_lr / base_lr_;
      return base_lr_ * (1.0 + (end_factor - 1.0) * std::min(t, decay_steps) / decay_steps);
    }
  }
  return base_lr_;
}

int64_t schedule_total_steps(const TrainConfig& cfg, int64_t steps_per_epoch) {
  if (cfg.scheduler.total_steps > 0) return cfg.scheduler.total_steps;
  const int64_t run = cfg.training.epochs * steps_per_epoch;
  const int64_t max_steps = cfg.training.max_steps;
  return max_steps > 0 ? std::min(run, max_steps) : run;
}

}  // namespace ddp
