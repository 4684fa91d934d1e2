// Dynamic loss scaling under mpiexec, on the CPU path (fp32 and bf16 with training.loss_scaling
// on, as GradScaler allows with any precision). Scaling by 2^k and back is exact in float32
// barring overflow and underflow: every product and sum of backward, the allreduce and the
// unscale only move exponents, and fl(2^k / N) = 2^k fl(1 / N). So with a power-of-two scale
// that never overflows a run gets bitwise the weights of the run without scaling. An overflow
// skips the step on every rank and halves the scale; clean steps grow it; a checkpoint carries
// it, so a resumed run is bitwise the uninterrupted one.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "ddp/errors.h"
#include "ddp/trainer.h"
#include "io/training_checkpoint.h"
#include "mpi_test_helpers.h"

namespace {

using ddp_test::bitwise_equal;
using ddp_test::max_abs_diff;
using ddp_test::require_identical_replicas;
using ddp_test::train;
using ddp_test::world_size;

constexpr double kTopScale = 0x1p126;  // the largest loss scale

std::string shared_scratch(const std::string& name) {
  return ddp_test::shared_scratch_dir("ddp_scaling_", name);
}

// 190 samples (a padded or partial last batch), 2 micro-batches per step, 2 epochs.
ddp::TrainConfig scaling_config(const std::string& name) {
  ddp::TrainConfig cfg = ddp_test::small_training_config(shared_scratch(name));
  cfg.data.train.samples = 190;
  cfg.data.seed = 11;
  cfg.training.seed = 5;
  cfg.training.batch_size = 7;
  cfg.training.accumulate_steps = 2;
  cfg.training.epochs = 2;
  return cfg;
}

ddp::TrainConfig scaled(ddp::TrainConfig cfg, double init, int64_t growth_interval) {
  cfg.training.loss_scaling = ddp::LossScaling::On;
  cfg.training.loss_scale_init = init;
  cfg.training.loss_scale_growth_interval = growth_interval;
  cfg.output.dir += "/scaled";
  return cfg;
}

// Features times 1000 (normalize [0, 1e-3]) and a small lr: the gradients are large enough that
// scales near 2^126 overflow them, small enough that training goes on once the scale backs off.
ddp::TrainConfig overflowing(const std::string& name) {
  ddp::TrainConfig cfg = scaled(scaling_config(name), kTopScale, 2000);
  cfg.data.normalize.mode = ddp::Normalization::Mode::Fixed;
  cfg.data.normalize.std = 1e-3;
  cfg.optimizer.lr = 1e-3;
  cfg.training.accumulate_steps = 1;
  cfg.training.epochs = 3;  // 21 steps or more on up to 4 ranks
  cfg.training.log_every = 1;
  return cfg;
}

// A train record of metrics.jsonl: the scale the step ran with, the scaler's skips so far.
struct StepRecord {
  int64_t step = 0;
  double scale = 0;
  int64_t skipped = 0;
};

std::vector<StepRecord> train_records(const std::string& dir) {
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0 has written them
  std::vector<StepRecord> out;
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["type"] != "train") continue;
    out.push_back({record["global_step"], record["loss_scale"], record["scaler_skipped_steps"]});
  }
  return out;
}

// GradScaler's schedule as the records show it (growth_interval beyond the run): each step that
// overflowed halves the scale of the next one, a clean step keeps it. Returns the errors.
long check_backoff(const std::vector<StepRecord>& r, double init) {
  long errors = r.empty() || r[0].scale != static_cast<double>(static_cast<float>(init));
  for (size_t i = 0; i + 1 < r.size(); ++i) {
    const bool skipped = r[i].skipped - (i ? r[i - 1].skipped : 0) == 1;
    errors += r[i + 1].step != r[i].step + 1;
    errors += r[i + 1].scale != (skipped ? r[i].scale / 2 : r[i].scale);
  }
  return errors;
}

}  // namespace

TEST_CASE("a power-of-two loss scale that never overflows changes no bit (fp32, bf16)",
          "[mpi][loss_scale]") {
  using ddp::SchedulerName;
  const ddp::TrainConfig sgd = scaling_config("exact_sgd");
  const ddp::TrainConfig adamw = ddp_test::with_schedule(
      ddp_test::with_adam(scaling_config("exact_adamw"), true, false), SchedulerName::Cosine);
  for (const ddp::TrainConfig& base : {sgd, adamw}) {
    for (const ddp::Precision precision : {ddp::Precision::Fp32, ddp::Precision::Bf16}) {
      INFO(to_string(base.optimizer.name) << ", " << to_string(precision)
                                          << (base.training.clip_grad_norm > 0 ? ", clipped" : ""));
      ddp::TrainConfig plain = base;
      plain.training.precision = precision;
      const auto reference = train(plain, MPI_COMM_WORLD);
      // Growing every 3 steps: 2^16 up to 2^25 over the run, never overflowing.
      ddp::TrainSummary summary;
      const auto w = train(scaled(plain, 65536, 3), MPI_COMM_WORLD, &summary);
      CHECK(summary.scaler_skipped_steps == 0);
      CHECK(summary.loss_scale == std::ldexp(65536.0, static_cast<int>(summary.steps / 3)));
      require_identical_replicas(w);
      INFO("max |scaled - unscaled| = " << max_abs_diff(w, reference));
      REQUIRE(bitwise_equal(w, reference));
    }
  }
}

TEST_CASE(
    "a loss scale that overflows: steps skipped on every rank, the scale backs off, "
    "training goes on",
    "[mpi][loss_scale]") {
  const ddp::TrainConfig cfg = overflowing("overflow");
  ddp::TrainSummary summary;
  const auto w = train(cfg, MPI_COMM_WORLD, &summary);
  require_identical_replicas(w);
  const std::vector<StepRecord> records = train_records(cfg.output.dir);
  REQUIRE(static_cast<int64_t>(records.size()) == summary.steps);
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp_test::require_on_all_ranks(*comm, check_backoff(records, kTopScale), "the scale schedule");
  // 2^126 overflows at once; the scale settles and most steps train.
  REQUIRE(records[0].skipped == 1);
  CHECK(summary.scaler_skipped_steps == records.back().skipped);
  CHECK(summary.scaler_skipped_steps < summary.steps / 2);
  CHECK(summary.skipped_steps == 0);  // not nan_policy's
  CHECK(summary.loss_scale < kTopScale / 2);
  CHECK(std::isfinite(summary.train_loss));
  for (const auto& t : w)
    for (float v : t.data) REQUIRE(std::isfinite(v));
  // A skipped step changes no weight: the run stopped after the first overflows has the
  // untrained weights, which the whole run has left.
  int64_t first_clean = 0;
  while (records[first_clean].skipped == first_clean + 1) ++first_clean;
  ddp::TrainConfig skips_only = cfg;
  skips_only.training.max_steps = first_clean;
  skips_only.output.dir += "/skips";
  const auto untrained = train(skips_only, MPI_COMM_WORLD);
  ddp::TrainConfig one = skips_only;
  one.training.max_steps = 1;
  CHECK(bitwise_equal(train(one, MPI_COMM_WORLD), untrained));
  CHECK(max_abs_diff(untrained, w) > 1e-4);
}

TEST_CASE("the loss scale grows after growth_interval clean steps", "[mpi][loss_scale]") {
  ddp::TrainConfig cfg = scaled(scaling_config("growth"), 1024, 4);
  cfg.training.log_every = 1;
  ddp::TrainSummary summary;
  train(cfg, MPI_COMM_WORLD, &summary);
  const std::vector<StepRecord> records = train_records(cfg.output.dir);
  long errors = static_cast<int64_t>(records.size()) != summary.steps;
  for (const StepRecord& r : records)  // step s ran with 1024 x 2^((s - 1) / 4)
    errors += r.scale != std::ldexp(1024.0, static_cast<int>((r.step - 1) / 4)) || r.skipped != 0;
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp_test::require_on_all_ranks(*comm, errors, "scales that grow every 4 steps");
  CHECK(summary.loss_scale == std::ldexp(1024.0, static_cast<int>(summary.steps / 4)));
}

TEST_CASE("stopped and resumed with loss scaling: bitwise the uninterrupted run",
          "[mpi][loss_scale][resume]") {
  // Overflows early, then growth every 5 steps: the scale and the tracker both matter.
  ddp::TrainConfig cfg = overflowing("resume");
  cfg.training.loss_scale_growth_interval = 5;
  cfg.training.log_every = 0;
  ddp::TrainSummary whole_summary;
  const auto whole = train(cfg, MPI_COMM_WORLD, &whole_summary);
  REQUIRE(whole_summary.scaler_skipped_steps > 0);
  for (int64_t stop_at : {int64_t{1}, int64_t{3}, whole_summary.steps / 2 + 2}) {
    INFO("stopped after step " << stop_at << " of " << whole_summary.steps);
    ddp::TrainConfig first = cfg;
    first.output.dir = shared_scratch("resume_part" + std::to_string(stop_at));
    first.training.max_steps = stop_at;
    first.checkpoint.every_steps = 1000;  // periodic: the last step is checkpointed at the end
    ddp::TrainSummary first_summary;
    train(first, MPI_COMM_WORLD, &first_summary);
    const ddp::TrainingCheckpoint ck = ddp::read_checkpoint(first_summary.last_checkpoint);
    CHECK(ck.state.loss_scale == first_summary.loss_scale);
    CHECK(ck.state.scaler_skipped_steps == first_summary.scaler_skipped_steps);
    ddp::TrainConfig rest = first;
    rest.training.max_steps = 0;
    rest.training.resume = "auto";
    ddp::TrainSummary rest_summary;
    const auto resumed = train(rest, MPI_COMM_WORLD, &rest_summary);
    CHECK(rest_summary.steps == whole_summary.steps);
    CHECK(rest_summary.scaler_skipped_steps == whole_summary.scaler_skipped_steps);
    CHECK(rest_summary.loss_scale == whole_summary.loss_scale);
    require_identical_replicas(resumed);
    REQUIRE(bitwise_equal(resumed, whole));
  }
  // A checkpoint of a run without scaling resumes with scaling from loss_scale_init.
  ddp::TrainConfig unscaled = scaling_config("resume_unscaled");
  unscaled.training.max_steps = 3;
  unscaled.checkpoint.every_steps = 1000;
  train(unscaled, MPI_COMM_WORLD);
  ddp::TrainConfig on = scaled(unscaled, 4096, 2000);
  on.output.dir = unscaled.output.dir;
  on.training.max_steps = 4;
  on.training.resume = "auto";
  ddp::TrainSummary on_summary;
  train(on, MPI_COMM_WORLD, &on_summary);
  CHECK(on_summary.resumed);
  CHECK(on_summary.loss_scale == 4096);
}

// Without overflow (an overflow depends on the order of the partial sums, which differs
// between 1 and N ranks: the decisions are compared where the order is the same, sharded below).
TEST_CASE("loss scaling: N ranks x batch B equal 1 rank x batch N*B", "[mpi][loss_scale]") {
  const int n = world_size();
  ddp::TrainConfig cfg = scaled(scaling_config("eq"), 65536, 3);
  cfg.data.train.samples = 192;  // a multiple of every N x B: the same global order
  cfg.training.batch_size = 8;
  cfg.training.accumulate_steps = 1;
  ddp::TrainSummary summary;
  const auto distributed = train(cfg, MPI_COMM_WORLD, &summary);
  require_identical_replicas(distributed);
  ddp::TrainConfig single = cfg;
  single.training.batch_size = 8 * n;
  single.output.dir = ddp_test::scratch_dir("ddp_scaling_", "eq_single");  // this rank's
  ddp::TrainSummary single_summary;
  const auto reference = train(single, MPI_COMM_SELF, &single_summary);
  REQUIRE(single_summary.steps == summary.steps);
  CHECK(single_summary.scaler_skipped_steps == 0);
  CHECK(single_summary.loss_scale == summary.loss_scale);
  CHECK(summary.loss_scale == std::ldexp(65536.0, static_cast<int>(summary.steps / 3)));
  const double diff = max_abs_diff(distributed, reference);
  INFO("max |w_N - w_1| = " << diff);
  REQUIRE(diff <= 1e-5);
  ddp::TrainConfig untrained = single;  // the models moved
  untrained.training.max_steps = 1;
  REQUIRE(max_abs_diff(train(untrained, MPI_COMM_SELF), reference) > 1e-3);
}

// The replicated run on one node's shared-memory window sums in rank order, as both sharded
// paths do (MPI_Allreduce's order is the library's): the same averaged gradients, the same
// overflow decisions.
TEST_CASE("loss scaling with the sharded optimizer: bitwise the replicated run",
          "[mpi][loss_scale][shard]") {
  for (const double init : {65536.0, kTopScale}) {
    const ddp::TrainConfig cfg = init == kTopScale ? overflowing("shard_overflow")
                                                   : scaled(scaling_config("shard"), init, 3);
    ddp::TrainSummary whole_summary;
    const auto whole = train(cfg, MPI_COMM_WORLD, &whole_summary);
    CHECK((init == kTopScale) == (whole_summary.scaler_skipped_steps > 0));
    for (bool shared : {true, false}) {
      INFO("loss_scale_init " << init << (shared ? ", shared-memory window" : ", MPI"));
      ddp::TrainConfig sharded = cfg;
      sharded.distributed.shard_optimizer = true;
      sharded.distributed.shared_memory = shared;
      sharded.output.dir += shared ? "/sharded_shm" : "/sharded_mpi";
      ddp::TrainSummary shard_summary;
      const auto shard = train(sharded, MPI_COMM_WORLD, &shard_summary);
      CHECK(shard_summary.scaler_skipped_steps == whole_summary.scaler_skipped_steps);
      CHECK(shard_summary.loss_scale == whole_summary.loss_scale);
      require_identical_replicas(shard);
      INFO("max |sharded - replicated| = " << max_abs_diff(shard, whole));
      REQUIRE(bitwise_equal(shard, whole));
    }
  }
}

// A non-finite loss is nan_policy's whatever the scaler does: abort stops every rank naming the
// rank; skip_step lets the scaler skip the step (and halve the scale), not counted as its own.
TEST_CASE("loss scaling: a non-finite loss is still nan_policy's", "[mpi][loss_scale][nan]") {
  const int n = world_size();
  const std::string dir = shared_scratch("nan");
  const ddp_test::OverflowData data = ddp_test::write_overflow_data(dir, 16 * n, 5);
  ddp::TrainConfig cfg = ddp_test::overflow_config(data, dir);  // sample 5: step 1, rank 5 % n
  cfg.training.loss_scaling = ddp::LossScaling::On;
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  std::string message = "(no error)";
  try {
    ddp::Trainer trainer(cfg, *comm, nullptr);
    trainer.run();
  } catch (const ddp::CollectiveError& e) {
    message = e.what();
  }
  INFO(message);
  const int64_t bad_step = (5 / n) / 4 + 1;
  CHECK_THAT(message,
             Catch::Contains("epoch 1 step " + std::to_string(bad_step) + ": ") &&
                 Catch::Contains("the loss was non-finite on rank " + std::to_string(5 % n)));
  cfg.training.nan_policy = ddp::NanPolicy::SkipStep;
  ddp::TrainSummary summary;
  const auto w = train(cfg, MPI_COMM_WORLD, &summary);
  CHECK(summary.scaler_skipped_steps == 2);  // the step with sample 5, once per epoch
  CHECK(summary.skipped_steps == 0);
  CHECK(summary.loss_scale == 65536.0 / 4);
  require_identical_replicas(w);
  for (const auto& t : w)
    for (float v : t.data) REQUIRE(std::isfinite(v));
}
