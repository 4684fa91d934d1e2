// The lr schedules against torch.optim.lr_scheduler's values at the points that define them
// (the whole sequences are compared with torch itself in tests/torch/reference.py), and the
// length of a run's schedule.
#include <catch2/catch.hpp>
#include <cmath>

#include "nn/lr_schedule.h"

namespace {

using ddp::LrSchedule;
using ddp::SchedulerConfig;
using ddp::SchedulerName;

SchedulerConfig schedule(SchedulerName name, int64_t warmup, double start_factor = 0.5) {
  SchedulerConfig s;
  s.name = name;
  s.warmup_steps = warmup;
  s.warmup_start_factor = start_factor;
  return s;
}

}  // namespace

TEST_CASE("lr schedule: the warmup rises linearly from start_factor x lr to lr", "[schedule]") {
  const LrSchedule s(schedule(SchedulerName::Constant, 4, 0.25), 0.8, 100);
  CHECK(s.lr(0) == 0.8 * 0.25);
  CHECK(s.lr(2) == Approx(0.8 * 0.625).epsilon(1e-15));
  CHECK(s.lr(4) == 0.8);
  CHECK(s.lr(99) == 0.8);
  CHECK(s.lr(1000) == 0.8);
}

TEST_CASE("lr schedule: cosine from lr at the warmup's end to min_lr at total_steps, then flat",
          "[schedule]") {
  SchedulerConfig c = schedule(SchedulerName::Cosine, 10);
  c.min_lr = 0.1;
  const LrSchedule s(c, 0.9, 110);
  CHECK(s.lr(10) == 0.9);
  CHECK(s.lr(60) == Approx(0.5).epsilon(1e-15));  // halfway: (lr + min_lr) / 2
  CHECK(s.lr(35) == Approx(0.1 + 0.8 * (1 + std::cos(M_PI / 4)) / 2).epsilon(1e-15));
  CHECK(s.lr(109) > 0.1);
  CHECK(s.lr(110) == 0.1);
  CHECK(s.lr(500) == 0.1);  // torch's CosineAnnealingLR would rise again; a run ends at min_lr
  // A run no longer than its warmup (training.max_steps) ends inside the warmup.
  const LrSchedule short_run(c, 0.9, 8);
  CHECK(short_run.lr(7) == Approx(0.9 * (0.5 + 0.5 * 7 / 10.0)).epsilon(1e-15));
  CHECK(short_run.lr(10) == 0.1);
}

TEST_CASE("lr schedule: linear decay to min_lr, step decays by gamma every step_size",
          "[schedule]") {
  SchedulerConfig lin = schedule(SchedulerName::Linear, 0);
  lin.min_lr = 0.0;
  const LrSchedule linear(lin, 2.0, 8);
  CHECK(linear.lr(0) == 2.0);
  CHECK(linear.lr(2) == 1.5);
  CHECK(linear.lr(8) == 0.0);
  CHECK(linear.lr(9) == 0.0);
  SchedulerConfig st = schedule(SchedulerName::Step, 2);
  st.step_size = 3;
  st.gamma = 0.5;
  const LrSchedule step(st, 1.0, 0);
  CHECK(step.lr(0) == 0.5);
  CHECK(step.lr(2) == 1.0);
  CHECK(step.lr(4) == 1.0);
  CHECK(step.lr(5) == 0.5);
  CHECK(step.lr(11) == 0.125);
}

TEST_CASE("lr schedule: the run's length is epochs x steps, or max_steps when smaller",
          "[schedule]") {
  ddp::TrainConfig cfg;
  cfg.training.epochs = 3;
  CHECK(ddp::schedule_total_steps(cfg, 40) == 120);
  cfg.training.max_steps = 50;
  CHECK(ddp::schedule_total_steps(cfg, 40) == 50);
  cfg.training.max_steps = 500;
  CHECK(ddp::schedule_total_steps(cfg, 40) == 120);
  cfg.scheduler.total_steps = 77;
  CHECK(ddp::schedule_total_steps(cfg, 40) == 77);
}
